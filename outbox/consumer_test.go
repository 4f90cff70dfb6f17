package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/internal/testsupport/clocktest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
)

func TestConsumerDrainsQueue(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	b.sendN(t, "orders", 500)
	var handled atomic.Int64
	startConsumer(t, b.client, outbox.ConsumerConfig{
		Topic: "orders",
		Handler: func(ctx context.Context, d *outbox.Delivery) error {
			handled.Add(1)
			return nil
		},
	})
	pgtest.Eventually(t, 10*time.Second, "queue drained", func() bool { return b.count(t, "true") == 0 })
	require.EqualValues(t, 500, handled.Load())
}

// Four consumers in two pools (as if two processes) drain 20,000 messages
// with random handler delays; every message is handled exactly once.
func TestCompetingConsumersNoLossNoDuplicates(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	const n = 20000
	b.sendN(t, "jobs", n)
	secondPool := pgtest.NewPool(t, b.db.DSN)
	secondClient, err := outbox.NewClient(secondPool, outbox.Config{Schema: b.db.Schema})
	require.NoError(t, err)

	counts := make([]atomic.Int32, n)
	var total atomic.Int64
	handler := func(ctx context.Context, d *outbox.Delivery) error {
		p, err := outbox.Decode[seqPayload](d)
		if err != nil {
			return outbox.Permanent(err)
		}
		counts[p.Seq].Add(1)
		total.Add(1)
		if r := rand.IntN(10); r == 0 {
			time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
		}
		return nil
	}
	for i, c := range []*outbox.Client{b.client, b.client, secondClient, secondClient} {
		startConsumer(t, c, outbox.ConsumerConfig{Topic: "jobs", Handler: handler, Concurrency: 4, BatchSize: 50,
			PollInterval: 50 * time.Millisecond, ID: fmt.Sprintf("consumer-%d", i)})
	}
	pgtest.Eventually(t, 60*time.Second, "all messages handled and acked", func() bool {
		return total.Load() >= n && b.count(t, "true") == 0
	})
	for seq := range counts {
		require.EqualValues(t, 1, counts[seq].Load(), "message %d", seq)
	}
	require.EqualValues(t, n, total.Load())
}

// A consumer that dies mid-batch (its pool closed, nothing acked) leaves its
// messages leased; they are redelivered only after the lease, once each.
func TestCrashedConsumerMessagesRedeliveredAfterLease(t *testing.T) {
	t.Parallel()
	clock := clocktest.New(time.Now())
	b := setup(t, outbox.Config{Clock: clock})
	ctx := context.Background()
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "work", Lease: 30 * time.Second}))
	const n = 40
	b.sendN(t, "work", n)

	// The doomed consumer: its own pool, handlers that never finish.
	doomedPool := pgtest.NewPool(t, b.db.DSN)
	doomedClient, err := outbox.NewClient(doomedPool, outbox.Config{Schema: b.db.Schema, Clock: clock})
	require.NoError(t, err)
	var doomedGot sync.Map
	var doomedCount atomic.Int64
	doomed, err := doomedClient.NewConsumer(ctx, outbox.ConsumerConfig{Topic: "work", Concurrency: 5, BatchSize: 10, ID: "doomed",
		Handler: func(ctx context.Context, d *outbox.Delivery) error {
			doomedGot.Store(d.ID, true)
			doomedCount.Add(1)
			<-ctx.Done()
			return ctx.Err()
		}})
	require.NoError(t, err)
	require.NoError(t, doomed.Start(ctx))
	pgtest.Eventually(t, 10*time.Second, "doomed consumer holds 5 messages", func() bool { return doomedCount.Load() == 5 })
	// One batch of 10: a smaller claim comes only when the handlers are
	// about to run out of work, which these never are. 5 running, 5 waiting.
	pgtest.Eventually(t, 10*time.Second, "5 running + 5 waiting", func() bool {
		return b.count(t, "lease_owner = 'doomed'") == 10
	})
	time.Sleep(100 * time.Millisecond) // and no smaller claim follows
	held := 10
	require.Equal(t, held, b.count(t, "lease_owner = 'doomed'"))

	// Crash: the pool goes away first, so no ack, release or nack is written.
	doomedPool.Close()
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	_ = doomed.Stop(stopCtx)
	cancel()
	require.Equal(t, held, b.count(t, "lease_owner = 'doomed'"), "crash wrote nothing")

	var mu sync.Mutex
	seen := map[int64]int{}
	startConsumer(t, b.client, outbox.ConsumerConfig{Topic: "work", PollInterval: 20 * time.Millisecond, ID: "survivor",
		Handler: func(ctx context.Context, d *outbox.Delivery) error {
			mu.Lock()
			seen[d.ID]++
			mu.Unlock()
			return nil
		}})
	pgtest.Eventually(t, 10*time.Second, "the unclaimed messages handled", func() bool { return b.count(t, "true") == held })
	time.Sleep(200 * time.Millisecond) // ten poll periods: the leases must hold
	require.Equal(t, held, b.count(t, "lease_owner IS NOT NULL"), "not redelivered before the lease expires")

	clock.Advance(31 * time.Second)
	pgtest.Eventually(t, 10*time.Second, "redelivered after the lease", func() bool { return b.count(t, "true") == 0 })
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, seen, n)
	for id, c := range seen {
		require.Equal(t, 1, c, "message %d handled once by the survivor", id)
	}
	redelivered := 0
	doomedGot.Range(func(k, _ any) bool { redelivered++; return true })
	require.Equal(t, 5, redelivered)
}

