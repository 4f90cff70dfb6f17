package router_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/router"
)

type pgBundle struct {
	db       *pgtest.DB
	client   *outbox.Client
	producer *outbox.Producer
}

func setupPG(t *testing.T) *pgBundle {
	t.Helper()
	db := pgtest.NewDB(t)
	client, err := outbox.NewClient(db.Pool, outbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	producer, err := outbox.NewProducer(outbox.ProducerConfig{Schema: db.Schema, AllowUnconfiguredTopics: true})
	require.NoError(t, err)
	return &pgBundle{db: db, client: client, producer: producer}
}

type body struct {
	Group string `json:"group"`
	Seq   int    `json:"seq"`
}

// sendInterleaved writes perGroup messages for each of groups, interleaved,
// in one transaction, all routed to target through pool P.
func (b *pgBundle) sendInterleaved(t *testing.T, target string, groups, perGroup int) {
	t.Helper()
	var msgs []outbox.Message
	for seq := range perGroup {
		for g := range groups {
			p, _ := json.Marshal(body{Group: fmt.Sprintf("g%d", g), Seq: seq})
			msgs = append(msgs, outbox.Message{Topic: "hooks", Payload: p, Group: fmt.Sprintf("g%d", g),
				Headers: map[string]string{router.HeaderPool: "P", router.HeaderTarget: target}})
		}
	}
	_, err := b.producer.SendBatch(context.Background(), b.db.Pool, msgs)
	require.NoError(t, err)
}

// pending counts the messages of topic hooks its consumers have not
// finished (dead letters aside).
func (b *pgBundle) pending(t *testing.T) int { return b.pendingOf(t, "hooks") }

// pendingOf counts the messages of topic name its consumers have not
// finished (dead letters aside).
func (b *pgBundle) pendingOf(t *testing.T, name string) int {
	t.Helper()
	adm, err := admin.New(b.client, admin.Options{})
	require.NoError(t, err)
	topic, err := adm.Topic(context.Background(), name)
	require.NoError(t, err)
	return int(topic.Ready + topic.Scheduled + topic.Leased)
}

// retries counts the rows of topic hooks' consumers' retry table (retries
// with status RETRY, leased ones PROCESSING, dead letters DEAD_LETTER)
// that match where.
func (b *pgBundle) retries(t *testing.T, where string) int {
	t.Helper()
	return b.countIn(t, "outbox_group_retries", `subscription_id = (SELECT id FROM `+b.db.Table("outbox_topic_subscriptions")+
		` WHERE topic = 'hooks' AND group_name = '`+sqlq.QueueGroup+`') AND `+where)
}

// deadLetters lists hooks' dead letters.
func (b *pgBundle) deadLetters(t *testing.T) ([]outbox.DeadLetter, error) {
	t.Helper()
	adm, err := admin.New(b.client, admin.Options{})
	require.NoError(t, err)
	return adm.DeadLetters(context.Background(), "hooks", "", 0, 10)
}

// countDead counts hooks' dead letters.
func (b *pgBundle) countDead(t *testing.T) int { return b.retries(t, "status = 'DEAD_LETTER'") }

func (b *pgBundle) countPublished(t *testing.T, where string) int {
	return b.countIn(t, "outbox_published", where)
}

func (b *pgBundle) countIn(t *testing.T, table, where string) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+b.db.Table(table)+" WHERE "+where).Scan(&n))
	return n
}

// receiver records what an endpoint received, per group, in order.
type receiver struct {
	mu     sync.Mutex
	order  map[string][]int
	active map[string]int
	peak   int
	fail   func(b body, n int) int // status to answer for the n-th receipt of b (0: 200)
	seen   map[body]int
	delay  time.Duration
	total  atomic.Int64
}

func newReceiver() *receiver {
	return &receiver{order: map[string][]int{}, active: map[string]int{}, seen: map[body]int{}}
}

