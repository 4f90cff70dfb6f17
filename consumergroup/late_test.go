package consumergroup_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// A group registers while 8 producers insert continuously. Every message
// whose required set names the group reaches it, every message it receives
// requires it, and cleanup never deletes one before it acked.
func TestRegistrationRace(t *testing.T) {
	for _, mode := range []outbox.TrackingMode{outbox.Bitmap, outbox.Counter} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			b := setup(t, mode)
			ctx := context.Background()
			require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: b.topic, Semantics: outbox.PubSub, Tracking: mode, Retention: time.Nanosecond}))
			first := newRecorder()
			g0 := b.newGroup(t, "early")
			require.NoError(t, g0.AddConsumer("m", first.handler, nil))
			start(t, g0, consumergroup.FromNow())

			stop := make(chan struct{})
			var sent atomic.Int64
			wg := b.produce(t, stop, func() func(int64) { return func(int64) { sent.Add(1) } })
			pgtest.Eventually(t, 5*time.Second, "producers running", func() bool { return sent.Load() > 200 })
			late := newRecorder()
			var handledIDs sync.Map
			g1 := b.newGroup(t, "late")
			require.NoError(t, g1.AddConsumer("m", func(ctx context.Context, d *outbox.Delivery) error {
				handledIDs.Store(d.ID, true)
				return late.handler(ctx, d)
			}, nil))
			start(t, g1, consumergroup.FromNow())
			cleanerDone := cleanUntil(g0, stop) // cleanup races the whole time too
			pgtest.Eventually(t, 5*time.Second, "more sends after registration", func() bool { return late.distinct() > 500 })
			close(stop)
			wg.Wait()
			<-cleanerDone

			sub := g1.Subscription()
			requires := "required_bits & " + fmt.Sprint(sub.Mask()) + " <> 0"
			if mode == outbox.Counter {
				requires = fmt.Sprint(sub.ID) + " = ANY(required_ids)"
			}
			var required int
			require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+b.db.Table("outbox_published")+` WHERE `+requires).Scan(&required))
			pgtest.Eventually(t, 20*time.Second, "late group got everything that requires it", func() bool {
				var left int
				require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+b.db.Table("outbox_published")+` WHERE `+requires+` AND NOT `+b.db.FinishedBy(sub.ID)).Scan(&left))
				return left == 0
			})
			// Every message it handled and that still exists requires it (none deleted before its ack).
			var notRequired int
			var ids []int64
			handledIDs.Range(func(k, _ any) bool { ids = append(ids, k.(int64)); return true })
			require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+b.db.Table("outbox_published")+` WHERE id = ANY($1) AND NOT (`+requires+`)`, ids).Scan(&notRequired))
			require.Zero(t, notRequired, "the late group received a message that does not require it")
			require.Zero(t, late.dups(), late.duplicates())
			t.Logf("%s: %d sent, %d required the late group (still present), %d handled by it", mode, sent.Load(), required, late.distinct())
		})
	}
}

