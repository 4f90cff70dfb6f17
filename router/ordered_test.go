package router_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
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

// orderedReceiver answers like a flaky webhook and checks, per message
// group, that no message arrives before the one sent ahead of it was
// answered with success.
type orderedReceiver struct {
	mu         sync.Mutex
	succeeded  map[string]int // group -> highest seq answered 2xx (-1: none)
	order      map[string][]int
	duplicates int
	violations []string
	down       atomic.Bool
}

func (rv *orderedReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var b body
	_ = json.NewDecoder(r.Body).Decode(&b)
	rv.mu.Lock()
	defer rv.mu.Unlock()
	last, ok := rv.succeeded[b.Group]
	if !ok {
		last = -1
	}
	switch {
	case b.Seq > last+1:
		rv.violations = append(rv.violations, fmt.Sprintf("%s: %d arrived before %d succeeded", b.Group, b.Seq, last+1))
	case b.Seq <= last:
		rv.duplicates++ // a redelivery of one already answered: allowed, not a reordering
		w.WriteHeader(http.StatusOK)
		return
	}
	if rv.down.Load() || rand.IntN(5) == 0 {
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	rv.succeeded[b.Group] = b.Seq
	rv.order[b.Group] = append(rv.order[b.Group], b.Seq)
	w.WriteHeader(http.StatusOK)
}

// Two routers on one ordered topic, a receiver failing one call in five
// with a 500, single HTTP attempts, a total outage of the receiver and a
// router restart mid-run: every group's messages succeed in send order,
// and no message reaches the receiver before the one ahead of it
// succeeded. (The in-memory holds of the router play no part: the ordered
// claim never hands out a group's next message before its head is acked.)
// Through a QueueSource, and through a GroupSource of a consumer group.
func TestOrderedSourceKeepsGroupOrderThroughFailures(t *testing.T) {
	for _, kind := range []string{"queue", "group"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			orderedSourceThroughFailures(t, kind == "group")
		})
	}
}

func orderedSourceThroughFailures(t *testing.T, group bool) {
	const groups, perGroup = 50, 20
	b := setupPG(t)
	ctx := context.Background()
	tc := outbox.TopicConfig{Name: "hooks", Ordered: true, MaxAttempts: 1000,
		BackoffInitial: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond, Lease: 2 * time.Second}
	if group {
		tc.Semantics, tc.Tracking = outbox.PubSub, outbox.Offset
	}
	require.NoError(t, b.client.ConfigureTopic(ctx, tc))
	rv := &orderedReceiver{succeeded: map[string]int{}, order: map[string][]int{}}
	_, host := endpoint(t, rv.ServeHTTP)

	cfg := router.Config{MaxAttempts: 1, DefaultRetryDelay: 20 * time.Millisecond, FastFailDelay: 20 * time.Millisecond,
		AllowedHosts: []string{host}, Pools: []router.PoolConfig{{Code: "P", Concurrency: 8}},
		Breaker: router.BreakerConfig{MinRequests: 1000, FailureRatio: 0.99, OpenFor: 200 * time.Millisecond, HalfOpenRequests: 1}}
	start := func(owner string) *router.Router {
		pool := pgtest.NewPool(t, b.db.DSN)
		client, err := outbox.NewClient(pool, outbox.Config{Schema: b.db.Schema})
		require.NoError(t, err)
		rt := newRouter(t, cfg)
		var src router.Source
		if group {
			src, err = router.NewGroupSource(router.GroupSourceConfig{Pool: pool, Group: consumergroup.Config{Client: client,
				Topic: "hooks", Group: "webhooks", InstanceID: owner, BatchSize: 25, Concurrency: 50,
				PollInterval: 20 * time.Millisecond}})
		} else {
			src, err = router.NewQueueSource(router.QueueSourceConfig{Client: client, Topic: "hooks",
				BatchSize: 25, PollInterval: 20 * time.Millisecond})
		}
		require.NoError(t, err)
		rt.AddSource(src)
		return rt
	}
	start("router-a")
	second := start("router-b")
	if group { // subscribed: the group receives what is sent from now on
		pgtest.Eventually(t, 10*time.Second, "the group subscribed", func() bool {
			return b.countIn(t, "outbox_topic_subscriptions", "true") == 1
		})
	}
	b.sendInterleaved(t, "http://"+host+"/hook", groups, perGroup)
	handled := func() int {
		rv.mu.Lock()
		defer rv.mu.Unlock()
		n := 0
		for _, seqs := range rv.order {
			n += len(seqs)
		}
		return n
	}
	pgtest.Eventually(t, 30*time.Second, "a quarter delivered", func() bool { return handled() >= groups*perGroup/4 })
	// The second router restarts while the receiver is down.
	rv.down.Store(true)
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	require.NoError(t, second.Stop(stopCtx))
	cancel()
	start("router-b2")
	time.Sleep(10 * time.Second) // a 10 s outage
	rv.down.Store(false)
	pgtest.Eventually(t, 60*time.Second, "all delivered and acked", func() bool {
		if group {
			return handled() == groups*perGroup && b.countIn(t, "outbox_group_retries", "true") == 0
		}
		return b.pending(t) == 0
	})

	rv.mu.Lock()
	defer rv.mu.Unlock()
	require.Empty(t, rv.violations)
	require.Len(t, rv.order, groups)
	want := make([]int, perGroup)
	for i := range want {
		want[i] = i
	}
	for g, seqs := range rv.order {
		require.Equal(t, want, seqs, "group %s", g)
	}
	require.Zero(t, b.countDead(t))
	t.Logf("%d duplicates (redeliveries of messages already answered)", rv.duplicates)
}

// Message groups of the same name in two topics are two groups: one's
// slow delivery does not hold the other back.
func TestSameGroupNameInTwoTopicsDoesNotWait(t *testing.T) {
	t.Parallel()
	b := setupPG(t)
	ctx := context.Background()
	release := make(chan struct{})
	var otherDone atomic.Int32
	_, host := endpoint(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Message-Topic") == "hooks" {
			<-release
		} else {
			otherDone.Add(1)
		}
		w.WriteHeader(http.StatusOK)
	})
	defer close(release)
	target := "http://" + host + "/hook"
	headers := map[string]string{router.HeaderPool: "P", router.HeaderTarget: target}
	_, err := b.producer.SendBatch(ctx, b.db.Pool, []outbox.Message{
		{Topic: "hooks", Group: "g", Payload: []byte(`{}`), Headers: headers},
		{Topic: "other", Group: "g", Payload: []byte(`{}`), Headers: headers},
		{Topic: "other", Group: "g", Payload: []byte(`{}`), Headers: headers},
		{Topic: "other", Group: "g", Payload: []byte(`{}`), Headers: headers},
	})
	require.NoError(t, err)
	rt := newRouter(t, router.Config{AllowedHosts: []string{host}, Pools: []router.PoolConfig{{Code: "P", Concurrency: 4}},
		RequestTimeout: time.Minute})
	b.addSource(t, rt, router.QueueSourceConfig{BatchSize: 10})
	src, err := router.NewQueueSource(router.QueueSourceConfig{Client: b.client, Topic: "other", PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	rt.AddSource(src)
	pgtest.Eventually(t, 10*time.Second, "the other topic's group delivered while hooks' is in flight",
		func() bool { return otherDone.Load() == 3 })
}
