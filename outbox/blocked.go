package outbox

import (
	"time"
)

// BlockedGroup is a message group of an ordered topic that its oldest
// message holds back: the message failed and waits for its retry, or was
// dead-lettered on a topic that blocks groups on dead letters.
type BlockedGroup struct {
	// Group is the message group.
	Group string `json:"message_group"`
	// HeadID is the message holding it back.
	HeadID int64 `json:"head_id"`
	// Attempts the head has used.
	Attempts int `json:"attempts"`
	// LastError is the head's last error.
	LastError string `json:"last_error"`
	// Since is when the head first failed (or was dead-lettered).
	Since time.Time `json:"since"`
	// DeadLettered: the head is a dead letter; replay or discard it (the
	// consumer group's ReplayDeadLetters and DiscardDeadLetters, or the
	// admin API's) to let the group go on.
	DeadLettered bool `json:"dead_lettered"`
	// Behind is how many of the group's messages wait behind the head.
	Behind int `json:"behind"`
}

// DefaultBlockedGroupsPage is the page size of a list of blocked groups
// when its limit is 0.
const DefaultBlockedGroupsPage = 100
