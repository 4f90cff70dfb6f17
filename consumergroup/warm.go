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
// settings of a look (see sqlq's LookPlanning). The server then holds them
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
	if g.tracking() == nil {
		return
	}
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
		wg.Go(func() { r.warmConn(ctx, c) })
	}
	wg.Wait()
}

// warmConn runs warm's transaction on c; a failure leaves c as it was.
func (r *runner) warmConn(ctx context.Context, c *pgxpool.Conn) {
	g := r.g
	var b pgx.Batch
	b.Queue("BEGIN")
	b.Queue(sqlq.LookPlanning)
	if ahead := r.readAhead(1); ahead != nil { // the look's own arguments, for no subscription
		ahead.args["sub"] = noSubscription
		b.Queue(g.q.FetchRowsAhead.Numbered, g.q.FetchRowsAhead.Bind(ahead.args)...)
	}
	b.Queue(g.q.AnyWork.Numbered, g.q.AnyWork.Bind(r.anyWorkArgs(noSubscription))...)
	b.Queue("ROLLBACK")
	_ = c.SendBatch(ctx, &b).Close()
}
