package router_test

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/router"
)

// groupSource adds a GroupSource for group on topic hooks to rt.
func (b *pgBundle) groupSource(t *testing.T, rt *router.Router, group string) {
	t.Helper()
	src, err := router.NewGroupSource(router.GroupSourceConfig{Pool: b.db.Pool,
		Group: consumergroup.Config{Topic: "hooks", Group: group, Schema: b.db.Schema, PollInterval: 20 * time.Millisecond, BatchSize: 30}})
	require.NoError(t, err)
	rt.AddSource(src)
}

func (b *pgBundle) pubsubTopic(t *testing.T, cfg outbox.TopicConfig) {
	t.Helper()
	cfg.Name, cfg.Semantics = "hooks", outbox.PubSub
	cfg.Tracking = outbox.Bitmap
	require.NoError(t, b.client.ConfigureTopic(context.Background(), cfg))
}

func (b *pgBundle) waitSubscribed(t *testing.T, n int) {
	t.Helper()
	pgtest.Eventually(t, 10*time.Second, "groups subscribed", func() bool {
		return b.countIn(t, "outbox_topic_subscriptions", "subscription_status = 'ACTIVE'") == n
	})
}

// A failed delivery of a group source becomes a group retry, and the retry
// goes through the router like the first delivery: a receiver that fails
// the first call of each message sees every message succeed once, and the
// group completes every message only after that.
func TestGroupSourceRetriesAreDelivered(t *testing.T) {
	t.Parallel()
	b := setupPG(t)
	b.pubsubTopic(t, outbox.TopicConfig{BackoffInitial: 50 * time.Millisecond, BackoffMax: 100 * time.Millisecond})
	rv := newReceiver()
	rv.fail = func(_ body, n int) int {
		if n == 1 {
			return http.StatusServiceUnavailable
		}
		return 0
	}
	_, host := endpoint(t, rv.ServeHTTP)
	rt := newRouter(t, router.Config{AllowedHosts: []string{host}, MaxAttempts: 1, FastFailDelay: 50 * time.Millisecond,
		Pools: []router.PoolConfig{{Code: "P", Concurrency: 5}}})
	b.groupSource(t, rt, "webhooks")
	b.waitSubscribed(t, 1)
	b.sendInterleaved(t, "http://"+host+"/hook", 1, 5)
	pgtest.Eventually(t, 20*time.Second, "every message delivered", func() bool { return rv.total.Load() == 5 })
	pgtest.Eventually(t, 10*time.Second, "completed by the group", func() bool {
		return b.countPublished(t, "required_bits <> 0 AND "+b.db.FinishedByAll()) == 5
	})
	rv.mu.Lock()
	defer rv.mu.Unlock()
	// Each delivered once. (Order across repeated failures is best effort:
	// a retry can be overtaken by group mates retried meanwhile.)
	require.ElementsMatch(t, []int{0, 1, 2, 3, 4}, rv.order["g0"])
	require.Zero(t, b.countIn(t, "outbox_group_retries", "status = 'DEAD_LETTER'"))
}

// The group keeps a batch's lease alive while the router delivers it: a
// first delivery that takes 2.5 s with a 1 s lease and then fails is not
// taken over (which would complete its copy unsent); it is retried and
// every message is delivered once.
func TestGroupSourceLeaseOutlivesSlowDeliveries(t *testing.T) {
	t.Parallel()
	b := setupPG(t)
	b.pubsubTopic(t, outbox.TopicConfig{Lease: time.Second, BackoffInitial: 50 * time.Millisecond, BackoffMax: 100 * time.Millisecond})
	rv := newReceiver()
	var calls atomic.Int64
	_, host := endpoint(t, func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			time.Sleep(2500 * time.Millisecond)
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		rv.ServeHTTP(w, r)
	})
	rt := newRouter(t, router.Config{AllowedHosts: []string{host}, MaxAttempts: 1, FastFailDelay: 50 * time.Millisecond,
		Pools: []router.PoolConfig{{Code: "P", Concurrency: 2}}})
	b.groupSource(t, rt, "webhooks")
	b.waitSubscribed(t, 1)
	b.sendInterleaved(t, "http://"+host+"/hook", 2, 3)
	pgtest.Eventually(t, 20*time.Second, "every message delivered", func() bool { return rv.total.Load() == 6 })
	pgtest.Eventually(t, 10*time.Second, "completed by the group", func() bool {
		return b.countPublished(t, "required_bits <> 0 AND "+b.db.FinishedByAll()) == 6
	})
	time.Sleep(200 * time.Millisecond)
	rv.mu.Lock()
	defer rv.mu.Unlock()
	for bd, n := range rv.seen {
		require.Equal(t, 1, n, "%v delivered %d times", bd, n)
	}
	for g, seqs := range rv.order {
		require.Equal(t, []int{0, 1, 2}, seqs, g)
	}
}

