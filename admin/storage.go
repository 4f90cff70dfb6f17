package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Storage is what the message log keeps, read cheaply: no statement
// counts a whole topic.
type Storage struct {
	// Partitions counts the log's partitions. Maintenance adds them ahead
	// of the writers and drops each once every message in it is done: a
	// count that keeps growing means something keeps old messages.
	Partitions int `json:"partitions"`
	// Topics is what each topic keeps, by name.
	Topics []TopicStorage `json:"topics"`
}

// MarshalJSON writes Oldest in seconds.
func (t TopicStorage) MarshalJSON() ([]byte, error) {
	type plain TopicStorage
	return json.Marshal(struct {
		plain
		OldestSeconds float64 `json:"oldest_seconds"`
	}{plain(t), t.Oldest.Seconds()})
}

// TopicStorage is what one topic keeps in the log.
type TopicStorage struct {
	Topic string `json:"topic"`
	// Stored counts its messages in the log, up to CountLimit ("at
	// least" there): those waiting for a consumer, and those finished
	// that cleanup has not deleted yet (a topic's Retention keeps them a
	// while on purpose).
	Stored int64 `json:"stored"`
	// Oldest is how long ago its oldest stored message (in commit order)
	// was written; 0 when it keeps none.
	Oldest time.Duration `json:"-"`
	// Groups counts the groups that hold its messages back (ACTIVE or
	// PAUSED). A PUB_SUB topic with none keeps its messages only for its
	// Retention: nobody reads them.
	Groups int `json:"groups"`
}

// Storage reads what the log keeps: a statement for the partitions and
// one per topic (each an index scan that stops at CountLimit).
func (a *Admin) Storage(ctx context.Context) (Storage, error) {
	var s Storage
	if err := a.pool.QueryRow(ctx, a.q.Partitions).Scan(&s.Partitions); err != nil {
		return s, fmt.Errorf("admin: partitions: %w", err)
	}
	names, err := a.topicNames(ctx)
	if err != nil {
		return s, err
	}
	for _, name := range names {
		t := TopicStorage{Topic: name}
		var oldest *float64 // seconds; nil when it keeps none
		err := a.pool.QueryRow(ctx, a.q.TopicStorage, pgx.StrictNamedArgs{"topic": name, "limit": a.limit}).Scan(&t.Stored, &oldest, &t.Groups)
		if err != nil {
			return s, fmt.Errorf("admin: storage of %q: %w", name, err)
		}
		if oldest != nil {
			t.Oldest = max(0, time.Duration(*oldest*float64(time.Second)))
		}
		s.Topics = append(s.Topics, t)
	}
	return s, nil
}
