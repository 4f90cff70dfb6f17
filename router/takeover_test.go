package router_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// paceReceiver answers every call after a fixed delay, so a router's rate
// is bound by it (concurrency / delay), and records when each call was
// answered with success.
type paceReceiver struct {
	delay time.Duration
	hang  func(b body) bool // calls to leave unanswered until the caller goes away

	mu    sync.Mutex
	times []time.Time  // successes, in the order answered
	seen  map[body]int // successes per message
	first map[body]time.Time
}

func newPaceReceiver(delay time.Duration) *paceReceiver {
	return &paceReceiver{delay: delay, seen: map[body]int{}, first: map[body]time.Time{}}
}

func (rv *paceReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var b body
	_ = json.NewDecoder(r.Body).Decode(&b)
	if rv.hang != nil && rv.hang(b) {
		<-r.Context().Done()
		return
	}
	time.Sleep(rv.delay)
	rv.mu.Lock()
	rv.times = append(rv.times, time.Now())
	rv.seen[b]++
	if rv.seen[b] == 1 {
		rv.first[b] = time.Now()
	}
	rv.mu.Unlock()
	_, _ = w.Write([]byte(`{"ack":true}`))
}

// between counts the successes answered in [from, to).
func (rv *paceReceiver) between(from, to time.Time) int {
	rv.mu.Lock()
	defer rv.mu.Unlock()
	n := 0
	for _, at := range rv.times {
		if !at.Before(from) && at.Before(to) {
			n++
		}
	}
	return n
}

func (rv *paceReceiver) total() int {
	rv.mu.Lock()
	defer rv.mu.Unlock()
	return len(rv.times)
}

// A router process reading an ordered topic through a GroupSource is
// killed (SIGKILL) while it delivers to a receiver that takes 100 ms a
// call; a router in this process takes its group's messages over once
// their lease ran out. It then delivers at the rate the killed one did:
// the takeover of a dead process's work does not make the group crawl
// (it once retried each taken-over message alone, one at a time across
// the whole group). The takeover is logged, as a warning with the number
// of messages taken over.
func TestGroupSourceRunsAtFullRateAfterATakeover(t *testing.T) {
	t.Parallel()
	const customers, perCustomer, concurrency = 40, 80, 8
	b := setupPG(t)
	ctx := context.Background()
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "hooks", Semantics: outbox.PubSub,
		Tracking: outbox.Offset, Ordered: true, Lease: 2 * time.Second, MaxAttempts: 10}))
	rv := newPaceReceiver(100 * time.Millisecond)
	_, host := endpoint(t, rv.ServeHTTP)
	spec := childSpec{DSN: b.db.DSN, Schema: b.db.Schema, Host: host, Group: "webhooks", Concurrency: concurrency, BatchSize: 50, RequestTimeout: time.Minute}

	doomed := spec
	doomed.Instance = "doomed"
	child := startChild(t, doomed)
	b.waitSubscribed(t, 1)
	b.sendInterleaved(t, "http://"+host+"/hook", customers, perCustomer)

	// The rate before: 6 s of deliveries, after the first second.
	pgtest.Eventually(t, 30*time.Second, "the first deliveries", func() bool { return rv.total() > 0 })
	time.Sleep(time.Second)
	from := time.Now()
	time.Sleep(6 * time.Second)
	child.Kill()
	killed := time.Now()
	<-child.Exited()
	before := float64(rv.between(from, killed)) / killed.Sub(from).Seconds()

	survivor := spec
	survivor.Instance = "survivor"
	logs := &logCapture{}
	rt, err := routerProcess(ctx, pgtest.NewPool(t, b.db.DSN), survivor, slog.New(logs))
	require.NoError(t, err)
	t.Cleanup(func() { _ = rt.Stop(context.Background()) })
	// Taken over: nothing is leased to the killed process any more.
	pgtest.Eventually(t, 30*time.Second, "the takeover", func() bool {
		return b.countIn(t, "outbox_group_retries", "lease_owner = 'doomed'") == 0
	})
	took := time.Now()
	t.Logf("taken over %v after the kill; %d retries expired once", took.Sub(killed), b.countIn(t, "outbox_group_retries", "lease_expiries > 0"))
	time.Sleep(10 * time.Second)
	perSecond := make([]int, 10)
	for s := range perSecond {
		at := took.Add(time.Duration(s) * time.Second)
		perSecond[s] = rv.between(at, at.Add(time.Second))
	}
	t.Logf("deliveries in each second after the takeover: %v", perSecond)
	after := float64(rv.between(took, time.Now())) / time.Since(took).Seconds()
	t.Logf("before the kill %.1f msg/s, in the 10 s after the takeover %.1f msg/s (receiver bound: %d/s)",
		before, after, concurrency*10)
	require.Less(t, rv.total(), customers*perCustomer, "the backlog ran out: the measure is void")
	require.GreaterOrEqual(t, after, 0.8*before, "the router crawls after the takeover")
	takeovers := logs.levels(map[string]string{"event": "takeover"})
	require.NotEmpty(t, takeovers, "the takeover is logged: %v", logs.warnings())
	require.Equal(t, slog.LevelWarn, takeovers[0])
	require.Positive(t, logs.intAttr(map[string]string{"event": "takeover"}, "messages"), "with how many messages")
}

