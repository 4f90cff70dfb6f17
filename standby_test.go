package pgoutbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/childproc"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/router"
)

// standbyChildEnv, when set to a standbySpec (JSON), makes the test binary
// a process running a router on standby (see runStandbyChild).
const standbyChildEnv = "PGOUTBOX_STANDBY_CHILD"

// standbySpec is a process with a router on standby for "webhooks",
// delivering QUEUE topic hooks to Host, its calls carrying its Instance as
// their bearer token, so the receiver knows who called.
type standbySpec struct {
	DSN, Schema, Host, Instance string
}

func runStandbyChild(raw string) {
	var spec standbySpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ctx := context.Background()
	if err := startStandbyRouter(ctx, spec); err != nil {
		fmt.Fprintln(os.Stderr, "standby child:", err)
		os.Exit(2)
	}
	fmt.Println("ready")
	select {} // until killed
}

func startStandbyRouter(ctx context.Context, spec standbySpec) error {
	pool, err := pgxpool.New(ctx, spec.DSN)
	if err != nil {
		return err
	}
	client, err := pgoutbox.NewClient(ctx, pool, pgoutbox.Config{Schema: spec.Schema})
	if err != nil {
		return err
	}
	rt, err := client.NewRouter(router.Config{AllowedHosts: []string{spec.Host}, Tokens: map[string]string{spec.Host: spec.Instance},
		Pools: []router.PoolConfig{{Code: "P", Concurrency: 4}}}, pgoutbox.Standby("webhooks"))
	if err != nil {
		return err
	}
	src, err := router.NewQueueSource(router.QueueSourceConfig{Client: client.Outbox(), Topic: "hooks", PollInterval: 20 * time.Millisecond})
	if err != nil {
		return err
	}
	rt.AddSource(src)
	return client.Start(ctx)
}

// call is one request the receiver saw: who made it, when.
type call struct {
	by         string
	start, end time.Time
}

// callLog is a receiver that takes 20 ms a call and records each.
type callLog struct {
	mu    sync.Mutex
	calls []call
	ids   map[string]int
}

func (l *callLog) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c := call{by: strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "), start: time.Now()}
	select {
	case <-time.After(20 * time.Millisecond):
	case <-r.Context().Done(): // the caller gave up (it died, or stopped leading)
	}
	c.end = time.Now()
	l.mu.Lock()
	l.calls = append(l.calls, c)
	l.ids[r.Header.Get("X-Message-Id")]++
	l.mu.Unlock()
	w.WriteHeader(http.StatusOK)
}

func (l *callLog) snapshot() ([]call, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]call(nil), l.calls...), len(l.ids)
}