func (rv *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var b body
	_ = json.NewDecoder(r.Body).Decode(&b)
	rv.mu.Lock()
	rv.seen[b]++
	n := rv.seen[b]
	status := 0
	if rv.fail != nil {
		status = rv.fail(b, n)
	}
	if status == 0 {
		rv.order[b.Group] = append(rv.order[b.Group], b.Seq)
	}
	rv.active[b.Group]++
	if len(rv.active) > rv.peak {
		rv.peak = len(rv.active)
	}
	rv.mu.Unlock()
	time.Sleep(rv.delay)
	rv.mu.Lock()
	if rv.active[b.Group]--; rv.active[b.Group] == 0 {
		delete(rv.active, b.Group)
	}
	rv.mu.Unlock()
	if status != 0 {
		w.WriteHeader(status)
		return
	}
	rv.total.Add(1)
	_, _ = w.Write([]byte(`{"ack":true}`))
}

func (b *pgBundle) startRouter(t *testing.T, host string, cfg router.Config) *router.Router {
	t.Helper()
	return b.startRouterBatch(t, host, cfg, 25)
}

func (b *pgBundle) startRouterBatch(t *testing.T, host string, cfg router.Config, batchSize int) *router.Router {
	t.Helper()
	cfg.AllowedHosts = append(cfg.AllowedHosts, host)
	rt := newRouter(t, cfg)
	b.addSource(t, rt, router.QueueSourceConfig{BatchSize: batchSize})
	return rt
}

// addSource adds a source for the topic hooks, polling every 20 ms, to rt.
func (b *pgBundle) addSource(t *testing.T, rt *router.Router, cfg router.QueueSourceConfig) *router.QueueSource {
	t.Helper()
	cfg.Client, cfg.Topic, cfg.PollInterval = b.client, "hooks", 20*time.Millisecond
	src, err := router.NewQueueSource(cfg)
	require.NoError(t, err)
	rt.AddSource(src)
	return src
}

// sendTo writes one message to target, in a message group of its own.
func (b *pgBundle) sendTo(t *testing.T, target string) int64 {
	t.Helper()
	id, err := b.producer.Send(context.Background(), b.db.Pool, outbox.Message{Topic: "hooks", Payload: []byte(`{}`), Group: target,
		Headers: map[string]string{router.HeaderPool: "P", router.HeaderTarget: target}})
	require.NoError(t, err)
	return id
}

// Interleaved messages of 50 groups: each group's receive order is its send order.
func TestFIFOPerGroup(t *testing.T) {
	t.Parallel()
	b := setupPG(t)
	rv := newReceiver()
	_, host := endpoint(t, rv.ServeHTTP)
	b.sendInterleaved(t, "http://"+host+"/hook", 50, 10)
	b.startRouter(t, host, router.Config{Pools: []router.PoolConfig{{Code: "P", Concurrency: 10}}})
	pgtest.Eventually(t, 30*time.Second, "all delivered and acked", func() bool { return b.pending(t) == 0 })
	rv.mu.Lock()
	defer rv.mu.Unlock()
	require.Len(t, rv.order, 50)
	for g, seqs := range rv.order {
		require.Equal(t, []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, seqs, "group %s", g)
	}
}

// 10 groups × 10 messages against a 100 ms endpoint with concurrency 10:
// at least 5 groups are in flight at once.
func TestConcurrencyAcrossGroups(t *testing.T) {
	t.Parallel()
	b := setupPG(t)
	rv := newReceiver()
	rv.delay = 100 * time.Millisecond
	_, host := endpoint(t, rv.ServeHTTP)
	b.sendInterleaved(t, "http://"+host+"/hook", 10, 10)
	b.startRouter(t, host, router.Config{Pools: []router.PoolConfig{{Code: "P", Concurrency: 10}}})
	pgtest.Eventually(t, 30*time.Second, "all delivered", func() bool { return b.pending(t) == 0 })
	rv.mu.Lock()
	defer rv.mu.Unlock()
	require.GreaterOrEqual(t, rv.peak, 5, "groups in flight at once")
	for g, seqs := range rv.order {
		require.Len(t, seqs, 10, g)
	}
}

