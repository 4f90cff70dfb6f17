package inbox_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// statementCounter counts the statements a pool sends (BEGIN and COMMIT
// included).
type statementCounter struct{ n atomic.Int64 }

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (*statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// BenchmarkInboxRedeliveries handles a stream where 1% of deliveries are
// redeliveries of a message handled earlier, with and without the Bloom
// filter, and reports the statements each delivery cost (the handler's
// own writes left out: it does none).
//
//	go test -run '^$' -bench BenchmarkInboxRedeliveries -benchtime 20000x ./inbox
func BenchmarkInboxRedeliveries(b *testing.B) {
	db := pgtest.NewDB(b)
	for _, noFilter := range []bool{false, true} {
		name := "filter"
		if noFilter {
			name = "no-filter"
		}
		b.Run(name, func(b *testing.B) {
			counter := &statementCounter{}
			cfg, err := pgxpool.ParseConfig(db.DSN)
			require.NoError(b, err)
			cfg.ConnConfig.Tracer = counter
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			require.NoError(b, err)
			defer pool.Close()
			ctx := context.Background()
			in, err := inbox.New(ctx, pool, inbox.Config{Name: fmt.Sprintf("bench-%s-%d", name, b.N), Schema: db.Schema, NoFilter: noFilter})
			require.NoError(b, err)
			noop := func(context.Context, pgx.Tx, *outbox.Delivery) error { return nil }
			rng := rand.New(rand.NewPCG(1, 2))
			var next int64
			counter.n.Store(0)
			b.ResetTimer()
			for range b.N {
				id := next + 1
				if next > 0 && rng.IntN(100) == 0 {
					id = 1 + rng.Int64N(next) // a redelivery
				} else {
					next++
				}
				if _, err := in.Handle(ctx, &outbox.Delivery{ID: id, Attempt: 1}, noop); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			s := in.Stats()
			b.ReportMetric(float64(counter.n.Load())/float64(b.N), "stmts/delivery")
			b.ReportMetric(float64(s.Lookups)/float64(b.N), "lookups/delivery")
			b.ReportMetric(float64(s.Duplicates)/float64(b.N)*100, "%dup")
		})
	}
}
