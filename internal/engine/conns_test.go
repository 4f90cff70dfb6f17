package engine

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
)

// readyConnsFor returns LookConns over a pool of at most maxConns
// connections, whose readying records the server process of each
// connection it readied and first waits for release (closed unless the
// test holds it back).
func readyConnsFor(t *testing.T, maxConns int, release <-chan struct{}) (*LookConns, *pgxpool.Pool, *sync.Map) {
	t.Helper()
	db := pgtest.NewEmptyDB(t)
	pool := pgtest.NewPool(t, fmt.Sprintf("%s&pool_max_conns=%d", db.DSN, maxConns))
	var readied sync.Map
	c := NewLookConns(context.Background(), pool, "ready for the test", func(ctx context.Context, conn *pgxpool.Conn) error {
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
		_, err := conn.Exec(ctx, `SELECT 1`)
		readied.Store(conn.Conn().PgConn().PID(), true)
		return err
	})
	t.Cleanup(c.Wait)
	return c, pool, &readied
}

// openConns has pool open n connections and returns them, held: given
// back in order, the pool hands out the last one first.
func openConns(t *testing.T, pool *pgxpool.Pool, n int) []*pgxpool.Conn {
	t.Helper()
	conns := make([]*pgxpool.Conn, n)
	for i := range conns {
		c, err := pool.Acquire(context.Background())
		require.NoError(t, err)
		conns[i] = c
	}
	return conns
}

func pid(c *pgxpool.Conn) uint32 { return c.Conn().PgConn().PID() }

// A look that the pool hands a connection not ready for it runs on
// another, idle one that is, while the first is readied in the
// background; the first then comes back to the pool ready. Before, the
// look planned its statements on whatever connection the pool handed it
// (W4: ten messages 6–28 ms late on a connection the producers opened).
func TestALookTakesAReadyConnectionOverOneThatIsNot(t *testing.T) {
	t.Parallel()
	// The readying is held back until the look has its connection: done
	// first, it would give the cold connection back ready, and the look
	// could take it (rightly) before the other.
	released := make(chan struct{})
	c, pool, readied := readyConnsFor(t, 4, released)
	conns := openConns(t, pool, 2)
	ready, cold := conns[0], conns[1]
	c.markReady(ready)
	readyPID, coldPID := pid(ready), pid(cold)
	ready.Release()
	cold.Release() // the pool hands out the cold one first

	got, err := c.Acquire(context.Background())
	require.NoError(t, err)
	gotPID := pid(got)
	got.Release()
	close(released)
	require.Equal(t, readyPID, gotPID, "the look runs on the ready connection")

	c.Wait()
	_, ok := readied.Load(coldPID)
	require.True(t, ok, "the other connection was readied in the background")
	idle := pool.AcquireAllIdle(context.Background())
	defer func() {
		for _, conn := range idle {
			conn.Release()
		}
	}()
	require.Len(t, idle, 2)
	for _, conn := range idle {
		require.True(t, c.isReady(conn), "connection %d is back in the pool, ready", pid(conn))
	}
}

// A look never waits for a readying: with no other connection idle, or
// with background readying at its bound, it takes the connection it was
// handed as it is, and that connection counts as ready after the look.
func TestALookNeverWaitsForAConnectionToBeReadied(t *testing.T) {
	t.Parallel()
	t.Run("no other connection idle", func(t *testing.T) {
		c, _, readied := readyConnsFor(t, 1, nil) // a readying would never end
		got, err := c.Acquire(context.Background())
		require.NoError(t, err)
		defer got.Release()
		require.True(t, c.isReady(got), "the look readies the connection it runs on")
		_, ok := readied.Load(pid(got))
		require.False(t, ok, "nothing was readied in the background")
	})
	t.Run("background readying at its bound", func(t *testing.T) {
		release := make(chan struct{})
		c, pool, _ := readyConnsFor(t, backgroundReadying+3, release)
		defer close(release)
		conns := openConns(t, pool, backgroundReadying+2)
		pids := make([]uint32, len(conns))
		for i, conn := range conns {
			pids[i] = pid(conn)
			conn.Release() // the last opened is handed out first
		}
		got, err := c.Acquire(context.Background())
		require.NoError(t, err)
		defer got.Release()
		require.Equal(t, pids[1], pid(got), "after %d connections went to be readied, the look takes the next as it is", backgroundReadying)
		require.True(t, c.isReady(got))
	})
}
