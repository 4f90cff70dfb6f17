package consumergroup_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// Producers hold their transactions open for random times, so commit order
// differs from id order; groups fetch the whole time. Every group, in every
// mode, receives every committed message (and none rolled back). An
// `id > cursor` reader loses messages here.
func TestNoLossOnOutOfOrderCommits(t *testing.T) {
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			b := setup(t, mode)
			ctx := context.Background()
			recs := []*recorder{newRecorder(), newRecorder()}
			for i, r := range recs {
				g := b.newGroup(t, fmt.Sprintf("g%d", i), func(c *consumergroup.Config) {
					c.PollInterval = 5 * time.Millisecond
					c.BatchSize = 7 // small batches: many snapshot pairs and resume points
				})
				require.NoError(t, g.AddConsumer("m", r.handler, nil))
				start(t, g, consumergroup.FromNow())
			}

			const producers, perProducer = 8, 60
			var mu sync.Mutex
			committed := map[int]bool{}
			rolledBack := map[int]bool{}
			var wg sync.WaitGroup
			for p := range producers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range perProducer {
						seq := p*perProducer + i
						tx, err := b.db.Pool.Begin(ctx)
						if err != nil {
							t.Error(err)
							return
						}
						payload, _ := json.Marshal(seqPayload{Seq: seq})
						if _, err := b.producer.Send(ctx, tx, outbox.Message{Topic: b.topic, Payload: payload}); err != nil {
							t.Error(err)
							return
						}
						time.Sleep(time.Duration(rand.IntN(30)) * time.Millisecond) // hold the id uncommitted
						mu.Lock()
						if rand.IntN(10) == 0 {
							rolledBack[seq] = true
							mu.Unlock()
							_ = tx.Rollback(ctx)
							continue
						}
						mu.Unlock()
						if err := tx.Commit(ctx); err != nil {
							t.Error(err)
							return
						}
						mu.Lock()
						committed[seq] = true
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			require.NotEmpty(t, rolledBack)
			for i, r := range recs {
				pgtest.Eventually(t, 30*time.Second, fmt.Sprintf("group %d got every committed message", i), func() bool {
					return r.distinct() >= len(committed)
				})
				time.Sleep(50 * time.Millisecond)
				for seq := range committed {
					require.True(t, r.has(seq), "group %d lost message %d", i, seq)
				}
				for seq := range rolledBack {
					require.False(t, r.has(seq), "group %d got rolled-back message %d", i, seq)
				}
				require.Equal(t, len(committed), r.distinct())
				require.Zero(t, r.dups(), r.duplicates())
			}
		})
	}
}

// A transaction left open for the whole test (holding an xid, as a slow
// batch job elsewhere in the database would) does not stop delivery of
// messages committed after it began.
func TestNoGlobalStallFromOpenTransaction(t *testing.T) {
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			b := setup(t, mode)
			ctx := context.Background()
			r := newRecorder()
			g := b.newGroup(t, "g")
			require.NoError(t, g.AddConsumer("m", r.handler, nil))
			start(t, g, consumergroup.FromNow())

			blocker, err := b.db.Pool.Begin(ctx)
			require.NoError(t, err)
			defer blocker.Rollback(ctx)
			var xid string
			require.NoError(t, blocker.QueryRow(ctx, `SELECT pg_current_xact_id()::text`).Scan(&xid)) // takes an xid

			// It even wrote a message of the topic that stays uncommitted.
			_, err = b.producer.Send(ctx, blocker, outbox.Message{Topic: b.topic, Payload: []byte(`{"seq":-1}`)})
			require.NoError(t, err)
			for i := range 50 {
				b.send(t, i)
			}
			pgtest.Eventually(t, 10*time.Second, "messages after the open transaction delivered", func() bool { return r.distinct() == 50 })
			var stillOpen bool
			require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT pg_xact_status($1::xid8) = 'in progress'`, xid).Scan(&stillOpen))
			require.True(t, stillOpen)
		})
	}
}

// A snapshot pair read in several batches is read in xid order, as a
// number: a pair whose transaction ids cross a power of ten (999999 →
// 1000000, or 99 → 100 on a young server) once sorted its rows as text, so a batch's last row was not its
// greatest and the next batch resumed from the wrong place, delivering
// some rows twice or skipping others for good.
func TestPairCrossingAPowerOfTenInXids(t *testing.T) {
	cases := []struct {
		name         string
		below, above int // rows with six- and seven-digit xids
	}{
		{"fewer rows above the boundary than a batch", 5, 3}, // redelivered 3 rows
		{"a whole batch above the boundary", 2, 7},           // skipped 2 rows
	}
	for _, mode := range modes {
		for _, c := range cases {
			t.Run(string(mode)+"/"+c.name, func(t *testing.T) {
				t.Parallel()
				b := setup(t, mode)
				ctx := context.Background()
				cfg := func(c *consumergroup.Config) { c.BatchSize = 7; c.Concurrency = 1 }

				// The group is registered, then stopped: the messages
				// require it and wait for it.
				first := b.newGroup(t, "g", cfg)
				require.NoError(t, first.AddConsumer("m", newRecorder().handler, nil))
				start(t, first, consumergroup.FromNow())
				require.NoError(t, first.Stop(ctx))
				seqs := make([]int, c.below+c.above)
				for i := range seqs {
					seqs[i] = i
				}
				ids := b.send(t, seqs...)

				// Give the rows xids on both sides of a power of ten, and
				// move the group's position back before them: its next pair
				// holds all of them, more than one batch.
				xids, position := pgtest.XidsAcrossPowerOfTen(t, b.db.Pool, c.below, c.above)
				for i, id := range ids {
					_, err := b.db.Pool.Exec(ctx, `UPDATE `+b.db.Table("outbox_published")+` SET xid = $2::xid8 WHERE id = $1`, id, xids[i])
					require.NoError(t, err)
				}
				_, err := b.db.Pool.Exec(ctx, `UPDATE `+b.db.Table("outbox_subscription_offsets")+`
SET position = $1::pg_snapshot, pair_cur = NULL, resume_xid = NULL, resume_id = NULL`, position)
				require.NoError(t, err)

				r := newRecorder()
				second := b.newGroup(t, "g", cfg)
				require.NoError(t, second.AddConsumer("m", r.handler, nil))
				start(t, second, consumergroup.FromNow())
				pgtest.Eventually(t, 10*time.Second, "every message delivered", func() bool { return r.distinct() == len(ids) })
				time.Sleep(100 * time.Millisecond) // a redelivery would come at once
				require.Zero(t, r.dups(), r.duplicates())
			})
		}
	}
}