// A router process is killed while one message of a batch hangs at the
// receiver and the others were answered 200 a second before: a router in
// this process that takes over after the lease delivers the hanging one
// again, and none of the others (each delivered message is recorded as
// done when it is, not when its batch or run ends).
func TestDeliveredMessagesAreNotResentAfterAKill(t *testing.T) {
	for _, kind := range []string{"group", "group-ordered", "queue"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			const customers, perCustomer = 10, 3
			b := setupPG(t)
			ctx := context.Background()
			tc := outbox.TopicConfig{Name: "hooks", Semantics: outbox.PubSub, Tracking: outbox.Bitmap, Lease: 2 * time.Second,
				Ordered: kind == "group-ordered"}
			if kind == "queue" {
				tc.Semantics, tc.Tracking = outbox.Queue, ""
			}
			require.NoError(t, b.client.ConfigureTopic(ctx, tc))
			rv := newPaceReceiver(0)
			var released atomic.Bool
			hanging := body{Group: "g0", Seq: 0}
			rv.hang = func(bd body) bool { return bd == hanging && !released.Load() }
			_, host := endpoint(t, rv.ServeHTTP)
			spec := childSpec{DSN: b.db.DSN, Schema: b.db.Schema, Host: host, Group: "webhooks", Queue: kind == "queue",
				Concurrency: 4, BatchSize: 50, RequestTimeout: time.Minute}

			doomed := spec
			doomed.Instance = "doomed"
			child := startChild(t, doomed)
			if kind != "queue" {
				b.waitSubscribed(t, 1)
			}
			b.sendInterleaved(t, "http://"+host+"/hook", customers, perCustomer)
			// Every message but the hanging one and those behind it in its
			// message group.
			pgtest.Eventually(t, 30*time.Second, "the others delivered", func() bool { return rv.total() == (customers-1)*perCustomer })
			time.Sleep(time.Second)
			child.Kill()
			<-child.Exited()
			released.Store(true)

			survivor := spec
			survivor.Instance = "survivor"
			rt, err := routerProcess(ctx, pgtest.NewPool(t, b.db.DSN), survivor, nil)
			require.NoError(t, err)
			t.Cleanup(func() { _ = rt.Stop(context.Background()) })
			pgtest.Eventually(t, 30*time.Second, "the hanging message's group delivered", func() bool {
				return rv.total() >= customers*perCustomer
			})
			time.Sleep(time.Second) // anything sent again would have come by now
			rv.mu.Lock()
			defer rv.mu.Unlock()
			var again []body
			for bd, n := range rv.seen {
				if n > 1 {
					again = append(again, bd)
				}
			}
			require.Empty(t, again, "delivered (200) before the kill, and sent again after it")
			require.Len(t, rv.seen, customers*perCustomer)
		})
	}
}