// In one batch, group g1's 2nd message gets a 500: its 3rd and 4th are not
// delivered in that pass and arrive later, in order; other groups are unaffected.
func TestBatchGroupCascade(t *testing.T) {
	t.Parallel()
	b := setupPG(t)
	rv := newReceiver()
	var g1Third atomic.Int64 // when g1's 3rd message first arrived
	var failedAt atomic.Int64
	rv.fail = func(bd body, n int) int {
		if bd.Group == "g1" && bd.Seq == 1 && n == 1 {
			failedAt.Store(time.Now().UnixNano())
			return 500
		}
		if bd.Group == "g1" && bd.Seq == 2 && n == 1 {
			g1Third.Store(time.Now().UnixNano())
		}
		return 0
	}
	_, host := endpoint(t, rv.ServeHTTP)
	b.sendInterleaved(t, "http://"+host+"/hook", 3, 4)
	rt := b.startRouter(t, host, router.Config{MaxAttempts: 1, DefaultRetryDelay: time.Second, FastFailDelay: time.Second,
		Pools: []router.PoolConfig{{Code: "P", Concurrency: 5}}})
	pgtest.Eventually(t, 30*time.Second, "all delivered", func() bool { return b.pending(t) == 0 })
	rv.mu.Lock()
	defer rv.mu.Unlock()
	require.Equal(t, []int{0, 1, 2, 3}, rv.order["g1"], "g1 in order after its retry")
	require.Equal(t, []int{0, 1, 2, 3}, rv.order["g0"])
	require.Equal(t, []int{0, 1, 2, 3}, rv.order["g2"])
	require.GreaterOrEqual(t, time.Duration(g1Third.Load()-failedAt.Load()), 900*time.Millisecond,
		"g1's 3rd message waited for the retry of the 2nd")
	pgtest.Eventually(t, 5*time.Second, "in-flight map empty", func() bool { return rt.InFlight() == 0 })
	require.Zero(t, b.countDead(t))
}

// A failure holds its group back across batches too: with batches of 4, a
// failed message's later group mates arrive in later batches before its
// retry, and still are not delivered ahead of it. (A message failing again
// and again can still be overtaken by group mates re-queued meanwhile:
// strict order across repeated retries needs a source that hands out one
// message per group at a time.)
func TestCascadeAcrossBatches(t *testing.T) {
	t.Parallel()
	b := setupPG(t)
	rv := newReceiver()
	rv.fail = func(bd body, n int) int {
		if bd.Group == "g1" && bd.Seq == 1 && n == 1 {
			return 503
		}
		return 0
	}
	_, host := endpoint(t, rv.ServeHTTP)
	b.sendInterleaved(t, "http://"+host+"/hook", 2, 8)
	b.startRouterBatch(t, host, router.Config{MaxAttempts: 1, DefaultRetryDelay: time.Second, FastFailDelay: time.Second,
		Pools: []router.PoolConfig{{Code: "P", Concurrency: 2}}}, 4)
	pgtest.Eventually(t, 60*time.Second, "all delivered", func() bool { return b.pending(t) == 0 })
	rv.mu.Lock()
	defer rv.mu.Unlock()
	require.Equal(t, []int{0, 1, 2, 3, 4, 5, 6, 7}, rv.order["g1"])
	require.Equal(t, []int{0, 1, 2, 3, 4, 5, 6, 7}, rv.order["g0"])
}

