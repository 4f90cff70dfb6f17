package router_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/router"
)

// arrivals records when each message group's calls arrived.
type arrivals struct {
	mu    sync.Mutex
	first map[string]time.Time
	delay time.Duration
}

func (a *arrivals) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var b body
	_ = json.NewDecoder(r.Body).Decode(&b)
	g := b.Group
	a.mu.Lock()
	if _, ok := a.first[g]; !ok {
		a.first[g] = time.Now()
	}
	a.mu.Unlock()
	time.Sleep(a.delay)
	w.WriteHeader(http.StatusOK)
}

func (a *arrivals) at(g string) (time.Time, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t, ok := a.first[g]
	return t, ok
}

// A cold message group beside a hot one with 100,000 messages queued: the
// cold group's message is not delivered behind the hot group's backlog,
// on an ordered topic or not. The router's sources read a topic by
// message group (the database hands out each message group's next
// messages in turn), and the pool's workers go round the groups with
// messages ready.
func TestColdGroupBesideAHotOne(t *testing.T) {
	t.Parallel()
	for _, ordered := range []bool{true, false} {
		t.Run(fmt.Sprintf("ordered=%t", ordered), func(t *testing.T) {
			t.Parallel()
			coldBesideHot(t, ordered)
		})
	}
}

func coldBesideHot(t *testing.T, ordered bool) {
	b := setupPG(t)
	require.NoError(t, b.client.ConfigureTopic(context.Background(), outbox.TopicConfig{Name: "hooks", Semantics: outbox.Queue, Ordered: ordered}))
	rv := &arrivals{first: map[string]time.Time{}, delay: 2 * time.Millisecond}
	_, host := endpoint(t, rv.ServeHTTP)
	target := "http://" + host + "/hook"
	send := func(group string, n int) time.Time {
		msgs := make([]outbox.Message, n)
		for i := range msgs {
			p, _ := json.Marshal(body{Group: group, Seq: i})
			msgs[i] = outbox.Message{Topic: "hooks", Payload: p, Group: group,
				Headers: map[string]string{router.HeaderPool: "P", router.HeaderTarget: target}}
		}
		_, err := b.producer.SendBatch(context.Background(), b.db.Pool, msgs)
		require.NoError(t, err)
		return time.Now()
	}
	b.startRouter(t, host, router.Config{Pools: []router.PoolConfig{{Code: "P", Concurrency: 4}}})
	latency := func(group string) time.Duration {
		sent := send(group, 1)
		var got time.Time
		pgtest.Eventually(t, 120*time.Second, group+" delivered", func() bool {
			var ok bool
			got, ok = rv.at(group)
			return ok
		})
		return got.Sub(sent)
	}
	median := func(prefix string) time.Duration {
		var ds []time.Duration
		for i := range 7 {
			ds = append(ds, latency(fmt.Sprintf("%s%d", prefix, i)))
		}
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	alone := median("alone")
	send("hot", 100_000)
	pgtest.Eventually(t, 30*time.Second, "the hot group under way", func() bool { _, ok := rv.at("hot"); return ok })
	beside := median("cold")
	t.Logf("a cold message's latency (median of 7): alone %s; beside 100,000 hot ones %s (%.1fx)",
		alone.Round(100*time.Microsecond), beside.Round(100*time.Microsecond), float64(beside)/float64(alone))
	// Within twice its latency alone, with 100 ms for a busy machine's
	// noise: behind the backlog it would wait minutes (CI once measured
	// 33 ms beside it, 3.9 ms alone, against a 20 ms allowance).
	require.Less(t, beside, 2*alone+100*time.Millisecond, "the cold message waited behind the hot backlog")
}
