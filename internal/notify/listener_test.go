package notify_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/internal/notify"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The listener's connection is killed over and over: each time it is back
// within the first backoff step, not after ever longer waits.
func TestReconnectBackoffStartsAfreshAfterEachConnection(t *testing.T) {
	t.Parallel()
	db := pgtest.NewEmptyDB(t)
	cfg, err := pgx.ParseConfig(db.DSN)
	require.NoError(t, err)
	l := notify.New(cfg, "pgoutbox_test", slog.New(slog.DiscardHandler))
	wake, unsub := l.Subscribe("topic")
	defer unsub()
	l.Start()
	defer l.Stop()
	<-l.Ready()
	ctx := context.Background()
	drain := func() {
		for {
			select {
			case <-wake:
			default:
				return
			}
		}
	}
	for i := range 7 {
		var pid int
		pgtest.Eventually(t, 5*time.Second, "the listener's connection", func() bool {
			err := db.Pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity
WHERE datname = current_database() AND query LIKE 'LISTEN%' AND state = 'idle'`).Scan(&pid)
			return err == nil
		})
		drain()
		killed := time.Now()
		_, err := db.Pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid)
		require.NoError(t, err)
		select {
		case <-wake: // every subscriber is woken after a reconnect
		case <-time.After(5 * time.Second):
			t.Fatalf("outage %d: not back listening after 5s", i+1)
		}
		require.Less(t, time.Since(killed), time.Second, "outage %d lasted too long", i+1)
	}
}