// A failing handler: attempts counted, backoff respected on the injected
// clock, dead-lettered after MaxAttempts, then replayed and handled.
func TestRetryBackoffDeadLetterReplay(t *testing.T) {
	t.Parallel()
	clock := clocktest.New(time.Now())
	b := setup(t, outbox.Config{Clock: clock})
	ctx := context.Background()
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "mail", MaxAttempts: 3,
		BackoffInitial: 10 * time.Second, BackoffMax: time.Minute}))
	id, err := b.producer.Send(ctx, b.db.Pool, seqMessage("mail", 1))
	require.NoError(t, err)

	var fail atomic.Bool
	fail.Store(true)
	attempts := make(chan int, 10)
	startConsumer(t, b.client, outbox.ConsumerConfig{Topic: "mail", PollInterval: 20 * time.Millisecond,
		Handler: func(ctx context.Context, d *outbox.Delivery) error {
			attempts <- d.Attempt
			if fail.Load() {
				return errors.New("smtp down")
			}
			return nil
		}})

	availableIn := func() time.Duration {
		var at time.Time
		var leased bool
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT available_at, lease_owner IS NOT NULL FROM `+b.db.Table("outbox")+` WHERE id = $1`, id).Scan(&at, &leased))
		require.False(t, leased, "pending")
		return at.Sub(clock.Now())
	}
	expectAttempt := func(want int) {
		t.Helper()
		select {
		case got := <-attempts:
			require.Equal(t, want, got)
		case <-time.After(10 * time.Second):
			t.Fatalf("attempt %d not delivered", want)
		}
	}
	expectNone := func() {
		t.Helper()
		select {
		case got := <-attempts:
			t.Fatalf("attempt %d delivered before its backoff ended", got)
		case <-time.After(150 * time.Millisecond):
		}
	}

	expectAttempt(1)
	pgtest.Eventually(t, 5*time.Second, "nack written", func() bool { return b.count(t, "lease_owner IS NULL AND attempts = 1") == 1 })
	d := availableIn()
	require.True(t, d >= 5*time.Second && d <= 10*time.Second, "first backoff %v in [5s, 10s]", d)
	expectNone()
	clock.Advance(d - time.Second)
	expectNone()
	clock.Advance(time.Second)
	expectAttempt(2)
	pgtest.Eventually(t, 5*time.Second, "nack written", func() bool { return b.count(t, "lease_owner IS NULL AND attempts = 2") == 1 })
	d = availableIn()
	require.True(t, d >= 10*time.Second && d <= 20*time.Second, "second backoff %v in [10s, 20s]", d)
	clock.Advance(d)
	expectAttempt(3)
	pgtest.Eventually(t, 5*time.Second, "dead-lettered", func() bool { return b.countDead(t, "true") == 1 })
	deadAt := clock.Now()
	clock.Advance(time.Hour)
	expectNone()

	dead, err := b.client.DeadLetters(ctx, "mail", 0, 0)
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, id, dead[0].ID)
	require.Equal(t, 3, dead[0].Attempt)
	require.Contains(t, dead[0].LastError, "smtp down")
	require.WithinDuration(t, deadAt, dead[0].DeadLetteredAt, time.Millisecond)

	_, err = b.client.ReplayDeadLetters(ctx, "mail", id, 999999)
	require.ErrorIs(t, err, outbox.ErrNotFound)
	fail.Store(false)
	expectAttempt(1)
	pgtest.Eventually(t, 5*time.Second, "acked after replay", func() bool { return b.count(t, "true") == 0 })
}

func TestHandlerChosenDelayAndPermanentError(t *testing.T) {
	t.Parallel()
	clock := clocktest.New(time.Now())
	b := setup(t, outbox.Config{Clock: clock})
	ctx := context.Background()
	retryID, err := b.producer.Send(ctx, b.db.Pool, seqMessage("t", 1))
	require.NoError(t, err)
	permID, err := b.producer.Send(ctx, b.db.Pool, seqMessage("t", 2))
	require.NoError(t, err)
	startConsumer(t, b.client, outbox.ConsumerConfig{Topic: "t", PollInterval: 20 * time.Millisecond,
		Handler: func(ctx context.Context, d *outbox.Delivery) error {
			if d.ID == permID {
				return outbox.Permanent(errors.New("malformed order"))
			}
			return outbox.RetryAfter(42*time.Minute, errors.New("rate limited"))
		}})
	pgtest.Eventually(t, 5*time.Second, "both settled", func() bool {
		return b.countDead(t, "id = $1 AND attempts = 1", permID) == 1 &&
			b.count(t, "lease_owner IS NULL AND id = $1 AND attempts = 1", retryID) == 1
	})
	var at time.Time
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT available_at FROM `+b.db.Table("outbox")+` WHERE id = $1`, retryID).Scan(&at))
	require.WithinDuration(t, clock.Now().Add(42*time.Minute), at, time.Second)
	dead, err := b.client.DeadLetters(ctx, "t", 0, 0)
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.WithinDuration(t, clock.Now(), dead[0].DeadLetteredAt, time.Millisecond, "dead-lettered now, not after the retry delay")
}