func TestLateJoiners(t *testing.T) {
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			b := setup(t, mode)
			ctx := context.Background()
			early := newRecorder()
			g0 := b.newGroup(t, "early")
			require.NoError(t, g0.AddConsumer("m", early.handler, nil))
			start(t, g0, consumergroup.FromNow())
			var ids []int64
			for i := range 5 { // separate transactions: distinct created_at
				ids = append(ids, b.send(t, i)...)
				time.Sleep(2 * time.Millisecond)
			}
			pgtest.Eventually(t, 5*time.Second, "early group done", func() bool { return early.distinct() == 5 })
			var midTime time.Time
			require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT created_at FROM `+b.db.Table("outbox_published")+` WHERE id = $1`, ids[2]).Scan(&midTime))
			later := b.send(t, 5, 6) // one early-group message still unfinished below
			_ = later

			cases := []struct {
				name string
				opts consumergroup.SubscriptionOptions
				want int
			}{
				{"now", consumergroup.FromNow(), 0},
				{"beginning-no-backfill", consumergroup.FromBeginning(false), 7},
				{"beginning-backfill", consumergroup.FromBeginning(true), 7},
				{"timestamp", consumergroup.FromTimestamp(midTime), 5},
				{"message-id", consumergroup.FromMessageID(ids[3]), 4},
			}
			for _, c := range cases {
				r := newRecorder()
				g := b.newGroup(t, c.name)
				require.NoError(t, g.AddConsumer("m", r.handler, nil))
				start(t, g, c.opts)
				if c.want == 0 {
					time.Sleep(150 * time.Millisecond)
				} else {
					pgtest.Eventually(t, 10*time.Second, c.name, func() bool { return r.distinct() == c.want })
				}
				time.Sleep(50 * time.Millisecond)
				require.Equal(t, c.want, r.distinct(), c.name)
			}
		})
	}
}

// A backfill delivers the old messages still stored, oldest first, up to
// MaxBackfill, beside the new ones; without backfill a group that starts
// at the beginning reads them all, in one stream with the new ones.
func TestBackfillStopsAtMaxBackfill(t *testing.T) {
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			b := setup(t, mode)
			ctx := context.Background()
			gate := make(chan struct{})
			g0 := b.newGroup(t, "stuck")
			require.NoError(t, g0.AddConsumer("m", func(ctx context.Context, d *outbox.Delivery) error {
				select {
				case <-gate:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			}, nil))
			start(t, g0, consumergroup.FromNow())
			for i := range 4 { // one transaction each: in commit order
				b.send(t, i)
			}
			defer close(gate)

			with := newRecorder()
			gw := b.newGroup(t, "with-backfill")
			require.NoError(t, gw.AddConsumer("m", with.handler, nil))
			start(t, gw, consumergroup.SubscriptionOptions{Position: consumergroup.StartBeginning, Backfill: true, MaxBackfill: 3, BackfillBatchSize: 2})
			without := newRecorder()
			gn := b.newGroup(t, "without-backfill")
			require.NoError(t, gn.AddConsumer("m", without.handler, nil))
			start(t, gn, consumergroup.FromBeginning(false))
			b.send(t, 4)
			pgtest.Eventually(t, 10*time.Second, "both late groups", func() bool {
				return with.distinct() == 4 && without.distinct() == 5
			})
			time.Sleep(100 * time.Millisecond)
			require.Equal(t, 4, with.distinct(), "the three oldest, then the new one")
			for _, seq := range []int{0, 1, 2, 4} {
				require.True(t, with.has(seq), "seq %d", seq)
			}
			p, err := gw.BackfillProgress(ctx)
			require.NoError(t, err)
			require.Equal(t, consumergroup.BackfillCapped, p.Outcome)
			require.EqualValues(t, 3, p.Done)
			require.Zero(t, with.dups()+without.dups())
		})
	}
}

// A group is declared DEAD while 8 producers insert continuously and
// cleanup runs, in every mode: every message whose send returned before
// it died is kept for it (it owes it), every message whose send began
// after is deleted once the live group finished it, and when it comes
// back it receives each message it owes once.
func TestDeadWhileProducersRun(t *testing.T) {
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			b := setupTopic(t, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: mode,
				Retention: time.Nanosecond, ZeroSubscriptionRetention: time.Nanosecond, ZombieTTL: time.Hour})
			ctx := context.Background()
			live := newRecorder()
			g0 := b.startRecording(t, "live", live)
			b.subscribe(t, "dies")

			const before, during, after = 0, 1, 2
			var phase atomic.Int32
			var mu sync.Mutex
			sent := map[int32][]int64{}
			stop := make(chan struct{})
			wg := b.produce(t, stop, func() func(int64) {
				began := phase.Load()
				return func(id int64) {
					when := int32(during)
					if returned := phase.Load(); returned == before {
						when = before
					} else if began == after {
						when = after
					}
					mu.Lock()
					sent[when] = append(sent[when], id)
					mu.Unlock()
				}
			})
			cleanerDone := cleanUntil(g0, stop)
			count := func(when int32) int {
				mu.Lock()
				defer mu.Unlock()
				return len(sent[when])
			}
			pgtest.Eventually(t, 5*time.Second, "producers running", func() bool { return count(before) > 200 })
			phase.Store(during)
			b.makeDead(t, "dies")
			phase.Store(after)
			pgtest.Eventually(t, 5*time.Second, "more sends after it died", func() bool { return count(after) > 200 })
			close(stop)
			wg.Wait()
			<-cleanerDone

			mu.Lock()
			owed, later := sent[before], sent[after]
			total := len(sent[before]) + len(sent[during]) + len(sent[after])
			mu.Unlock()
			pgtest.Eventually(t, 20*time.Second, "the live group done", func() bool { return live.distinct() == total })
			pgtest.Eventually(t, 10*time.Second, "what was sent after it died deleted", func() bool {
				_, err := g0.Cleanup(ctx, 10_000)
				require.NoError(t, err)
				return b.count(t, "id = ANY($1)", later) == 0
			})
			require.Equal(t, len(owed), b.count(t, "id = ANY($1)", owed), "what it owes is kept for it")

			back := newRecorder()
			b.startRecording(t, "dies", back)
			pgtest.Eventually(t, 20*time.Second, "it receives what it owed", func() bool {
				return back.hasAll(owed)
			})
			require.Zero(t, back.dups(), back.duplicates())
			t.Logf("%s: %d sent before it died, %d while, %d after", mode, len(owed), total-len(owed)-len(later), len(later))
		})
	}
}

// produce runs 8 producers sending to b's topic, one message a
// transaction, until stop is closed; each calls sending before a send
// and what it returned with the message's id after. Wait for them with
// the WaitGroup it returns.
func (b *bundle) produce(t *testing.T, stop <-chan struct{}, sending func() func(id int64)) *sync.WaitGroup {
	var wg sync.WaitGroup
	for p := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				sent := sending()
				payload, _ := json.Marshal(seqPayload{Seq: p*1_000_000 + i})
				id, err := b.producer.Send(context.Background(), b.db.Pool, outbox.Message{Topic: b.topic, Payload: payload})
				if err != nil {
					t.Error(err)
					return
				}
				sent(id)
			}
		}()
	}
	return &wg
}

// cleanUntil runs g's cleanup every 5 ms until stop is closed, then
// closes the channel it returns.
func cleanUntil(g *consumergroup.Group, stop <-chan struct{}) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			_, _ = g.Cleanup(context.Background(), 500)
		}
	}()
	return done
}
