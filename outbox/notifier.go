package outbox

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// notifier decides which of a producer's sends also wake the topic's
// consumers (see ProducerConfig.NotifyInterval and BusyNotifyInterval).
// It is safe for concurrent use and takes no lock on the send path.
type notifier struct {
	interval     time.Duration // < 0: never notify
	busyInterval time.Duration
	clock        Clock     // nil: the system's monotonic clock
	epoch        time.Time // times below are durations since epoch
	topics       sync.Map  // topic -> *topicNotifications
}

// topicNotifications is what a notifier remembers of one topic, as
// durations since the notifier's epoch.
type topicNotifications struct {
	lastSend   atomic.Int64
	lastNotify atomic.Int64
}

// never is the time of a send or notification that did not happen: far
// enough in the past for any interval, far enough from MinInt64 not to
// overflow a subtraction.
const never = math.MinInt64 / 2

func newNotifier(interval, busyInterval time.Duration, clock Clock) *notifier {
	n := &notifier{interval: interval, busyInterval: max(busyInterval, interval), clock: clock, epoch: time.Now()}
	if clock != nil {
		n.epoch = clock.Now()
	}
	return n
}

// now is the time since the notifier's epoch.
func (n *notifier) now() time.Duration {
	if n.clock != nil {
		return n.clock.Now().Sub(n.epoch)
	}
	return time.Since(n.epoch)
}

// due records a send to topic at now and reports whether it should notify.
// It should after a pause (the topic's previous send from this producer is
// at least interval old: its consumers may have gone idle since), and while
// sends keep coming closer than that, once per busyInterval (busy consumers
// find those messages by claiming again; this wakes idle ones). Of
// concurrent sends, one wins.
func (n *notifier) due(topic string, now time.Duration) bool {
	if n.interval < 0 {
		return false
	}
	v, ok := n.topics.Load(topic)
	if !ok {
		fresh := &topicNotifications{}
		fresh.lastSend.Store(never)
		fresh.lastNotify.Store(never)
		v, _ = n.topics.LoadOrStore(topic, fresh)
	}
	t := v.(*topicNotifications)
	at := int64(now)
	previousSend := t.lastSend.Swap(at)
	lastNotify := t.lastNotify.Load()
	sinceNotify := at - lastNotify
	switch {
	case sinceNotify < int64(n.interval):
		return false
	case at-previousSend < int64(n.interval) && sinceNotify < int64(n.busyInterval):
		return false
	}
	return t.lastNotify.CompareAndSwap(lastNotify, at)
}

// dueTopics is due for the distinct topics of a batch; it returns those
// that should be notified.
func (n *notifier) dueTopics(topics []string) []string {
	now := n.now()
	var out []string
	seen := make(map[string]bool)
	for _, t := range topics {
		if !seen[t] {
			seen[t] = true
			if n.due(t, now) {
				out = append(out, t)
			}
		}
	}
	return out
}