// Two groups of one topic routed by one router each deliver every message:
// a group's copy is its own delivery, not a requeue of the other's.
func TestTwoGroupSourcesOnOneTopic(t *testing.T) {
	t.Parallel()
	b := setupPG(t)
	b.pubsubTopic(t, outbox.TopicConfig{})
	rv := newReceiver()
	rv.delay = 20 * time.Millisecond // both copies in flight at once
	_, host := endpoint(t, rv.ServeHTTP)
	rt := newRouter(t, router.Config{AllowedHosts: []string{host}, Pools: []router.PoolConfig{{Code: "P", Concurrency: 10}}})
	b.groupSource(t, rt, "billing")
	b.groupSource(t, rt, "audit")
	b.waitSubscribed(t, 2)
	b.sendInterleaved(t, "http://"+host+"/hook", 5, 4)
	pgtest.Eventually(t, 20*time.Second, "each group's copy of every message delivered", func() bool { return rv.total.Load() == 40 })
	pgtest.Eventually(t, 10*time.Second, "completed by both groups", func() bool {
		return b.countPublished(t, "required_bits = 3 AND "+b.db.FinishedByAll()) == 20
	})
}

// Start returns once a group source is subscribed, or with the error that
// kept it from subscribing (here: its topic was never configured); the
// router is then stopped, and starts once the cause is gone.
func TestStartFailsWhenAGroupSourceCannotSubscribe(t *testing.T) {
	t.Parallel()
	b := setupPG(t)
	rt, err := router.New(router.Config{AllowedHosts: []string{"127.0.0.1"}, Pools: []router.PoolConfig{{Code: "P", Concurrency: 1}}})
	require.NoError(t, err)
	b.groupSource(t, rt, "webhooks") // topic "hooks" is not configured
	err = rt.Start(context.Background())
	require.ErrorIs(t, err, outbox.ErrUnknownTopic)
	require.Contains(t, err.Error(), "group:hooks/webhooks")
	b.pubsubTopic(t, outbox.TopicConfig{})
	require.NoError(t, rt.Start(context.Background()))
	require.ErrorIs(t, rt.Start(context.Background()), router.ErrStarted)
	require.NoError(t, rt.Stop(context.Background()))
}

// A receiver gets the message's plain id in X-Outbox-Message-Id from
// either source (a group's X-Message-Id names the group's copy, which a
// receiver parsing it as a number read as 0).
func TestReceiversGetThePlainMessageID(t *testing.T) {
	t.Parallel()
	b := setupPG(t)
	b.pubsubTopic(t, outbox.TopicConfig{})
	var mu sync.Mutex
	got := map[string]http.Header{}
	_, host := endpoint(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got[r.Header.Get("X-Outbox-Message-Id")] = r.Header.Clone()
		mu.Unlock()
	})
	rt := newRouter(t, router.Config{AllowedHosts: []string{host}})
	b.groupSource(t, rt, "webhooks")
	b.waitSubscribed(t, 1)
	id, err := b.producer.Send(context.Background(), b.db.Pool, outbox.Message{Topic: "hooks", Payload: []byte(`{}`), Group: "g",
		Headers: map[string]string{router.HeaderPool: "P", router.HeaderTarget: "http://" + host + "/hook"}})
	require.NoError(t, err)
	plain := strconv.FormatInt(id, 10)
	pgtest.Eventually(t, 10*time.Second, "delivered", func() bool { mu.Lock(); defer mu.Unlock(); return got[plain] != nil })
	mu.Lock()
	defer mu.Unlock()
	h := got[plain]
	require.Equal(t, "group:hooks/webhooks/"+plain, h.Get("X-Message-Id"))
	require.Equal(t, "group:hooks/webhooks/"+plain, h.Get("Idempotency-Key"))
	require.Equal(t, "hooks", h.Get("X-Message-Topic"))
	require.Equal(t, "g", h.Get("X-Message-Group"))
	require.Equal(t, "application/json", h.Get("Content-Type"))
}
