package consumergroup_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/clocktest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// effects is a table a test's handlers write their effect to, one row
// per handling that committed.
type effects struct {
	b     *bundle
	table string
}

func newEffects(t *testing.T, b *bundle) *effects {
	t.Helper()
	e := &effects{b: b, table: b.db.Table("effects")}
	_, err := b.db.Pool.Exec(context.Background(), `CREATE TABLE `+e.table+` (message_id bigint NOT NULL, holder text NOT NULL)`)
	require.NoError(t, err)
	return e
}

// apply writes d's effect and acks it in g's name, in one transaction.
func (e *effects) apply(ctx context.Context, g *consumergroup.Group, d *outbox.Delivery, holder string) error {
	return pgx.BeginFunc(ctx, e.b.db.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO `+e.table+` VALUES ($1, $2)`, d.ID, holder); err != nil {
			return err
		}
		if err := g.AckTx(ctx, tx, d); err != nil {
			return err
		}
		var idle string
		if err := tx.QueryRow(ctx, `SHOW idle_in_transaction_session_timeout`).Scan(&idle); err != nil || idle != "10s" {
			return fmt.Errorf("the transaction's idle timeout after AckTx is %q (%v), not 10s", idle, err)
		}
		return nil
	})
}

// perMessage returns how many effects each message had, and by whom.
func (e *effects) perMessage(t *testing.T) (map[int64]int, map[string]int) {
	t.Helper()
	rows, err := e.b.db.Pool.Query(context.Background(), `SELECT message_id, holder FROM `+e.table)
	require.NoError(t, err)
	count, by := map[int64]int{}, map[string]int{}
	var id int64
	var holder string
	_, err = pgx.ForEachRow(rows, []any{&id, &holder}, func() error { count[id]++; by[holder]++; return nil })
	require.NoError(t, err)
	return count, by
}

// A handler whose lease ran out (its instance stopped renewing it, as a
// frozen process does) and whose messages another instance took over
// cannot ack them in its transaction: AckTx fails, its effect rolls back,
// and the other instance's effect is the only one. In every mode, for a
// message handled from its batch and for one handled as a retry.
func TestAckTxAfterTheLeaseWasLost(t *testing.T) {
	for _, mode := range modes {
		for _, asRetry := range []bool{false, true} {
			name := string(mode) + "/batch"
			if asRetry {
				name = string(mode) + "/retry"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				ackTxAfterTheLeaseWasLost(t, mode, asRetry)
			})
		}
	}
}

func ackTxAfterTheLeaseWasLost(t *testing.T, mode outbox.TrackingMode, asRetry bool) {
	const n = 5
	clock := clocktest.New(time.Now())
	b := setupTopic(t, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: mode,
		Lease: 30 * time.Second, BackoffInitial: time.Second, BackoffMax: time.Second})
	fx := newEffects(t, b)

	// The stale instance works through a pool the test closes: from then
	// on it neither renews its leases nor fetches, as a frozen process.
	// Its handler writes through another.
	keeperPool := pgtest.NewPool(t, b.db.DSN)
	var stale *consumergroup.Group
	stale = b.newGroupOn(t, keeperPool, "g", func(c *consumergroup.Config) {
		c.Clock, c.Concurrency, c.HeartbeatPool = clock, n, keeperPool
	})
	var holding sync.WaitGroup
	holding.Add(n)
	release := make(chan struct{})
	lost := make(chan error, n)
	require.NoError(t, stale.AddConsumer("m", func(ctx context.Context, d *outbox.Delivery) error {
		if asRetry && d.Attempt == 1 {
			return errors.New("first attempt fails")
		}
		holding.Done()
		<-release
		err := fx.apply(context.Background(), stale, d, "stale")
		lost <- err
		return err
	}, nil))
	start(t, stale, consumergroup.FromNow())
	b.sendRange(t, 0, n)
	if asRetry {
		pgtest.Eventually(t, 10*time.Second, "first attempts failed", func() bool {
			return b.countIn(t, "outbox_group_retries", "status = 'RETRY'") == n
		})
		clock.Advance(2 * time.Second) // past the backoff
	}
	holding.Wait()
	keeperPool.Close() // its leases are no longer renewed

	var survivor *consumergroup.Group
	survivor = b.newGroup(t, "g", func(c *consumergroup.Config) { c.Clock = clock })
	require.NoError(t, survivor.AddConsumer("m", func(ctx context.Context, d *outbox.Delivery) error {
		return fx.apply(ctx, survivor, d, "survivor")
	}, nil))
	start(t, survivor, consumergroup.FromNow())
	clock.Advance(31 * time.Second)
	pgtest.Eventually(t, 15*time.Second, "the survivor handled every message", func() bool {
		_, by := fx.perMessage(t)
		return by["survivor"] == n
	})

	close(release)
	for range n {
		require.ErrorIs(t, <-lost, outbox.ErrLeaseLost)
	}
	count, by := fx.perMessage(t)
	require.Len(t, count, n)
	for id, c := range count {
		require.Equal(t, 1, c, "message %d", id)
	}
	require.Zero(t, by["stale"])
	time.Sleep(200 * time.Millisecond) // the survivor sees no redelivery
	_, by = fx.perMessage(t)
	require.Equal(t, n, by["survivor"])
}

// Handlers of several instances ack in their transactions, in every mode
// and in an ordered group: every message has exactly one effect. A
// handler that rolls back after acking has its message redelivered; one
// that acked and committed, then returned an error anyway (or overran
// its timeout), has its message done: it is not redelivered. In Offset
// mode no record of the acks is left once their batches completed.
func TestHandlersAckInTheirTransactions(t *testing.T) {
	type variant struct {
		mode    outbox.TrackingMode
		ordered bool
	}
	variants := []variant{{outbox.Bitmap, false}, {outbox.Counter, false}, {outbox.Offset, false}, {outbox.Offset, true}}
	for _, v := range variants {
		name := string(v.mode)
		if v.ordered {
			name += "/ordered"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			handlersAckInTheirTransactions(t, v.mode, v.ordered)
		})
	}
}

func handlersAckInTheirTransactions(t *testing.T, mode outbox.TrackingMode, ordered bool) {
	const n = 600
	b := setupTopic(t, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: mode, Ordered: ordered,
		BackoffInitial: 10 * time.Millisecond, BackoffMax: 20 * time.Millisecond})
	fx := newEffects(t, b)
	var mu sync.Mutex
	calls := map[int64]int{}
	committedThenFailed := map[int64]bool{}
	var rolledBack atomic.Int64
	for i := range 3 {
		var g *consumergroup.Group
		g = b.newGroupOn(t, pgtest.NewPool(t, b.db.DSN), "g", func(c *consumergroup.Config) {
			c.Concurrency, c.BatchSize, c.HandlerTimeout = 4, 25, 5*time.Second
		})
		holder := string(rune('a' + i))
		require.NoError(t, g.AddConsumer("m", func(ctx context.Context, d *outbox.Delivery) error {
			p, err := outbox.Decode[seqPayload](d)
			if err != nil {
				return err
			}
			mu.Lock()
			calls[d.ID]++
			first := calls[d.ID] == 1
			mu.Unlock()
			switch {
			case first && p.Seq%37 == 0: // acks, then rolls back
				err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, `INSERT INTO `+fx.table+` VALUES ($1, $2)`, d.ID, holder); err != nil {
						return err
					}
					if err := g.AckTx(ctx, tx, d); err != nil {
						return err
					}
					return errors.New("a later step of the transaction failed")
				})
				rolledBack.Add(1)
				return err
			case first && p.Seq%50 == 0: // acks and commits, then fails anyway
				if err := fx.apply(ctx, g, d, holder); err != nil {
					return err
				}
				mu.Lock()
				committedThenFailed[d.ID] = true
				mu.Unlock()
				return errors.New("failed after the commit")
			}
			return fx.apply(ctx, g, d, holder)
		}, nil))
		start(t, g, consumergroup.FromNow())
	}
	b.sendRange(t, 0, n)
	pgtest.Eventually(t, 60*time.Second, "every message had its effect", func() bool {
		count, _ := fx.perMessage(t)
		return len(count) == n
	})
	time.Sleep(300 * time.Millisecond) // let any wrong redelivery happen
	count, _ := fx.perMessage(t)
	require.Len(t, count, n)
	for id, c := range count {
		require.Equal(t, 1, c, "message %d has %d effects", id, c)
	}
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, committedThenFailed)
	for id := range committedThenFailed {
		require.Equal(t, 1, calls[id], "message %d acked and committed, then failed: not redelivered", id)
	}
	require.Positive(t, rolledBack.Load())
	require.Zero(t, b.countIn(t, "outbox_group_retries", "true"), "nothing left to retry")
	if mode == outbox.Offset {
		pgtest.Eventually(t, 10*time.Second, "no per-message record left", func() bool {
			return b.countIn(t, "outbox_consumer_groups", "true") == 0
		})
	}
}

// AckTx refuses a nil transaction and a delivery its group did not hand
// out.
func TestAckTxRefusals(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Offset)
	ctx := context.Background()
	g := b.newGroup(t, "g")
	require.ErrorIs(t, g.AckTx(ctx, nil, &outbox.Delivery{ID: 1}), outbox.ErrNilExecutor)
	err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error { return g.AckTx(ctx, tx, &outbox.Delivery{ID: 1, Attempt: 1}) })
	require.ErrorIs(t, err, outbox.ErrLeaseLost, "not started")
}