// A lease ends when the claim says, ExtendLease moves that end, and claims
// take back only leases that ended: an expired one on its last attempt
// becomes a dead letter, dead-lettered at the time of the claim that found it.
func TestExtendedLeaseOutlivesExpiry(t *testing.T) {
	t.Parallel()
	clock := clocktest.New(time.Now())
	b := setup(t, outbox.Config{Clock: clock})
	ctx := context.Background()
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "q", Lease: time.Minute, MaxAttempts: 1}))
	b.sendN(t, "q", 2)
	ds, err := b.client.Claim(ctx, "q", "holder", 2)
	require.NoError(t, err)
	require.Len(t, ds, 2)
	for _, d := range ds {
		require.WithinDuration(t, clock.Now().Add(time.Minute), d.LeaseUntil, time.Millisecond)
	}
	kept, dropped := ds[0], ds[1]
	require.NoError(t, b.client.ExtendLease(ctx, kept, 10*time.Minute))
	require.WithinDuration(t, clock.Now().Add(10*time.Minute), kept.LeaseUntil, time.Millisecond)

	clock.Advance(2 * time.Minute)
	startConsumer(t, b.client, outbox.ConsumerConfig{Topic: "q", PollInterval: 20 * time.Millisecond,
		Handler: func(context.Context, *outbox.Delivery) error {
			t.Error("nothing is deliverable: one lease holds, the other message used its only attempt")
			return nil
		}})
	pgtest.Eventually(t, 5*time.Second, "the expired lease taken back", func() bool { return b.countDead(t, "true") == 1 })
	dead, err := b.client.DeadLetters(ctx, "q", 0, 0)
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, dropped.ID, dead[0].ID)
	require.WithinDuration(t, clock.Now(), dead[0].DeadLetteredAt, time.Millisecond)
	require.Equal(t, "lease expired (consumer holder)", dead[0].LastError)

	time.Sleep(100 * time.Millisecond) // five poll periods: the extended lease must hold
	require.NoError(t, b.client.Ack(ctx, kept), "the extended lease is still held")
	require.Equal(t, 0, b.count(t, "true"))
	require.Equal(t, 1, b.countDead(t, "true"))
	require.ErrorIs(t, b.client.ExtendLease(ctx, dropped, time.Minute), outbox.ErrLeaseLost)
}