// Shutdown with calls in flight: in-progress calls finish and are acked;
// nothing is acked that was not delivered; nothing is lost.
func TestShutdownWithCallsInFlight(t *testing.T) {
	t.Parallel()
	b := setupPG(t)
	release := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	var mu sync.Mutex
	delivered := map[body]int{}
	var started atomic.Int32
	_, host := endpoint(t, func(w http.ResponseWriter, r *http.Request) {
		var bd body
		_ = json.NewDecoder(r.Body).Decode(&bd)
		started.Add(1)
		<-release
		mu.Lock()
		delivered[bd]++
		mu.Unlock()
		_, _ = w.Write([]byte(`{"ack":true}`))
	})
	b.sendInterleaved(t, "http://"+host+"/hook", 20, 5)
	rt := b.startRouter(t, host, router.Config{Pools: []router.PoolConfig{{Code: "P", Concurrency: 4}}})
	pgtest.Eventually(t, 10*time.Second, "4 calls in flight", func() bool { return started.Load() == 4 })
	stopped := make(chan error)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		stopped <- rt.Stop(ctx)
	}()
	time.Sleep(100 * time.Millisecond)
	once.Do(func() { close(release) })
	require.NoError(t, <-stopped)

	require.Equal(t, 96, b.pending(t), "the rest is back in the queue")
	require.Zero(t, b.retries(t, "status = 'PROCESSING'"), "none of it leased")
	mu.Lock()
	first := maps.Clone(delivered)
	mu.Unlock()
	require.Len(t, first, 4, "the 4 calls in flight finished")

	// The next router delivers the rest, and nothing the first one acked.
	b.startRouter(t, host, router.Config{Pools: []router.PoolConfig{{Code: "P", Concurrency: 4}}})
	pgtest.Eventually(t, 20*time.Second, "the rest delivered", func() bool { return b.pending(t) == 0 })
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, delivered, 100, "nothing lost")
	for bd, n := range delivered {
		require.Equal(t, 1, n, "%v delivered once", bd)
	}
}

// A message whose mapping fails is dead-lettered with the reason.
func TestUnroutableMessagesAreDeadLettered(t *testing.T) {
	t.Parallel()
	b := setupPG(t)
	_, err := b.producer.Send(context.Background(), b.db.Pool, outbox.Message{Topic: "hooks", Payload: []byte(`{}`)})
	require.NoError(t, err)
	b.startRouter(t, "127.0.0.1:1", router.Config{})
	pgtest.Eventually(t, 10*time.Second, "dead-lettered", func() bool { return b.countDead(t) == 1 })
	dl, err := b.deadLetters(t)
	require.NoError(t, err)
	require.Contains(t, dl[0].LastError, router.HeaderTarget)
}

// A consumer group on a PUB_SUB topic feeds the router: every message
// reaches the endpoint, in order per group, and completes for the group.
func TestGroupSource(t *testing.T) {
	t.Parallel()
	b := setupPG(t)
	ctx := context.Background()
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "hooks", Semantics: outbox.PubSub, Tracking: outbox.Bitmap}))
	rv := newReceiver()
	_, host := endpoint(t, rv.ServeHTTP)
	rt := newRouter(t, router.Config{AllowedHosts: []string{host}, Pools: []router.PoolConfig{{Code: "P", Concurrency: 5}}})
	src, err := router.NewGroupSource(router.GroupSourceConfig{Pool: b.db.Pool,
		Group: consumergroup.Config{Topic: "hooks", Group: "webhooks", Schema: b.db.Schema, PollInterval: 20 * time.Millisecond, BatchSize: 30}})
	require.NoError(t, err)
	rt.AddSource(src)
	pgtest.Eventually(t, 10*time.Second, "group subscribed", func() bool {
		return subscribed(t, b)
	})
	b.sendInterleaved(t, "http://"+host+"/hook", 10, 10)
	pgtest.Eventually(t, 30*time.Second, "all delivered", func() bool { return rv.total.Load() == 100 })
	pgtest.Eventually(t, 10*time.Second, "all completed by the group", func() bool {
		return b.countPublished(t, "required_bits <> 0 AND "+b.db.FinishedByAll()) == 100
	})
	rv.mu.Lock()
	defer rv.mu.Unlock()
	for g, seqs := range rv.order {
		require.Equal(t, []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, seqs, g)
	}
}

