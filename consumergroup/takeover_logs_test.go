package consumergroup_test

import (
	"context"
	"errors"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/clocktest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/testlog"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// What takeover tests look for in the logs.
const (
	tookOver  = "took over messages whose lease had expired"
	lostLease = "were taken over by another (their lease expired"
)

// freezer is a handler that blocks every delivery while frozen, until it
// is thawed: an instance that froze (a long GC or VM pause) holding its
// messages.
type freezer struct {
	mu     sync.Mutex
	thawed chan struct{}
	held   atomic.Int64
}

func newFreezer() *freezer { return &freezer{thawed: make(chan struct{})} }

func (f *freezer) handle(ctx context.Context, _ *outbox.Delivery) error {
	f.mu.Lock()
	thawed := f.thawed
	f.mu.Unlock()
	f.held.Add(1)
	defer f.held.Add(-1)
	select {
	case <-thawed:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (f *freezer) thaw() {
	f.mu.Lock()
	defer f.mu.Unlock()
	close(f.thawed)
}

func (f *freezer) freeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.thawed = make(chan struct{})
}

// takeoverBundle is a bundle with two clients that log to logs, at most
// once per kind every interval: one on database time, one (the
// survivor's) on a clock 40 s ahead of it, to which every lease the
// other takes has expired.
func takeoverBundle(t *testing.T, tc outbox.TopicConfig, interval time.Duration) (b *bundle, doomed, survivor *outbox.Client, logs *testlog.Buffer) {
	t.Helper()
	b = setupTopic(t, tc)
	logs = &testlog.Buffer{}
	doomed, err := outbox.NewClient(b.db.Pool, outbox.Config{Schema: b.db.Schema, Logger: logs.Logger(), LogInterval: interval})
	require.NoError(t, err)
	survivor, err = outbox.NewClient(b.db.Pool, outbox.Config{Schema: b.db.Schema, Logger: logs.Logger(), LogInterval: interval,
		Clock: clocktest.New(time.Now().Add(40 * time.Second))})
	require.NoError(t, err)
	return b, doomed, survivor, logs
}

// sumOf adds up attribute name's values over lines.
func sumOf(t *testing.T, lines []string, name string) int {
	t.Helper()
	total := 0
	for _, line := range lines {
		m := regexp.MustCompile(`\b` + name + `=(\d+)`).FindStringSubmatch(line)
		require.NotNil(t, m, "no %s in %q", name, line)
		n, _ := strconv.Atoi(m[1])
		total += n
	}
	return total
}

// A member that froze holding 20 batches is taken over by another
// instance, and then resumes: the takeover and the lost batches are each
// logged once (WARN, with their count) however many batches there were,
// not once a batch; the next record, after the log interval, says how
// many were left out and counts them.
func TestFrozenMemberTakeoverLoggedRateLimited(t *testing.T) {
	t.Parallel()
	const interval = 3 * time.Second
	b, client, later, logs := takeoverBundle(t, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: outbox.Counter,
		Lease: 30 * time.Second}, interval)
	ctx := context.Background()
	frozen := newFreezer()
	doomed := b.newGroup(t, "g", func(c *consumergroup.Config) {
		c.Client, c.InstanceID, c.BatchSize, c.Concurrency = client, "doomed", 1, 20
	})
	require.NoError(t, doomed.AddConsumer("m", frozen.handle, nil))
	start(t, doomed, consumergroup.FromNow())
	r := newRecorder()
	survivor := b.newGroup(t, "g", func(c *consumergroup.Config) { c.Client, c.InstanceID = later, "survivor" })
	require.NoError(t, survivor.AddConsumer("m", r.handler, nil))

	began := time.Now()
	b.sendRange(t, 0, 20)
	pgtest.Eventually(t, 10*time.Second, "the doomed member holds 20 batches", func() bool { return frozen.held.Load() == 20 })
	start(t, survivor, consumergroup.FromNow())
	pgtest.Eventually(t, 10*time.Second, "the survivor took the batches over", func() bool { return r.distinct() == 20 })
	frozen.thaw() // the frozen member resumes: its 20 batches are gone
	pgtest.Eventually(t, 10*time.Second, "the doomed member finished", func() bool { return frozen.held.Load() == 0 })
	pgtest.Eventually(t, 5*time.Second, "the lost batches logged", func() bool { return len(logs.Lines(lostLease)) > 0 })
	require.Less(t, time.Since(began), interval, "the first round outlasted the log interval; the test proves nothing")
	require.Len(t, logs.Lines("level=WARN", tookOver, "instance=survivor"), 1, "one record for 20 takeovers:\n%s", logs.String())
	require.Len(t, logs.Lines("level=WARN", lostLease, "instance=doomed"), 1, "one record for 20 lost batches:\n%s", logs.String())

	// After the interval, one more of each: its record counts what was
	// left out.
	time.Sleep(interval) // past the interval of every record so far
	require.NoError(t, survivor.Stop(ctx))
	frozen.freeze()
	b.send(t, 20)
	pgtest.Eventually(t, 10*time.Second, "the doomed member holds the new batch", func() bool { return frozen.held.Load() == 1 })
	require.NoError(t, survivor.Start(ctx, consumergroup.FromNow()))
	pgtest.Eventually(t, 10*time.Second, "the survivor took it over", func() bool { return r.has(20) })
	frozen.thaw()
	pgtest.Eventually(t, 5*time.Second, "the lost batch logged", func() bool { return len(logs.Lines(lostLease)) == 2 })

	took := logs.Lines("level=WARN", tookOver)
	require.Len(t, took, 2, logs.String())
	require.Equal(t, 21, sumOf(t, took, "messages"), "every message taken over is counted")
	require.Contains(t, took[1], "suppressed=")
	lost := logs.Lines("level=WARN", lostLease)
	require.Equal(t, 21, sumOf(t, lost, "batches"), "every lost batch is counted once")
	require.Contains(t, lost[1], "suppressed=")
	require.Zero(t, r.dups(), r.duplicates())
}

// Retry deliveries whose lease expired are taken back, and that is
// logged (WARN, with their count), for a group of an unordered topic
// (the messages failed once) and for one of an ordered topic (every
// delivery is one).
func TestRetryTakeoverLogged(t *testing.T) {
	for _, ordered := range []bool{false, true} {
		t.Run("ordered="+strconv.FormatBool(ordered), func(t *testing.T) {
			t.Parallel()
			b, client, later, logs := takeoverBundle(t, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: outbox.Offset,
				Lease: 30 * time.Second, Ordered: ordered}, time.Minute)
			frozen := newFreezer()
			var first sync.Map
			doomed := b.newGroup(t, "g", func(c *consumergroup.Config) { c.Client, c.InstanceID = client, "doomed" })
			require.NoError(t, doomed.AddConsumer("m", func(ctx context.Context, d *outbox.Delivery) error {
				if _, seen := first.LoadOrStore(d.ID, true); !seen && !ordered {
					return outbox.RetryAfter(0, errors.New("once")) // its next delivery is a retry delivery
				}
				return frozen.handle(ctx, d)
			}, nil))
			start(t, doomed, consumergroup.FromNow())
			msgs := make([]outbox.Message, 5)
			for i := range msgs {
				msgs[i] = outbox.Message{Topic: b.topic, Payload: []byte(`{"seq":` + strconv.Itoa(i) + `}`), Group: "mg" + strconv.Itoa(i)}
			}
			_, err := b.producer.SendBatch(context.Background(), b.db.Pool, msgs)
			require.NoError(t, err)
			pgtest.Eventually(t, 10*time.Second, "the doomed member holds 5 retry deliveries", func() bool { return frozen.held.Load() == 5 })

			r := newRecorder()
			survivor := b.newGroup(t, "g", func(c *consumergroup.Config) { c.Client, c.InstanceID = later, "survivor" })
			require.NoError(t, survivor.AddConsumer("m", r.handler, nil))
			start(t, survivor, consumergroup.FromNow())
			pgtest.Eventually(t, 10*time.Second, "the survivor took them over", func() bool { return r.distinct() == 5 })
			frozen.thaw()
			took := logs.Lines("level=WARN", tookOver)
			require.Len(t, took, 1, logs.String())
			require.Equal(t, 5, sumOf(t, took, "messages"))
		})
	}
}