// Three processes run a router on standby for one name: one delivers, the
// others stand by. Killed, the leader is followed by another within 5 s;
// a leader whose session the server ends stops, and a leader follows; at
// no moment do two of them deliver (the receiver sees no call of one
// overlap a call of another); every message is delivered.
func TestStandbyRoutersDeliverOneAtATime(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	log := &callLog{ids: map[string]int{}}
	receiver := httptest.NewServer(log)
	t.Cleanup(receiver.Close)
	host := strings.TrimPrefix(receiver.URL, "http://")
	client, err := pgoutbox.NewClient(ctx, db.Pool, pgoutbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	require.NoError(t, client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "hooks", Semantics: outbox.Queue}))

	children := map[string]*childproc.Child{}
	for _, name := range []string{"a", "b", "c"} {
		children[name] = childproc.Start(t, standbyChildEnv, standbySpec{DSN: db.DSN, Schema: db.Schema, Host: host, Instance: name})
	}
	sent := 0
	send := func(n int) {
		for range n {
			msg, err := outbox.NewMessage("hooks", map[string]int{"n": sent})
			require.NoError(t, err)
			msg.Headers = map[string]string{router.HeaderPool: "P", router.HeaderTarget: receiver.URL + "/hook"}
			_, err = client.Send(ctx, db.Pool, msg)
			require.NoError(t, err)
			sent++
		}
	}
	// A steady stream, 50 a second, while the leader is found and killed.
	stopSending := make(chan struct{})
	sending := make(chan struct{})
	go func() {
		defer close(sending)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopSending:
				return
			case <-tick.C:
				send(1)
			}
		}
	}()
	var first string
	pgtest.Eventually(t, 30*time.Second, "a leader delivers", func() bool {
		calls, _ := log.snapshot()
		if len(calls) > 0 {
			first = calls[0].by
		}
		return first != ""
	})
	time.Sleep(time.Second) // the leader at work
	killed := time.Now()
	children[first].Kill()
	<-children[first].Exited()
	var next call
	pgtest.Eventually(t, 30*time.Second, "another leader delivers", func() bool {
		calls, _ := log.snapshot()
		for _, c := range calls {
			if c.by != first && c.start.After(killed) {
				next = c
				return true
			}
		}
		return false
	})
	took := next.start.Sub(killed)
	t.Logf("%s killed; %s delivered %s later", first, next.by, took.Round(time.Millisecond))
	require.Less(t, took, 5*time.Second, "the next leader delivers within 5 s of the kill")
	time.Sleep(time.Second)

	// The server ends the new leader's session under it (an operator's
	// pg_terminate_backend, a restart): it stops delivering at once, and
	// a leader (it again, or the other) follows.
	var ended int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_locks
		WHERE locktype = 'advisory' AND classid = 1885826915 AND granted
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&ended))
	require.Equal(t, 1, ended, "one session holds the leadership")
	terminated := time.Now()
	pgtest.Eventually(t, 30*time.Second, "a leader delivers again", func() bool {
		calls, _ := log.snapshot()
		for _, c := range calls {
			if c.start.After(terminated.Add(500 * time.Millisecond)) {
				return true
			}
		}
		return false
	})
	time.Sleep(time.Second)
	close(stopSending)
	<-sending

	pgtest.Eventually(t, 60*time.Second, "every message delivered", func() bool {
		_, ids := log.snapshot()
		return ids == sent
	})
	calls, _ := log.snapshot()
	sort.Slice(calls, func(i, j int) bool { return calls[i].start.Before(calls[j].start) })
	leaders := map[string]bool{}
	var lastEnd = map[string]time.Time{}
	for _, c := range calls {
		leaders[c.by] = true
		for by, end := range lastEnd {
			require.False(t, by != c.by && end.After(c.start),
				"%s called at %s while %s's call ran until %s: two leaders delivering", c.by, c.start.Format(time.StampMicro), by, end.Format(time.StampMicro))
		}
		if c.end.After(lastEnd[c.by]) {
			lastEnd[c.by] = c.end
		}
	}
	require.LessOrEqual(t, len(leaders), 3)
	require.True(t, leaders[next.by])
}

// A router on standby needs a session of its own: a client without one
// (PollOnly) is refused, with a typed error.
func TestStandbyNeedsASessionOfItsOwn(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	client, err := pgoutbox.NewClient(context.Background(), db.Pool, pgoutbox.Config{Schema: db.Schema, PollOnly: true})
	require.NoError(t, err)
	_, err = client.NewRouter(router.Config{AllowedHosts: []string{"127.0.0.1"}}, pgoutbox.Standby("webhooks"))
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
}