func subscribed(t *testing.T, b *pgBundle) bool {
	var n int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM `+b.db.Table("outbox_topic_subscriptions")).Scan(&n))
	return n == 1
}

// Leases are kept alive while the router holds a message: with a 1 s
// lease, a first delivery that takes 2.5 s and fails, and two group mates
// queued behind it, no lease runs out, nothing is claimed again, the
// failure is retried and every message arrives once, in order.
func TestLeasesOutliveSlowDeliveries(t *testing.T) {
	t.Parallel()
	b := setupPG(t)
	ctx := context.Background()
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "hooks", Lease: time.Second,
		BackoffInitial: 200 * time.Millisecond, BackoffMax: 400 * time.Millisecond}))
	var mu sync.Mutex
	var calls []body
	var delivered []int
	_, host := endpoint(t, func(w http.ResponseWriter, r *http.Request) {
		var bd body
		_ = json.NewDecoder(r.Body).Decode(&bd)
		mu.Lock()
		calls = append(calls, bd)
		first := len(calls) == 1
		mu.Unlock()
		if first {
			time.Sleep(2500 * time.Millisecond)
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		mu.Lock()
		delivered = append(delivered, bd.Seq)
		mu.Unlock()
		_, _ = w.Write([]byte(`{"ack":true}`))
	})
	b.sendInterleaved(t, "http://"+host+"/hook", 1, 3)
	b.startRouter(t, host, router.Config{MaxAttempts: 1, DefaultRetryDelay: time.Second, FastFailDelay: time.Second,
		Pools: []router.PoolConfig{{Code: "P", Concurrency: 1}}})
	pgtest.Eventually(t, 20*time.Second, "all delivered", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(delivered) == 3
	})
	pgtest.Eventually(t, 5*time.Second, "all acked", func() bool { return b.pending(t) == 0 })
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []int{0, 1, 2}, delivered)
	require.Len(t, calls, 4, "the failed first call and three deliveries, no duplicates")
	require.Zero(t, b.countDead(t))
}

// A message claimed again while the router still delivers it (its lease
// ran out) is the same message: the router adopts the new claim instead of
// acking it, so when the first delivery fails the message is retried, not lost.
func TestReclaimWhileInFlightIsAdopted(t *testing.T) {
	t.Parallel()
	b := setupPG(t)
	ctx := context.Background()
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "hooks",
		BackoffInitial: 200 * time.Millisecond, BackoffMax: 400 * time.Millisecond}))
	release := make(chan struct{})
	var once sync.Once
	var calls, successes atomic.Int32
	_, host := endpoint(t, func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			<-release
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		successes.Add(1)
		_, _ = w.Write([]byte(`{"ack":true}`))
	})
	t.Cleanup(func() { once.Do(func() { close(release) }) }) // before the server closes
	b.sendInterleaved(t, "http://"+host+"/hook", 1, 1)
	rt := newRouter(t, router.Config{AllowedHosts: []string{host}, MaxAttempts: 1, DefaultRetryDelay: time.Second})
	b.addSource(t, rt, router.QueueSourceConfig{})
	pgtest.Eventually(t, 10*time.Second, "first delivery in flight", func() bool { return calls.Load() == 1 })
	// The lease runs out under the delivery: the source claims the message
	// again. (Its group reads by message group: the message is leased in
	// the group's retry table.)
	_, err := b.db.Pool.Exec(ctx, `UPDATE `+b.db.Table("outbox_group_retries")+` SET lease_until = now() - interval '1 ms' WHERE status = 'PROCESSING'`)
	require.NoError(t, err)
	pgtest.Eventually(t, 10*time.Second, "claimed again", func() bool { return b.retries(t, "attempts = 2") == 1 || b.pending(t) == 0 })
	require.Equal(t, 1, b.retries(t, "attempts = 2 AND status = 'PROCESSING'"), "the new claim is held, not acked away")
	require.Equal(t, 1, rt.InFlight())
	once.Do(func() { close(release) })
	pgtest.Eventually(t, 10*time.Second, "retried and delivered", func() bool { return successes.Load() == 1 })
	pgtest.Eventually(t, 5*time.Second, "acked", func() bool { return b.pending(t) == 0 })
	require.Zero(t, b.countDead(t))
	require.EqualValues(t, 2, calls.Load())
}

// A retried delivery records why it failed (the status, the timeout, the
// connection error) as the message's last error; a dead letter's reason
// reads once, without a doubled "router: " prefix.
func TestFailuresAreRecorded(t *testing.T) {
	t.Parallel()
	b := setupPG(t)
	ctx := context.Background()
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "hooks", BackoffInitial: time.Hour, BackoffMax: time.Hour}))
	_, failing := endpoint(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusBadGateway) })
	release := make(chan struct{})
	_, slow := endpoint(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	t.Cleanup(func() { close(release) })
	closed, refused := endpoint(t, func(http.ResponseWriter, *http.Request) {})
	closed.Close()
	bad, timedOut := b.sendTo(t, "http://"+failing+"/"), b.sendTo(t, "http://"+slow+"/")
	down, offList := b.sendTo(t, "http://"+refused+"/"), b.sendTo(t, "http://not-allowed.invalid/")
	rt := newRouter(t, router.Config{AllowedHosts: []string{failing, slow, refused}, MaxAttempts: 1,
		RequestTimeout: 100 * time.Millisecond, DefaultRetryDelay: time.Hour})
	b.addSource(t, rt, router.QueueSourceConfig{})
	pgtest.Eventually(t, 10*time.Second, "all settled", func() bool { return b.retries(t, "status = 'RETRY' AND attempts = 1") == 3 })
	lastError := func(id int64) string {
		var e string
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT coalesce(last_error, '') FROM `+b.db.Table("outbox_group_retries")+` WHERE message_id = $1`, id).Scan(&e))
		return e
	}
	require.Contains(t, lastError(bad), "HTTP 502")
	require.Contains(t, lastError(timedOut), "timeout")
	require.Contains(t, lastError(down), "connection refused")
	dead, err := b.deadLetters(t)
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, offList, dead[0].ID)
	require.Equal(t, `permanent: router: target host not allowed: "not-allowed.invalid"`, dead[0].LastError)
}

