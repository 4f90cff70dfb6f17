package router_test

import (
	"context"
	"encoding/json"
	"net/http"
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

// On an ordered topic, a cold message group beside a hot one with 100,000
// messages queued: the cold group's message is not delivered behind the
// hot group's backlog. The database hands out each message group's head,
// and the pool's workers go round the groups with messages ready. (On a
// topic that is not ordered, the cold message waits until its source has
// read past the hot backlog: see docs/router.md.)
func TestColdGroupBesideAHotOne(t *testing.T) {
	t.Parallel()
	b := setupPG(t)
	require.NoError(t, b.client.ConfigureTopic(context.Background(), outbox.TopicConfig{Name: "hooks", Semantics: outbox.Queue, Ordered: true}))
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
	alone := latency("cold-alone")
	send("hot", 100_000)
	pgtest.Eventually(t, 30*time.Second, "the hot group under way", func() bool { _, ok := rv.at("hot"); return ok })
	beside := latency("cold")
	t.Logf("cold message alone: %s; beside 100,000 hot ones: %s", alone.Round(time.Millisecond), beside.Round(time.Millisecond))
	require.Less(t, beside, time.Second, "not behind the hot backlog (delivering it takes minutes)")
}