// The health report says which of two clients' routers on standby leads
// and which stands by, both ready; once the leader's client stops, the
// other leads.
func TestStandbyHealth(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	start := func() *pgoutbox.Client { return startStandby(t, db) }
	standby := func(c *pgoutbox.Client) pgoutbox.StandbyHealth { return standbyHealth(t, c) }
	a, b := start(), start()
	pgtest.Eventually(t, 30*time.Second, "one leads", func() bool { return standby(a).Leading || standby(b).Leading })
	leader, other := a, b
	if standby(b).Leading {
		leader, other = b, a
	}
	require.False(t, standby(other).Leading, "one leader")
	require.Equal(t, "webhooks", standby(other).Name)
	adm, err := admin.New(a.Outbox(), admin.Options{})
	require.NoError(t, err)
	pgtest.Eventually(t, 10*time.Second, "the leader shown to operators", func() bool {
		routers, err := adm.Routers(ctx)
		require.NoError(t, err)
		return len(routers) == 1 && routers[0].Name == "webhooks" && routers[0].Leader != nil &&
			strings.HasSuffix(routers[0].Leader.Instance, fmt.Sprintf(":%d", os.Getpid()))
	})
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, leader.Stop(stopCtx))
	pgtest.Eventually(t, 10*time.Second, "the other leads", func() bool { return standby(other).Leading })
}

// A name is elected within its schema: routers of one name in two
// schemas of one database (two installations) each have a leader.
func TestStandbyNamesArePerSchema(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	other := *db
	other.Schema = "pgoutbox_other"
	require.NoError(t, migrations.Up(context.Background(), db.Pool, migrations.Config{Schema: other.Schema, Logger: slog.New(slog.DiscardHandler)}))
	a, b := startStandby(t, db), startStandby(t, &other)
	pgtest.Eventually(t, 30*time.Second, "each schema's router leads", func() bool {
		return standbyHealth(t, a).Leading && standbyHealth(t, b).Leading
	})
}

// startStandby starts a client in db's schema with a router on standby
// for "webhooks" that reads QUEUE topic "hooks".
func startStandby(t *testing.T, db *pgtest.DB) *pgoutbox.Client {
	t.Helper()
	ctx := context.Background()
	client, err := pgoutbox.NewClient(ctx, db.Pool, pgoutbox.Config{Schema: db.Schema, NoMaintenance: true})
	require.NoError(t, err)
	rt, err := client.NewRouter(router.Config{AllowedHosts: []string{"127.0.0.1"}}, pgoutbox.Standby("webhooks"))
	require.NoError(t, err)
	src, err := router.NewQueueSource(router.QueueSourceConfig{Client: client.Outbox(), Topic: "hooks"})
	require.NoError(t, err)
	rt.AddSource(src)
	require.NoError(t, client.Start(ctx))
	t.Cleanup(func() { _ = client.Stop(context.Background()) })
	return client
}

// standbyHealth is the health report of c's router on standby.
func standbyHealth(t *testing.T, c *pgoutbox.Client) pgoutbox.StandbyHealth {
	t.Helper()
	h := c.Health(context.Background())
	require.True(t, h.Ready, "%v", h.Problems)
	for _, comp := range h.Components {
		if comp.Standby != nil {
			return *comp.Standby
		}
	}
	t.Fatal("no router on standby in the report")
	return pgoutbox.StandbyHealth{}
}

// Through a transaction pooler a router on standby finds no session of
// its own: it never leads, and the health report says why.
func TestStandbyThroughATransactionPooler(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	pooled := pgtest.NewPool(t, pgtest.PgBouncer(t, db)+"&default_query_exec_mode=simple_protocol")
	client, err := pgoutbox.NewClient(ctx, pooled, pgoutbox.Config{Schema: db.Schema, NoMaintenance: true})
	require.NoError(t, err)
	_, err = client.NewRouter(router.Config{AllowedHosts: []string{"127.0.0.1"}}, pgoutbox.Standby("webhooks"))
	require.NoError(t, err)
	require.NoError(t, client.Start(ctx))
	t.Cleanup(func() { _ = client.Stop(context.Background()) })
	pgtest.Eventually(t, 30*time.Second, "a warning that it cannot lead", func() bool {
		for _, w := range client.Health(ctx).Warnings {
			if strings.Contains(w, "stands by and cannot lead") && strings.Contains(w, "not a session of its own") {
				return true
			}
		}
		return false
	})
	for _, comp := range client.Health(ctx).Components {
		if comp.Standby != nil {
			require.False(t, comp.Standby.Leading)
		}
	}
}
