package notify_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox/internal/cfgcheck"
	"github.com/pgoutbox/pgoutbox/internal/notify"
	"github.com/pgoutbox/pgoutbox/internal/startstop/startstoptest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The listener's connection is killed over and over: each time it is back
// within the first backoff step, not after ever longer waits.
func TestReconnectBackoffStartsAfreshAfterEachConnection(t *testing.T) {
	t.Parallel()
	db := pgtest.NewEmptyDB(t)
	cfg, err := pgtest.ConnConfig(db.DSN)
	require.NoError(t, err)
	l := notify.New(cfg, "pgoutbox_test", slog.New(slog.DiscardHandler), notify.Probe{})
	wake, unsub := l.Subscribe("topic")
	defer unsub()
	require.NoError(t, l.Start(context.Background()))
	defer l.Stop(context.Background())
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
		// The first backoff step is 100 ms; a backoff that did not start
		// afresh would wait 3.2 s before the sixth reconnect and 6.4 s
		// before the seventh. The bound leaves room for a busy machine.
		require.Less(t, time.Since(killed), 3*time.Second, "outage %d lasted too long", i+1)
	}
}

// logLines collects log records' messages.
type logLines struct {
	mu   sync.Mutex
	msgs []string
}

func (l *logLines) Enabled(context.Context, slog.Level) bool { return true }
func (l *logLines) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, r.Level.String()+" "+r.Message)
	return nil
}
func (l *logLines) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logLines) WithGroup(string) slog.Handler      { return l }
func (l *logLines) has(prefix string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.msgs {
		if strings.HasPrefix(m, prefix) {
			return true
		}
	}
	return false
}

// The probe notices a LISTEN connection that receives nothing: one that
// goes through PgBouncer in transaction mode (the LISTEN succeeds on some
// server connection, which then goes back to the pool). A direct one
// passes.
func TestProbeDetectsADeadListenConnection(t *testing.T) {
	t.Parallel()
	db := pgtest.NewEmptyDB(t)
	send := func(ctx context.Context, channel, payload string) error {
		_, err := db.Pool.Exec(ctx, `SELECT pg_notify($1, $2)`, channel, payload)
		return err
	}
	listen := func(dsn string) *logLines {
		cfg, err := pgtest.ConnConfig(dsn)
		require.NoError(t, err)
		logs := &logLines{}
		l := notify.New(cfg, "pgoutbox_probe", slog.New(logs), notify.Probe{Interval: 200 * time.Millisecond, Send: send})
		require.NoError(t, l.Start(context.Background()))
		t.Cleanup(func() { _ = l.Stop(context.Background()) })
		return logs
	}
	pooled := listen(pgtest.PgBouncer(t, db) + "&default_query_exec_mode=simple_protocol")
	direct := listen(db.DSN)
	pgtest.Eventually(t, 5*time.Second, "the dead channel reported", func() bool {
		return pooled.has("ERROR pgoutbox: the LISTEN connection receives no notifications")
	})
	require.False(t, direct.has("ERROR"), "a direct LISTEN connection is healthy")
}

// A second Start starts nothing: one LISTEN connection, and Stop leaves no
// goroutine behind (the first Start's goroutines leaked).
func TestStartTwiceStartsOnce(t *testing.T) {
	db := pgtest.NewEmptyDB(t)
	leaks := goleak.IgnoreCurrent()
	cfg, err := pgtest.ConnConfig(db.DSN)
	require.NoError(t, err)
	cfg.RuntimeParams["application_name"] = "start-twice"
	l := notify.New(cfg, "pgoutbox_test", slog.New(slog.DiscardHandler), notify.Probe{})
	require.NoError(t, l.Start(context.Background()))
	require.ErrorIs(t, l.Start(context.Background()), cfgcheck.ErrAlreadyStarted)
	<-l.Ready()
	time.Sleep(100 * time.Millisecond) // a second listener would connect meanwhile
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_stat_activity WHERE application_name = 'start-twice'`).Scan(&n))
	require.Equal(t, 1, n)
	require.NoError(t, l.Stop(context.Background()))
	require.NoError(t, l.Stop(context.Background()))
	db.VerifyNoLeaks(t, leaks)
}

// The LISTEN connection started and stopped from ten goroutines at once
// never runs two connections and never hangs a Stop; it listens again
// after a restart.
func TestListenerStartStopStress(t *testing.T) {
	db := pgtest.NewEmptyDB(t)
	cfg, err := pgtest.ConnConfig(db.DSN)
	require.NoError(t, err)
	l := notify.New(cfg, "pgoutbox_test", slog.New(slog.DiscardHandler), notify.Probe{})
	startstoptest.Stress(t, l, 10)
	wake, unsub := l.Subscribe("topic")
	defer unsub()
	require.NoError(t, l.Start(context.Background()))
	defer l.Stop(context.Background())
	pgtest.Eventually(t, 10*time.Second, "a notification after a restart", func() bool {
		_, err := db.Pool.Exec(context.Background(), `SELECT pg_notify('pgoutbox_test', 'topic')`)
		require.NoError(t, err)
		select {
		case <-wake:
			return true
		case <-time.After(10 * time.Millisecond):
			return false
		}
	})
}