// A receiver outage does not dead-letter everything: while the circuit is
// open the host is not called and no attempt is spent (after the outage
// every message's attempts equal the calls the receiver saw), and after
// recovery everything is delivered. Real failures wait the topic's backoff.
func TestOutageSpendsNoAttemptsWhileTheCircuitIsOpen(t *testing.T) {
	t.Parallel()
	b := setupPG(t)
	ctx := context.Background()
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "hooks", MaxAttempts: 6,
		BackoffInitial: 50 * time.Millisecond, BackoffMax: 200 * time.Millisecond}))
	rv := newReceiver()
	var healthy atomic.Bool
	failed := map[body]int{}
	rv.fail = func(bd body, _ int) int {
		if healthy.Load() {
			return 0
		}
		failed[bd]++ // under rv.mu
		return http.StatusServiceUnavailable
	}
	_, host := endpoint(t, rv.ServeHTTP)
	b.sendInterleaved(t, "http://"+host+"/hook", 10, 1)
	cfg := router.Config{MaxAttempts: 1, DefaultRetryDelay: 100 * time.Millisecond, FastFailDelay: 100 * time.Millisecond,
		Pools:   []router.PoolConfig{{Code: "P", Concurrency: 2}},
		Breaker: router.BreakerConfig{MinRequests: 2, FailureRatio: 0.5, OpenFor: 400 * time.Millisecond, HalfOpenRequests: 1}}
	outage := b.startRouter(t, host, cfg)
	calls := func() int {
		rv.mu.Lock()
		defer rv.mu.Unlock()
		n := 0
		for _, c := range failed {
			n += c
		}
		return n
	}
	// Two failures open the circuit; each later call is a probe after an
	// open interval: 5 calls is more than a second of outage.
	pgtest.Eventually(t, 20*time.Second, "an outage of several open intervals", func() bool { return calls() >= 5 })
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, outage.Stop(stopCtx))

	require.Zero(t, b.countDead(t), "nothing dead-lettered by the outage")
	rows, err := b.db.Pool.Query(ctx, `SELECT o.payload, coalesce(r.attempts, 0) FROM `+b.db.Table("outbox_published")+` AS o
		LEFT JOIN `+b.db.Table("outbox_group_retries")+` AS r ON r.message_id = o.id WHERE o.topic = 'hooks'`)
	require.NoError(t, err)
	spent := map[body]int{}
	for rows.Next() {
		var bd body
		var attempts int
		require.NoError(t, rows.Scan(&bd, &attempts))
		spent[bd] = attempts
	}
	require.NoError(t, rows.Err())
	require.Len(t, spent, 10)
	rv.mu.Lock()
	for bd, attempts := range spent {
		require.Equal(t, failed[bd], attempts, "attempts of %v are the calls its receiver saw", bd)
	}
	rv.mu.Unlock()

	healthy.Store(true)
	b.startRouter(t, host, cfg)
	pgtest.Eventually(t, 20*time.Second, "everything delivered after recovery", func() bool { return b.pending(t) == 0 })
	require.EqualValues(t, 10, rv.total.Load())
	require.Zero(t, b.countDead(t))
}

