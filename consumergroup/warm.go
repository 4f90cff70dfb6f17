package consumergroup

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/sqlq"
)

// warmConns is how many of the pool's connections an instance readies
// for its looks as it starts (see warm): a look, the idle check and a
// completion can be at work at once, each on a connection of its own.
const warmConns = 3

// warmWait bounds how long warm waits for the pool: a start is never
// held back longer, and a busy pool is left to the work waiting for it.
const warmWait = time.Second

// noSubscription is a subscription id no row has: warm's statements read
// nothing with it and lock nothing.
const noSubscription = int64(-1)

// warm readies up to warmConns of the pool's connections for the
// instance's looks before its first one: on each, in one round trip, a
// transaction that is rolled back runs the look's read of the log and the
// idle check once, for a subscription that does not exist, with the plan
// settings of a look (see genericPlans). The server then holds them
// prepared and planned on that connection. Planning a look's read takes
// 8–18 ms, once per connection (see sqlq's lockOffset), and the pool
// opens connections as work begins: without warm, the first messages
// after a start waited for both (W4: the first message 41 ms).
//
// It takes no connection the pool does not have to spare (it leaves one
// free), waits for the pool for warmWait at most, and leaves a connection
// whose statements fail as it is: that connection's first look plans
// them, as without warm.
func (r *runner) warm() {
	g := r.g
	ctx, cancel := context.WithTimeout(r.fetchCtx, warmWait)
	defer cancel()
	s := g.pool.Stat()
	n := min(warmConns, int(s.MaxConns()-s.AcquiredConns())-1) // leave one to the others
	conns := make([]*pgxpool.Conn, 0, warmConns)
	defer func() {
		for _, c := range conns {
			c.Release() // one left in its transaction is closed by the pool
		}
	}()
	for range n {
		c, err := g.pool.Acquire(ctx)
		if err != nil {
			break
		}
		conns = append(conns, c)
	}
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() { _ = r.warmConn(ctx, c) })
	}
	wg.Wait()
}

// warmConn runs warm's transaction on c.
func (r *runner) warmConn(ctx context.Context, c *pgxpool.Conn) error {
	g := r.g
	t := g.tracking()
	if t == nil {
		return nil
	}
	stream := t.stream
	var b pgx.Batch
	b.Queue("BEGIN")
	b.Queue(genericPlans)
	if r.readAhead(1) != nil {
		args := stream.bind(sqlq.Args{"sub": noSubscription, "topic": g.cfg.Topic, "limit": 1})
		b.Queue(g.q.FetchRowsAhead.Numbered, g.q.FetchRowsAhead.Bind(args)...)
	}
	args := stream.bind(sqlq.Args{"sub": noSubscription, "topic": g.cfg.Topic, "now": g.now()})
	b.Queue(g.q.AnyWork.Numbered, g.q.AnyWork.Bind(args)...)
	b.Queue("ROLLBACK")
	return c.SendBatch(ctx, &b).Close()
}
