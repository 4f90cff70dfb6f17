package pgtest

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/pgfind"
)

// smallServer starts a server of its own with room for maxConns
// connections, all of them for the tests (none reserved), stopped when the
// test ends: from the local PostgreSQL binaries, else in Docker.
func smallServer(tb testing.TB, maxConns int) string {
	tb.Helper()
	settings := []string{
		"max_connections=" + strconv.Itoa(maxConns),
		"superuser_reserved_connections=0",
		"max_wal_senders=0",
	}
	ctx := context.Background()
	s, err := pgfind.StartCluster(ctx, settings...)
	if err == nil {
		tb.Cleanup(s.Stop)
		return s.AdminDSN
	}
	s, stop, cerr := startContainer(ctx, settings...)
	if cerr != nil {
		tb.Fatalf("pgtest: a server of the test's own: %v\n  testcontainers: %v", err, cerr)
	}
	tb.Cleanup(stop)
	return s.AdminDSN
}

// fill takes every free connection slot of the server at dsn (plain pgx
// connections, which do not wait) and returns them: the server refused
// the next one with SQLSTATE 53300. It first waits for the connections of
// an earlier test to be gone, so that none of their slots frees later.
func fill(tb testing.TB, dsn string) []*pgx.Conn {
	tb.Helper()
	ctx := context.Background()
	var held []*pgx.Conn
	tb.Cleanup(func() {
		for _, c := range held {
			c.Close(context.Background())
		}
	})
	var first *pgx.Conn
	Eventually(tb, time.Minute, "the earlier connections gone", func() bool {
		if first == nil {
			c, err := pgx.Connect(ctx, dsn)
			if err != nil && !pgfind.TooManyConnections(err) {
				tb.Fatalf("filling the server: %v", err)
			}
			if first = c; first == nil {
				return false
			}
			held = append(held, first)
		}
		var n int
		err := first.QueryRow(ctx, `SELECT count(*) FROM pg_catalog.pg_stat_activity WHERE backend_type = 'client backend'`).Scan(&n)
		return err == nil && n == 1
	})
	for {
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			if !pgfind.TooManyConnections(err) {
				tb.Fatalf("filling the server: %v", err)
			}
			return held
		}
		held = append(held, c)
	}
}

// A connection the server refuses for want of a free slot ("sorry, too
// many clients already") waits, holding no slot, and gets in once one
// frees: through a harness pool, a pool made from a copy of its
// configuration (as pgoutbox makes heartbeat pools from a caller's pool)
// and a connection made from its connection settings (as pgoutbox makes
// its LISTEN connection).
func TestAConnectionWaitsForAFreeSlot(t *testing.T) {
	dsn := smallServer(t, 4)
	cases := map[string]func(ctx context.Context, base *pgxpool.Pool) error{
		"pool": func(ctx context.Context, base *pgxpool.Pool) error {
			_, err := base.Exec(ctx, `SELECT 1`)
			return err
		},
		"pool from a copy of its configuration": func(ctx context.Context, base *pgxpool.Pool) error {
			p, err := pgxpool.NewWithConfig(ctx, base.Config().Copy())
			if err != nil {
				return err
			}
			defer p.Close()
			_, err = p.Exec(ctx, `SELECT 1`)
			return err
		},
		"connection from its connection settings": func(ctx context.Context, base *pgxpool.Pool) error {
			c, err := pgx.ConnectConfig(ctx, base.Config().ConnConfig)
			if err != nil {
				return err
			}
			defer c.Close(ctx)
			_, err = c.Exec(ctx, `SELECT 1`)
			return err
		},
	}
	for name, use := range cases {
		t.Run(name, func(t *testing.T) {
			base := NewPool(t, dsn) // no connection yet: the first use opens one
			held := fill(t, dsn)
			done := make(chan error, 1)
			go func() { done <- use(context.Background(), base) }()
			select {
			case err := <-done:
				t.Fatalf("connected to a full server at once: %v", err)
			case <-time.After(500 * time.Millisecond):
			}
			held[0].Close(context.Background()) // a slot frees
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("after a slot freed: %v", err)
				}
			case <-time.After(time.Minute):
				t.Fatal("still waiting a minute after a slot freed")
			}
		})
	}
}