func TestDelayedMessages(t *testing.T) {
	t.Parallel()
	clock := clocktest.New(time.Now())
	b := setup(t, outbox.Config{Clock: clock})
	ctx := context.Background()
	delayed := seqMessage("t", 1)
	delayed.Delay = time.Hour
	later := seqMessage("t", 2)
	later.NotBefore = clock.Now().Add(2 * time.Hour)
	_, err := b.producer.SendBatch(ctx, b.db.Pool, []outbox.Message{delayed, later, seqMessage("t", 3)})
	require.NoError(t, err)
	got := make(chan int, 3)
	startConsumer(t, b.client, outbox.ConsumerConfig{Topic: "t", PollInterval: 20 * time.Millisecond,
		Handler: func(ctx context.Context, d *outbox.Delivery) error {
			p, _ := outbox.Decode[seqPayload](d)
			got <- p.Seq
			return nil
		}})
	expect := func(want int) {
		t.Helper()
		select {
		case seq := <-got:
			require.Equal(t, want, seq)
		case <-time.After(5 * time.Second):
			t.Fatalf("message %d not delivered", want)
		}
		select {
		case seq := <-got:
			t.Fatalf("message %d delivered too early", seq)
		case <-time.After(150 * time.Millisecond):
		}
	}
	expect(3)
	clock.Advance(time.Hour + time.Second)
	expect(1)
	clock.Advance(time.Hour)
	expect(2)
}

func TestPrioritiesClaimedFirst(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	ctx := context.Background()
	var msgs []outbox.Message
	for i := range 20 {
		m := seqMessage("t", i)
		if i >= 10 {
			m.Priority = 10 // written last, handled first
		}
		msgs = append(msgs, m)
	}
	_, err := b.producer.SendBatch(ctx, b.db.Pool, msgs)
	require.NoError(t, err)
	var mu sync.Mutex
	var order []int
	startConsumer(t, b.client, outbox.ConsumerConfig{Topic: "t", Concurrency: 1, BatchSize: 4,
		Handler: func(ctx context.Context, d *outbox.Delivery) error {
			mu.Lock()
			order = append(order, d.Priority)
			mu.Unlock()
			return nil
		}})
	pgtest.Eventually(t, 5*time.Second, "all handled", func() bool { mu.Lock(); defer mu.Unlock(); return len(order) == 20 })
	for i, p := range order {
		want := 0
		if i < 10 {
			want = 10
		}
		require.Equal(t, want, p, "delivery %d", i)
	}
}

// LISTEN/NOTIFY wakes an idle consumer long before its poll interval.
func TestNotifyWakesIdleConsumer(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	ctx := context.Background()
	got := make(chan time.Time, 4)
	startConsumer(t, b.client, outbox.ConsumerConfig{Topic: "t", PollInterval: time.Hour,
		Handler: func(ctx context.Context, d *outbox.Delivery) error { got <- time.Now(); return nil }})
	time.Sleep(200 * time.Millisecond) // let the consumer go idle
	// After handling a message the consumer looks again after 1, 2, 4, ...
	// ms; 1.2s later its next look is about a second away, so a fast
	// pick-up can only come from the notification.
	for range 2 {
		sent := time.Now()
		require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			_, err := b.producer.Send(ctx, tx, seqMessage("t", 1))
			return err
		}))
		select {
		case at := <-got:
			require.Less(t, at.Sub(sent), 500*time.Millisecond)
		case <-time.After(10 * time.Second):
			t.Fatal("notification did not wake the consumer (poll interval is an hour)")
		}
		time.Sleep(1200 * time.Millisecond)
	}
}

