package outbox

import (
	"sync"

	"github.com/pgoutbox/pgoutbox/internal/notify"
)

// wakeups shares one LISTEN connection among everything a Client runs:
// it starts with the first subscriber and stops (waiting for its
// goroutine) when the last one leaves.
type wakeups struct {
	mu       sync.Mutex
	listener *notify.Listener
	subs     int
}

// WakeUps returns a channel that receives a (coalesced) value when a
// producer commits a message to topic, and a function to stop receiving.
// All subscriptions of a Client share one LISTEN connection, opened from
// the client's pool configuration outside the pool. Wake-ups are hints:
// keep polling.
func (c *Client) WakeUps(topic string) (<-chan struct{}, func()) {
	w := &c.wake
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.listener == nil {
		w.listener = notify.New(c.pool.Config().ConnConfig, NotifyChannel(c.schema), c.logger)
		w.listener.Start()
	}
	w.subs++
	ch, unsubscribe := w.listener.Subscribe(topic)
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			unsubscribe()
			w.mu.Lock()
			defer w.mu.Unlock()
			if w.subs--; w.subs == 0 {
				w.listener.Stop()
				w.listener = nil
			}
		})
	}
}