// A connect whose context ends while it waits for a slot stops waiting.
func TestAWaitingConnectStopsWithItsContext(t *testing.T) {
	dsn := smallServer(t, 2)
	fill(t, dsn)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		c, err := connect(ctx, dsn)
		if err == nil {
			c.Close(context.Background())
		}
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) && !pgfind.TooManyConnections(err) {
			t.Fatalf("connect on a full server with a 300ms context: %v, want the refusal or the context's end", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("still waiting a minute after its context ended")
	}
}

// connectWithin connects to dsn counting the connection against b.
func connectWithin(ctx context.Context, dsn string, b *budget) (*pgx.Conn, error) {
	cfg, err := ConnConfig(dsn)
	if err != nil {
		return nil, err
	}
	shareServer(&cfg.Config, b)
	return pgx.ConnectConfig(ctx, cfg)
}

// The process's connections to the server stay within its budget: one
// more waits until one of them closes.
func TestConnectionsStayWithinTheBudget(t *testing.T) {
	s := find(t)
	b, err := newBudget(s.AdminDSN, 2, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	open := func() (*pgx.Conn, error) { return connectWithin(context.Background(), s.AdminDSN, b) }
	var held []*pgx.Conn
	t.Cleanup(func() {
		for _, c := range held {
			c.Close(context.Background())
		}
	})
	for range 2 {
		c, err := open()
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	third := make(chan *pgx.Conn, 1)
	go func() {
		c, err := open()
		if err != nil {
			t.Error(err)
		}
		third <- c
	}()
	select {
	case c := <-third:
		held = append(held, c)
		t.Fatal("a third connection opened on a budget of two")
	case <-time.After(500 * time.Millisecond):
	}
	if err := held[0].Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-third:
		held = append(held, c)
	case <-time.After(time.Minute):
		t.Fatal("the third connection still waits a minute after another closed")
	}
	if n := len(b.slots); n != 2 {
		t.Errorf("budget counts %d open connections, want 2", n)
	}
}

// A connection that waited its patience for room in the budget goes ahead
// anyway: tests that each hold connections while they wait for more do
// not block each other forever.
func TestAConnectionGoesOverBudgetAfterWaiting(t *testing.T) {
	s := find(t)
	b, err := newBudget(s.AdminDSN, 1, 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	done := make(chan error, 1)
	go func() {
		for range 3 { // the first takes the budget, the others go over it
			c, err := connectWithin(ctx, s.AdminDSN, b)
			if err != nil {
				done <- err
				return
			}
			t.Cleanup(func() { c.Close(ctx) })
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("connections over the budget still wait after a minute")
	}
}

// The budget is the server's free connection slots less a margin for
// everybody else: connections somebody else holds lower it.
func TestTheBudgetIsWhatTheServerHasFree(t *testing.T) {
	dsn := smallServer(t, 20)
	ctx := context.Background()
	before, err := readBudget(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(ctx) })
	}
	after, err := readBudget(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	if before >= 20 || before-after != 5 {
		t.Errorf("budget %d of max_connections 20, then %d with 5 connections held; want below 20, then 5 less", before, after)
	}
}

// A server that is full when the tests start is found all the same: its
// connections wait for a slot.
func TestAFullServerIsFound(t *testing.T) {
	dsn := smallServer(t, 2)
	fill(t, dsn)
	t.Setenv("PGOUTBOX_TEST_FULL_DSN", dsn)
	s, err := pgfind.Locate(context.Background(), "PGOUTBOX_TEST_FULL_DSN")
	if err != nil {
		t.Fatalf("locate a full server: %v", err)
	}
	if s.Source != "PGOUTBOX_TEST_FULL_DSN" {
		t.Errorf("found %s, want the server the variable names", s.Source)
	}
}

// A PgBouncer's connections to the server are reserved in the budget while
// it runs: the process's own connections wait for room beside them, and
// a reservation the budget cannot hold in full takes what there is once
// its patience ran out.
func TestReservedSlotsCountAgainstTheBudget(t *testing.T) {
	s := find(t)
	b, err := newBudget(s.AdminDSN, 3, 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	release := b.reserve(2)
	if n := len(b.slots); n != 2 {
		t.Fatalf("budget counts %d slots after reserving 2, want 2", n)
	}
	more := b.reserve(5)
	if n := len(b.slots); n != 3 {
		t.Fatalf("budget counts %d slots after reserving 5 more of 1 left, want 3", n)
	}
	release()
	more()
	if n := len(b.slots); n != 0 {
		t.Errorf("budget counts %d slots after both reservations ended, want 0", n)
	}
	var none *budget
	none.reserve(1)() // a process without a budget reserves nothing
}