// Stop releases claimed messages no handler started, so another consumer
// gets them at once, and waits for running handlers.
func TestStopReleasesUnstartedClaims(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	ctx := context.Background()
	b.sendN(t, "t", 30)
	release := make(chan struct{})
	var started, finished atomic.Int64
	k, err := b.client.NewConsumer(ctx, outbox.ConsumerConfig{Topic: "t", Concurrency: 2, BatchSize: 10,
		Handler: func(ctx context.Context, d *outbox.Delivery) error {
			started.Add(1)
			<-release
			finished.Add(1)
			return nil
		}})
	require.NoError(t, err)
	require.NoError(t, k.Start(ctx))
	pgtest.Eventually(t, 5*time.Second, "two handlers running", func() bool { return started.Load() == 2 })
	require.Equal(t, 10, b.count(t, "lease_owner IS NOT NULL"), "one batch; 2 running, 8 waiting")

	stopped := make(chan error)
	go func() { stopped <- k.Stop(ctx) }()
	select {
	case <-stopped:
		t.Fatal("Stop returned while handlers were running")
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	require.NoError(t, <-stopped)
	require.EqualValues(t, 2, finished.Load())
	require.Equal(t, 28, b.count(t, "lease_owner IS NULL AND attempts = 0 AND available_at <= now()"), "released with their attempt given back")
	require.NoError(t, k.Start(ctx), "a stopped consumer starts again")
	require.ErrorIs(t, k.Start(ctx), outbox.ErrAlreadyStarted)
	pgtest.Eventually(t, 10*time.Second, "the rest handled by the new run", func() bool { return b.count(t, "true") == 0 })
	require.NoError(t, k.Stop(ctx))
}

// A Stop whose deadline passes cancels running handlers and releases their
// messages for immediate redelivery.
func TestStopDeadlineCancelsHandlers(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	ctx := context.Background()
	id, err := b.producer.Send(ctx, b.db.Pool, seqMessage("t", 1))
	require.NoError(t, err)
	running := make(chan struct{})
	k, err := b.client.NewConsumer(ctx, outbox.ConsumerConfig{Topic: "t",
		Handler: func(ctx context.Context, d *outbox.Delivery) error {
			close(running)
			<-ctx.Done()
			return ctx.Err()
		}})
	require.NoError(t, err)
	require.NoError(t, k.Start(ctx))
	<-running
	stopCtx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, k.Stop(stopCtx), context.DeadlineExceeded)
	require.Equal(t, 1, b.count(t, "id = $1 AND lease_owner IS NULL AND attempts = 1", id))
}

// The handler's context ends before the lease does.
func TestHandlerContextEndsBeforeLease(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	ctx := context.Background()
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "t", Lease: time.Second}))
	_, err := b.producer.Send(ctx, b.db.Pool, seqMessage("t", 1))
	require.NoError(t, err)
	type obs struct {
		deadline, leaseUntil time.Time
		err                  error
	}
	got := make(chan obs, 1)
	startConsumer(t, b.client, outbox.ConsumerConfig{Topic: "t",
		Handler: func(ctx context.Context, d *outbox.Delivery) error {
			dl, _ := ctx.Deadline()
			<-ctx.Done()
			select {
			case got <- obs{dl, d.LeaseUntil, ctx.Err()}:
			default:
			}
			return ctx.Err()
		}})
	o := <-got
	require.ErrorIs(t, o.err, context.DeadlineExceeded)
	require.True(t, o.deadline.Before(o.leaseUntil), "deadline %v before lease end %v", o.deadline, o.leaseUntil)
}

