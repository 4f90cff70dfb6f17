package engine

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// An instance's looks run on connections that are ready for them: on
// which the look's read of the log and the idle check have been prepared
// and planned (by Fetcher.readyConn). Planning a look's read
// takes 8–18 ms, once per connection (see sqlq's lockOffset), and a look
// that plans it holds back every message it finds by as much. Without
// readying, the first messages after a start waited for it (W4: the
// first message 41 ms), and so did the messages a look found on each
// connection the pool opened for other work later (W4: ten messages
// 6–28 ms late, once a run).
//
// So an instance readies a few connections as it starts (Warm), and a
// look that the pool hands a connection not ready for it takes another
// one while that one is readied in the background (LookConns.Acquire).

// warmConns is how many of the pool's connections an instance readies
// for its looks as it starts (see Warm): a look, the idle check and a
// completion can be at work at once, each on a connection of its own.
const warmConns = 3

// warmWait bounds how long Warm waits for the pool, and how long readying
// one connection may take: a start is never held back longer, and a busy
// pool is left to the work waiting for it.
const warmWait = time.Second

// LookConns hands an instance's looks connections from its pool, ready
// for them where the pool has one idle (see Acquire).
type LookConns struct {
	pool *pgxpool.Pool
	// key marks a connection ready for the looks' statements, in its
	// CustomData: a connection carries the mark for as long as it lives.
	key   string
	ready func(context.Context, *pgxpool.Conn) error // readies one connection
	ctx   context.Context                            // ends readying in the background
	slots chan struct{}                              // bounds readying in the background
	wg    sync.WaitGroup                             // readying in the background
}

// backgroundReadying bounds how many connections an instance readies in
// the background at once. Each is out of the pool while it is readied,
// for about as long as a look's planning takes.
const backgroundReadying = 2

// NewLookConns returns the looks' connections from pool, readied by
// ready and marked with key. Background readying ends with ctx; Wait
// waits for it.
func NewLookConns(ctx context.Context, pool *pgxpool.Pool, key string, ready func(context.Context, *pgxpool.Conn) error) *LookConns {
	return &LookConns{pool: pool, key: key, ready: ready, ctx: ctx, slots: make(chan struct{}, backgroundReadying)}
}

// Acquire takes a connection from the pool for a look. One the pool hands
// it that is not ready, while the pool has another idle, goes to be
// readied in the background, and Acquire takes the next: a few times at
// most, as the pool has idle ones and background readying has room.
// Otherwise the look takes it as it is and plans its statements there, as
// it would without readying; Acquire marks it ready. Acquire never waits
// for a readying, and never makes the pool open a connection it would not
// have opened for the look anyway.
func (c *LookConns) Acquire(ctx context.Context) (*pgxpool.Conn, error) {
	for {
		conn, err := c.pool.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		if c.isReady(conn) {
			return conn, nil
		}
		if c.pool.Stat().IdleConns() == 0 || !c.readyInBackground(conn) {
			c.markReady(conn) // the look at hand readies it
			return conn, nil
		}
	}
}

// readyInBackground readies conn and gives it back to the pool, in a
// goroutine of its own, if fewer than backgroundReadying are at work; it
// reports whether it took conn.
func (c *LookConns) readyInBackground(conn *pgxpool.Conn) bool {
	select {
	case c.slots <- struct{}{}:
	default:
		return false
	}
	c.wg.Go(func() {
		defer func() { <-c.slots }()
		c.readyNow(conn)
	})
	return true
}

// readyNow readies conn, marks it if that went through, and gives it back
// to the pool (which closes it if it was left in a transaction).
func (c *LookConns) readyNow(conn *pgxpool.Conn) {
	defer conn.Release()
	ctx, cancel := context.WithTimeout(c.ctx, warmWait)
	defer cancel()
	if c.ready(ctx, conn) == nil {
		c.markReady(conn)
	}
}

func (c *LookConns) isReady(conn *pgxpool.Conn) bool {
	return conn.Conn().PgConn().CustomData()[c.key] != nil
}

func (c *LookConns) markReady(conn *pgxpool.Conn) {
	conn.Conn().PgConn().CustomData()[c.key] = true
}

// Warm readies up to warmConns of the pool's connections at once, before
// the instance's first look. It takes no connection the pool does not
// have to spare (it leaves one free) and waits for the pool for warmWait
// at most.
func (c *LookConns) Warm() {
	ctx, cancel := context.WithTimeout(c.ctx, warmWait)
	defer cancel()
	s := c.pool.Stat()
	n := min(warmConns, int(s.MaxConns()-s.AcquiredConns())-1) // leave one to the others
	conns := make([]*pgxpool.Conn, 0, warmConns)
	for range n {
		conn, err := c.pool.Acquire(ctx)
		if err != nil {
			break
		}
		conns = append(conns, conn)
	}
	var wg sync.WaitGroup
	for _, conn := range conns {
		if c.isReady(conn) {
			conn.Release()
			continue
		}
		wg.Go(func() { c.readyNow(conn) })
	}
	wg.Wait()
}

// Wait waits for the connections being readied in the background.
func (c *LookConns) Wait() { c.wg.Wait() }
