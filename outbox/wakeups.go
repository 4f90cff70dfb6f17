package outbox

import (
	"context"
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
// All subscriptions of a Client share one LISTEN connection, opened outside
// the pool (from Config.ListenDSN, else the pool's settings). Wake-ups are
// hints: keep polling. With Config.PollOnly the channel is nil.
func (c *Client) WakeUps(topic string) (<-chan struct{}, func()) {
	if c.listen == nil { // PollOnly
		return nil, func() {}
	}
	w := &c.wake
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.listener == nil {
		probe := notify.Probe{Interval: c.probeInterval, Send: func(ctx context.Context, channel, payload string) error {
			_, err := c.pool.Exec(ctx, `SELECT pg_notify($1, $2)`, channel, payload)
			return err
		}}
		w.listener = notify.New(c.listen, NotifyChannel(c.schema), c.logger, probe)
		_ = w.listener.Start(context.Background()) // a new listener: it cannot run already
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
				_ = w.listener.Stop(context.Background())
				w.listener = nil
			}
		})
	}
}