// A handler that outlives its lease: the message is redelivered, and the
// late ack of the first delivery does not delete it under the second.
func TestLateAckAfterLeaseExpiryIsIgnored(t *testing.T) {
	t.Parallel()
	clock := clocktest.New(time.Now())
	b := setup(t, outbox.Config{Clock: clock})
	ctx := context.Background()
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "t", Lease: 10 * time.Second}))
	id, err := b.producer.Send(ctx, b.db.Pool, seqMessage("t", 1))
	require.NoError(t, err)
	release := [3]chan struct{}{nil, make(chan struct{}), make(chan struct{})}
	started := make(chan int, 2)
	startConsumer(t, b.client, outbox.ConsumerConfig{Topic: "t", Concurrency: 2, PollInterval: 20 * time.Millisecond,
		Handler: func(_ context.Context, d *outbox.Delivery) error {
			started <- d.Attempt
			<-release[d.Attempt] // ignores its context on purpose
			return nil
		}})
	require.Equal(t, 1, <-started)
	clock.Advance(11 * time.Second)
	require.Equal(t, 2, <-started, "redelivered after the lease expired")
	close(release[1]) // the first delivery acks late
	time.Sleep(100 * time.Millisecond)
	require.Equal(t, 1, b.count(t, "id = $1 AND lease_owner IS NOT NULL AND attempts = 2", id), "late ack ignored")
	close(release[2])
	pgtest.Eventually(t, 5*time.Second, "second delivery acked", func() bool { return b.count(t, "true") == 0 })
}

