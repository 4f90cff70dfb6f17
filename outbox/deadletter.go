package outbox

import (
	"time"
)

// DeadLetter is a message that used up its attempts or was rejected
// permanently. Its consumer group keeps it, with a copy of the message,
// until it is replayed or discarded (see consumergroup.Group.DeadLetters
// and admin.Admin.DeadLetters).
type DeadLetter struct {
	Delivery
	// DeadLetteredAt is when it was parked.
	DeadLetteredAt time.Time
	// LastError is the last handler error (or "lease expired ...").
	LastError string
}

// DefaultDeadLetterPage is the page size of a list of dead letters when
// its limit is 0.
const DefaultDeadLetterPage = 100
