package admin

import (
	"encoding/json"

	"github.com/pgoutbox/pgoutbox/outbox"
)

// topicJSON is a topic as the admin JSON API and the CLI's --json write
// it. The counts are a QUEUE topic's: a PUB_SUB topic's backlog is in its
// groups' health, so they are left out there.
type topicJSON struct {
	Name        string   `json:"name"`
	Semantics   string   `json:"semantics"`
	Tracking    string   `json:"tracking,omitempty"`
	Changing    bool     `json:"mode_changing,omitempty"`
	Ordered     bool     `json:"ordered"`
	Configured  bool     `json:"configured"`
	Groups      []string `json:"groups"`
	Ready       *int64   `json:"ready,omitempty"`
	Scheduled   *int64   `json:"scheduled,omitempty"`
	Leased      *int64   `json:"leased,omitempty"`
	OldestReady *float64 `json:"oldest_ready_seconds,omitempty"`
	DeadLetters *int64   `json:"dead_letters,omitempty"`
}

// MarshalJSON writes the topic's name, configuration that operators read
// (semantics, tracking, ordering) and, on a QUEUE topic, its counts, with
// OldestReady in seconds (left out when nothing is ready).
func (t Topic) MarshalJSON() ([]byte, error) {
	v := topicJSON{Name: t.Name, Semantics: string(t.Semantics), Tracking: string(t.Tracking), Changing: t.ModeChanging,
		Ordered: t.Ordered, Configured: t.Configured, Groups: t.Groups}
	if v.Groups == nil {
		v.Groups = []string{}
	}
	if t.Semantics == outbox.Queue {
		v.Ready, v.Scheduled, v.Leased, v.DeadLetters = &t.Ready, &t.Scheduled, &t.Leased, &t.DeadLetters
		if t.Ready > 0 {
			age := t.OldestReady.Seconds()
			v.OldestReady = &age
		}
	}
	return json.Marshal(v)
}