// Consumers (and consumer groups) of one Client share one LISTEN connection,
// closed when the last of them stops.
func TestConsumersShareOneListenConnection(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	ctx := context.Background()
	listeners := func() int {
		var n int
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_catalog.pg_stat_activity
			WHERE datname = current_database() AND query LIKE 'LISTEN %'`).Scan(&n))
		return n
	}
	noop := func(context.Context, *outbox.Delivery) error { return nil }
	var consumers []*outbox.Consumer
	for _, topic := range []string{"a", "b", "c"} {
		k, err := b.client.NewConsumer(ctx, outbox.ConsumerConfig{Topic: topic, Handler: noop})
		require.NoError(t, err)
		require.NoError(t, k.Start(ctx))
		consumers = append(consumers, k)
	}
	pgtest.Eventually(t, 5*time.Second, "one LISTEN connection", func() bool { return listeners() == 1 })
	time.Sleep(100 * time.Millisecond)
	require.Equal(t, 1, listeners())
	for _, k := range consumers {
		require.NoError(t, k.Stop(ctx))
	}
	pgtest.Eventually(t, 5*time.Second, "LISTEN connection closed", func() bool { return listeners() == 0 })
}

// Claim is the primitive the router's QueueSource builds on: bad arguments
// and PUB_SUB topics get typed errors; a claim takes the highest priorities
// first, leases them for the topic's Lease and returns them in id order.
func TestClaimPrimitive(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	ctx := context.Background()
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "q", Lease: 2 * time.Minute}))
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: outbox.Bitmap}))
	for _, tc := range []struct {
		topic, owner string
		limit        int
		want         error
	}{
		{"q", "", 10, outbox.ErrInvalidConfig},
		{"q", "me", 0, outbox.ErrInvalidConfig},
		{"events", "me", 10, outbox.ErrWrongSemantics},
		{"bad topic!", "me", 10, outbox.ErrInvalidTopic},
	} {
		_, err := b.client.Claim(ctx, tc.topic, tc.owner, tc.limit)
		require.ErrorIs(t, err, tc.want, "%+v", tc)
	}

	var ids []int64
	for i, prio := range []int{0, 5, 0} {
		m := seqMessage("q", i)
		m.Priority = prio
		id, err := b.producer.Send(ctx, b.db.Pool, m)
		require.NoError(t, err)
		ids = append(ids, id)
	}
	ds, err := b.client.Claim(ctx, "q", "me", 2)
	require.NoError(t, err)
	require.Len(t, ds, 2)
	require.Equal(t, []int64{ids[0], ids[1]}, []int64{ds[0].ID, ds[1].ID}, "priority 5 and the oldest priority 0, in id order")
	for _, d := range ds {
		require.InDelta(t, (2 * time.Minute).Seconds(), d.LeaseUntil.Sub(d.CreatedAt).Seconds(), 5)
		require.Equal(t, 1, d.Attempt)
	}
	require.NoError(t, b.client.Ack(ctx, ds...))
	require.Equal(t, 1, b.count(t, "true"))
	require.Equal(t, 1, b.count(t, "lease_owner IS NULL AND id = "+strconv.FormatInt(ids[2], 10)))
}

// ExtendLeases renews many leases in one statement and reports those it
// could not renew: here one that expired and was claimed again (a new
// attempt) and one that was acked.
func TestExtendLeasesInBulk(t *testing.T) {
	t.Parallel()
	clock := clocktest.New(time.Now())
	b := setup(t, outbox.Config{Clock: clock})
	ctx := context.Background()
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "q", Lease: time.Minute}))
	b.sendN(t, "q", 4)
	ds, err := b.client.Claim(ctx, "q", "holder", 4)
	require.NoError(t, err)
	require.Len(t, ds, 4)
	held, reclaimed, acked := ds[:2], ds[2], ds[3]
	require.NoError(t, b.client.Ack(ctx, acked))
	_, err = b.db.Pool.Exec(ctx, `UPDATE `+b.db.Table("outbox")+` SET available_at = $2 WHERE id = $1`, reclaimed.ID, clock.Now())
	require.NoError(t, err)
	again, err := b.client.Claim(ctx, "q", "other", 4)
	require.NoError(t, err)
	require.Len(t, again, 1, "only the expired lease is claimed again")
	require.Equal(t, reclaimed.ID, again[0].ID)

	clock.Advance(50 * time.Second)
	lost, err := b.client.ExtendLeases(ctx, ds, 10*time.Minute)
	require.NoError(t, err)
	require.ElementsMatch(t, []*outbox.Delivery{reclaimed, acked}, lost)
	for _, d := range held {
		require.WithinDuration(t, clock.Now().Add(10*time.Minute), d.LeaseUntil, time.Millisecond)
	}
	require.Equal(t, 2, b.count(t, "available_at = $1", clock.Now().Add(10*time.Minute)), "both held leases renewed in the table")
	require.Equal(t, 1, b.count(t, "lease_owner = 'other' AND available_at = $1", again[0].LeaseUntil), "the new claim's lease untouched")

	lost, err = b.client.ExtendLeases(ctx, nil, time.Minute)
	require.NoError(t, err)
	require.Empty(t, lost)
}

// Claimed messages waiting for a worker keep their leases: with a 1 s
// lease, one worker, 300 ms handlers and 10 messages claimed at once (3 s
// of work), none is claimed again while it waits, so each is handled once,
// with a live context, and none is dead-lettered. (They ran out their
// leases in the queue: the consumer claimed them again and ran them up to
// ten times, some only with expired contexts until they were dead-lettered.)
func TestQueuedMessagesKeepTheirLeases(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	ctx := context.Background()
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "q", Lease: time.Second, MaxAttempts: 3}))
	b.sendN(t, "q", 10)
	var mu sync.Mutex
	handled := map[int64]int{}
	expired := 0
	startConsumer(t, b.client, outbox.ConsumerConfig{Topic: "q", Concurrency: 1, BatchSize: 10, PollInterval: 20 * time.Millisecond,
		Handler: func(ctx context.Context, d *outbox.Delivery) error {
			if ctx.Err() != nil {
				mu.Lock()
				expired++
				mu.Unlock()
				return ctx.Err()
			}
			time.Sleep(300 * time.Millisecond)
			mu.Lock()
			handled[d.ID]++
			mu.Unlock()
			return nil
		}})
	pgtest.Eventually(t, 30*time.Second, "all acked", func() bool { return b.count(t, "true") == 0 })
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, handled, 10)
	for id, n := range handled {
		require.Equal(t, 1, n, "message %d handled %d times", id, n)
	}
	require.Zero(t, expired, "no handler got an expired context")
	require.Zero(t, b.countDead(t, "true"))
}