// A failed delivery is retried after the topic's backoff (exponential with
// jitter: the first retry between half and all of BackoffInitial), unless
// the receiver named a delay.
func TestRetriesFollowTheTopicBackoff(t *testing.T) {
	t.Parallel()
	b := setupPG(t)
	ctx := context.Background()
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "hooks", BackoffInitial: 10 * time.Second, BackoffMax: time.Hour}))
	_, failing := endpoint(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusInternalServerError) })
	_, busy := endpoint(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "42")
		w.WriteHeader(http.StatusTooManyRequests)
	})
	backedOff, named := b.sendTo(t, "http://"+failing+"/"), b.sendTo(t, "http://"+busy+"/")
	rt := newRouter(t, router.Config{AllowedHosts: []string{failing, busy}, MaxAttempts: 1, DefaultRetryDelay: time.Hour})
	b.addSource(t, rt, router.QueueSourceConfig{})
	pgtest.Eventually(t, 10*time.Second, "both nacked", func() bool { return b.retries(t, "status = 'RETRY' AND attempts = 1") == 2 })
	wait := func(id int64) time.Duration {
		var secs float64
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT extract(epoch FROM available_at - now()) FROM `+b.db.Table("outbox_group_retries")+` WHERE message_id = $1`, id).Scan(&secs))
		return time.Duration(secs * float64(time.Second))
	}
	require.InDelta(t, 7.5, wait(backedOff).Seconds(), 3, "the topic's backoff for a first retry: 5-10 s")
	require.InDelta(t, 42, wait(named).Seconds(), 2, "the receiver's Retry-After")
}

// A mapper that panics does not take the process down: the message is
// nacked as a failed attempt (and will be dead-lettered if it keeps
// panicking), GROUP_THREAD_RESTART is raised, and the other messages of
// the batch are delivered.
func TestPanickingMapperIsRecovered(t *testing.T) {
	t.Parallel()
	b := setupPG(t)
	ctx := context.Background()
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "hooks", BackoffInitial: time.Hour, BackoffMax: time.Hour}))
	rv := newReceiver()
	_, host := endpoint(t, rv.ServeHTTP)
	b.sendInterleaved(t, "http://"+host+"/hook", 3, 1)
	rt := newRouter(t, router.Config{AllowedHosts: []string{host}})
	b.addSource(t, rt, router.QueueSourceConfig{Mapper: func(d *outbox.Delivery) (router.Route, error) {
		if d.Group == "g1" {
			panic("mapper bug")
		}
		return router.HeaderMapper(d)
	}})
	pgtest.Eventually(t, 10*time.Second, "the others delivered", func() bool { return rv.total.Load() == 2 })
	pgtest.Eventually(t, 5*time.Second, "the panicking one nacked", func() bool {
		return b.retries(t, "status = 'RETRY' AND attempts = 1 AND last_error LIKE '%mapper bug%'") == 1
	})
	require.True(t, hasWarning(rt, router.WarnGroupThreadRestart, router.SeverityWarn))
}

// A removed source claims nothing more; what it already handed over is
// still delivered and acked, and RemoveSource waits for that.
func TestRemovedSourceFinishesItsMessages(t *testing.T) {
	t.Parallel()
	b := setupPG(t)
	ctx := context.Background()
	release := make(chan struct{})
	var once sync.Once
	rv := newReceiver()
	_, host := endpoint(t, func(w http.ResponseWriter, r *http.Request) { <-release; rv.ServeHTTP(w, r) })
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	b.sendInterleaved(t, "http://"+host+"/hook", 1, 1)
	rt := newRouter(t, router.Config{AllowedHosts: []string{host}})
	src := b.addSource(t, rt, router.QueueSourceConfig{})
	pgtest.Eventually(t, 10*time.Second, "in flight", func() bool { return rt.InFlight() == 1 })
	removed := make(chan error, 1)
	go func() { removed <- rt.RemoveSource(ctx, src) }()
	b.sendInterleaved(t, "http://"+host+"/hook", 1, 1)
	time.Sleep(200 * time.Millisecond) // ten poll intervals
	require.Equal(t, 1, rt.InFlight(), "the new message is not taken")
	select {
	case err := <-removed:
		t.Fatalf("RemoveSource returned (%v) with a message in flight", err)
	default:
	}
	once.Do(func() { close(release) })
	require.NoError(t, <-removed)
	pgtest.Eventually(t, 10*time.Second, "the message in flight acked", func() bool { return b.pending(t) == 1 })
	time.Sleep(200 * time.Millisecond)
	require.Zero(t, rt.InFlight())
	require.Equal(t, 1, b.pending(t), "the new message waits for a source")
	require.EqualValues(t, 1, rv.total.Load())
}

// A delivery longer than the topic's lease (2.5 s against 1 s) keeps its
// batch leased: a second router on the topic never gets the message while
// the first delivers it.
func TestDeliveryLongerThanTheLeaseIsDeliveredOnce(t *testing.T) {
	t.Parallel()
	b := setupPG(t)
	ctx := context.Background()
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "hooks", Lease: time.Second}))
	var calls atomic.Int32
	_, host := endpoint(t, func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		time.Sleep(2500 * time.Millisecond)
		_, _ = w.Write([]byte(`{"ack":true}`))
	})
	for range 2 {
		rt := newRouter(t, router.Config{AllowedHosts: []string{host}, RequestTimeout: 5 * time.Second,
			Pools: []router.PoolConfig{{Code: "P", Concurrency: 1}}})
		b.addSource(t, rt, router.QueueSourceConfig{})
	}
	b.sendTo(t, "http://"+host+"/hook")
	pgtest.Eventually(t, 20*time.Second, "acked", func() bool { return b.pending(t) == 0 })
	require.EqualValues(t, 1, calls.Load(), "delivered once")
}

// Message ids are unique within one database and schema only: two
// sources of one router over two databases both hand it message 1, and
// both are delivered. (The second was taken for a copy of the first, in
// flight, and acked without delivery.)
func TestSameIDFromTwoDatabasesIsTwoMessages(t *testing.T) {
	t.Parallel()
	a, b := setupPG(t), setupPG(t)
	ctx := context.Background()
	inFlight := make(chan struct{})
	var once sync.Once
	var mu sync.Mutex
	got := map[string]int{}
	_, host := endpoint(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got[r.URL.Path]++
		mu.Unlock()
		if r.URL.Path == "/a" {
			once.Do(func() { close(inFlight) })
			time.Sleep(time.Second)
		}
		_, _ = w.Write([]byte(`{"ack":true}`))
	})
	send := func(p *pgBundle, topic, path string) int64 {
		id, err := p.producer.Send(ctx, p.db.Pool, outbox.Message{Topic: topic, Payload: []byte(`{}`),
			Headers: map[string]string{router.HeaderPool: "P", router.HeaderTarget: "http://" + host + path}})
		require.NoError(t, err)
		return id
	}
	require.Equal(t, send(a, "hooks", "/a"), send(b, "other", "/b"), "both databases number from 1")
	rt := newRouter(t, router.Config{AllowedHosts: []string{host}})
	a.addSource(t, rt, router.QueueSourceConfig{})
	<-inFlight
	src, err := router.NewQueueSource(router.QueueSourceConfig{Client: b.client, Topic: "other", PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	rt.AddSource(src)
	pgtest.Eventually(t, 10*time.Second, "both acked", func() bool { return a.pending(t)+b.pendingOf(t, "other") == 0 })
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, map[string]int{"/a": 1, "/b": 1}, got, "each message delivered once")
}
