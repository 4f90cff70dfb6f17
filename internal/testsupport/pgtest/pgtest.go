// Package pgtest is the one place tests get a PostgreSQL database from.
//
// It finds a server with package pgfind (PGOUTBOX_TEST_DSN, then
// 127.0.0.1:5432, then an ephemeral cluster from local initdb/pg_ctl), then
// falls back to a container started with testcontainers-go when a Docker
// engine answers. Main stops whatever it started when the tests end. When
// nothing works, every test fails with a message saying what to set; no
// test is ever skipped.
//
// Each test gets its own database, cloned from a template that was migrated
// once (per version of the migration files), so tests run in parallel and
// never see each other's rows. Test pools run with an empty search_path, so a
// query that forgets to qualify a table with its schema fails.
//
// The server may be shared (other clients, another copy of the suite):
// every pool and connection the package hands out, and every copy of
// their settings, waits for a free connection slot instead of failing, and
// a test process keeps its connections under a budget it reads from the
// server (see connections.go).
package pgtest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox/internal/ident"
	"github.com/pgoutbox/pgoutbox/internal/pgfind"
	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/migrations"
)

// Schema is the schema the template database is migrated into. It is not
// "public" so that code which ignores its configured schema fails in tests.
const Schema = "pgo_test"

// EnvDSN names the variable that points tests at a server of your choice.
const EnvDSN = "PGOUTBOX_TEST_DSN"

var (
	serverOnce sync.Once
	server     *found
	serverErr  error
	dbCounter  atomic.Int64
)

type found struct {
	*pgfind.Server
	stopContainer func() // set when the server is a testcontainers container
	tmplOnce      sync.Once
	template      string
	tmplErr       error
}

// Main runs the package's tests, stops an ephemeral cluster if one was
// started, and fails the run when a test left goroutines behind.
func Main(m *testing.M) {
	code := m.Run()
	if server != nil {
		server.Stop()
		if server.stopContainer != nil {
			server.stopContainer()
		}
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

func find(tb testing.TB) *found {
	tb.Helper()
	locateOnce()
	if serverErr != nil {
		tb.Fatalf("pgtest: %v", serverErr)
	}
	return server
}

// DB is one test's private database.
type DB struct {
	// Pool is a pool on the database with an empty search_path.
	Pool *pgxpool.Pool
	// DSN connects to the database (pool_max_conns not set).
	DSN string
	// Name is the database name.
	Name string
	// Schema is where pgoutbox's tables are (Schema).
	Schema string
}

// Table returns the schema-qualified, quoted name of a pgoutbox table.
func (db *DB) Table(name string) string { return ident.Quote(db.Schema) + "." + ident.Quote(name) }

// FinishedByAll is a condition on a row of outbox_published (named so,
// unaliased, in the query) that every group its Bitmap or Counter record
// requires has finished it: cleanup's own (sqlq.FinishedByAll).
func (db *DB) FinishedByAll() string { return sqlq.FinishedByAll(db.Schema, "outbox_published") }

// FinishedBy is a condition on a row of outbox_published (as in
// FinishedByAll) that subscription sub recorded finishing it.
func (db *DB) FinishedBy(sub int64) string {
	return sqlq.FinishedBy(db.Schema, "outbox_published", sub)
}

// NewDB clones the migrated template into a new database for this test,
// opens a pool on it, and drops it when the test ends.
func NewDB(tb testing.TB) *DB {
	tb.Helper()
	db := newDatabase(tb, true)
	db.Pool = NewPool(tb, db.DSN)
	return db
}

// NewEmptyDB is NewDB without migrations: the database has no pgoutbox tables.
func NewEmptyDB(tb testing.TB) *DB {
	tb.Helper()
	db := newDatabase(tb, false)
	db.Pool = NewPool(tb, db.DSN)
	return db
}

// NewPool opens another pool on dsn (empty search_path, 10 connections
// unless dsn sets pool_max_conns, the connection rules of PoolConfig),
// closed when the test ends: use it to play a second process.
func NewPool(tb testing.TB, dsn string) *pgxpool.Pool {
	tb.Helper()
	find(tb) // the process's connection budget is read with the server
	cfg, err := PoolConfig(dsn)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	if !strings.Contains(dsn, "pool_max_conns") {
		cfg.MaxConns = 10
	}
	if cfg.ConnConfig.RuntimeParams["application_name"] != pgbouncerApp {
		cfg.ConnConfig.RuntimeParams["search_path"] = "" // PgBouncer refuses the parameter
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("pgtest: open pool: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

func newDatabase(tb testing.TB, migrated bool) *DB {
	tb.Helper()
	s := find(tb)
	db, drop, err := s.createDatabase(context.Background(), migrated)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	tb.Cleanup(func() {
		if err := drop(); err != nil {
			tb.Errorf("pgtest: %v", err)
		}
	})
	return db
}

// locateOnce finds the server for this test process.
func locateOnce() {
	serverOnce.Do(func() {
		ctx := context.Background()
		s, err := pgfind.Locate(ctx, EnvDSN)
		if err == nil {
			server = &found{Server: s}
			setBudget(ctx, s.AdminDSN)
			_ = dropAbandoned(ctx, s.AdminDSN) // best effort: a failure here fails no test
			return
		}
		if os.Getenv(EnvDSN) != "" {
			serverErr = err // an explicit choice that fails is not a reason to fall back
			return
		}
		s, stop, cerr := startContainer(ctx)
		if cerr != nil {
			serverErr = fmt.Errorf("%w\n  testcontainers: %v", err, cerr)
			return
		}
		server = &found{Server: s, stopContainer: stop}
		setBudget(ctx, s.AdminDSN)
	})
}

// setBudget reads the process's connection budget from the server. Without
// one (the server did not say) connections are not counted; they still
// wait for a free slot.
func setBudget(ctx context.Context, adminDSN string) {
	n, err := readBudget(ctx, adminDSN)
	if err != nil {
		return
	}
	if b, err := newBudget(adminDSN, max(n, minBudget), budgetPatience); err == nil {
		processBudget.Store(b)
	}
}

// createDatabase clones the migrated template (or template0) into a new
// database and returns it with a function that drops it.
func (s *found) createDatabase(ctx context.Context, migrated bool) (*DB, func() error, error) {
	template := "template0"
	if migrated {
		s.tmplOnce.Do(func() { s.template, s.tmplErr = s.ensureTemplate(ctx) })
		if s.tmplErr != nil {
			return nil, nil, fmt.Errorf("template database: %w", s.tmplErr)
		}
		template = s.template
	}
	name := fmt.Sprintf("%s%d_%d_%d", dbPrefix(), os.Getpid(), time.Now().UnixNano()%1e6, dbCounter.Add(1))
	admin, err := connect(ctx, s.AdminDSN)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to %s: %w", s.Source, err)
	}
	defer admin.Close(ctx)
	create := "CREATE DATABASE " + ident.Quote(name) + " TEMPLATE " + ident.Quote(template)
	for attempt := 0; ; attempt++ {
		_, err = admin.Exec(ctx, create)
		var pgErr *pgconn.PgError
		// 55006: the template is briefly in use by a concurrent clone.
		if err == nil || !errors.As(err, &pgErr) || pgErr.Code != "55006" || attempt == 50 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", create, err)
	}
	// No test crashes the server, so no test needs a commit to wait for
	// the disk; the waits were a large share of the server's work in the
	// suite (the conformance suite's offset subject ran in 70-73 s without
	// them, 79-92 s with). A test that needs them sets them on its session.
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+ident.Quote(name)+" SET synchronous_commit = off"); err != nil {
		return nil, nil, fmt.Errorf("database %s: %w", name, err)
	}
	drop := func() error {
		conn, err := connect(context.Background(), s.AdminDSN)
		if err != nil {
			return fmt.Errorf("drop %s: %w", name, err)
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+ident.Quote(name)+" WITH (FORCE)"); err != nil {
			return fmt.Errorf("drop %s: %w", name, err)
		}
		return nil
	}
	dsn, err := pgfind.WithDatabase(s.AdminDSN, name)
	if err != nil {
		return nil, nil, errors.Join(err, drop())
	}
	return &DB{DSN: dsn, Name: name, Schema: Schema}, drop, nil
}

// ensureTemplate creates (once per server and version of the migration
// files) a database with the migrations applied in Schema, under an
// advisory lock so that parallel test processes agree on it.
func (s *found) ensureTemplate(ctx context.Context) (string, error) {
	sum, err := migrationsChecksum()
	if err != nil {
		return "", err
	}
	name := "pgoutbox_tmpl_" + sum[:16]
	admin, err := connect(ctx, s.AdminDSN)
	if err != nil {
		return "", err
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, `SELECT pg_advisory_lock(hashtext('pgoutbox.pgtest.template'))`); err != nil {
		return "", err
	}
	defer admin.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock(hashtext('pgoutbox.pgtest.template'))`)

	var ready bool
	err = admin.QueryRow(ctx, `SELECT datistemplate FROM pg_database WHERE datname = $1`, name).Scan(&ready)
	if err == nil && ready {
		return name, nil
	}
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return "", err
	}
	// Missing, or left half-made by an interrupted run: build it afresh.
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+ident.Quote(name)+" WITH (FORCE)"); err != nil {
		return "", err
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+ident.Quote(name)+" TEMPLATE template0"); err != nil {
		return "", err
	}
	dsn, err := pgfind.WithDatabase(s.AdminDSN, name)
	if err != nil {
		return "", err
	}
	if err := migrate(ctx, dsn); err != nil {
		return "", fmt.Errorf("migrate template: %w", err)
	}
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+ident.Quote(name)+" WITH IS_TEMPLATE true"); err != nil {
		return "", err
	}
	return name, nil
}

// migrate applies the migrations to the database at dsn in Schema.
func migrate(ctx context.Context, dsn string) error {
	cfg, err := PoolConfig(dsn)
	if err != nil {
		return err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg) // connects on first use: in Up
	if err != nil {
		return err
	}
	defer pool.Close()
	return migrations.Up(ctx, pool, migrations.Config{Schema: Schema, Logger: slog.New(slog.DiscardHandler)})
}

func migrationsChecksum() (string, error) {
	h := sha256.New()
	err := fs.WalkDir(migrations.Files(), ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(migrations.Files(), path)
		if err != nil {
			return err
		}
		h.Write([]byte(path))
		h.Write(b)
		return nil
	})
	if err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Eventually polls cond every 5ms until it is true, failing the test with
// what after timeout.
func Eventually(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// pgbouncerApp is the application_name of connections through PgBouncer
// (NewPool does not set search_path on them: PgBouncer refuses it).
const pgbouncerApp = "pgoutbox-test-pgbouncer"

// logPgBouncerTrouble logs the last lines of a failed test's PgBouncer log
// that tell of trouble: failed server logins, clients it disconnected.
func logPgBouncerTrouble(tb testing.TB, path string) {
	data, err := os.ReadFile(path)
	if err != nil {
		tb.Logf("pgtest: PgBouncer's log: %v", err)
		return
	}
	var trouble []string
	for line := range strings.Lines(string(data)) {
		routine := strings.Contains(line, "client close request") || strings.Contains(line, "pause mode") ||
			strings.Contains(line, "got packet 'A' from server when not linked") // a NOTIFY to a pooled connection
		if !routine && (strings.Contains(line, "WARNING") || strings.Contains(line, "ERROR") ||
			strings.Contains(line, "FATAL") || strings.Contains(line, "closing because")) {
			trouble = append(trouble, strings.TrimSpace(line))
		}
	}
	tb.Logf("pgtest: PgBouncer's log, the last of %d lines telling of trouble:\n%s", len(trouble),
		strings.Join(trouble[max(0, len(trouble)-40):], "\n"))
}

// pgbouncerServerConns is how many connections to the server a test's
// PgBouncer opens at most.
const pgbouncerServerConns = 10

// PgBouncer starts a PgBouncer (from the local pgbouncer binary) in
// transaction pooling mode in front of db's database, on a free loopback
// port, stops it when the test ends, and returns a DSN through it. Each of
// settings is a line added to its [pgbouncer] section.
func PgBouncer(tb testing.TB, db *DB, settings ...string) string {
	tb.Helper()
	bin := pgbouncerBinary()
	if _, err := os.Stat(bin); err != nil {
		tb.Fatalf("pgtest: pgbouncer not found (install Debian's pgbouncer; .ci/run does): %v", err)
	}
	s := find(tb)
	host, port, err := pgfind.HostPort(s.AdminDSN)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	listenPort, err := pgfind.FreePort()
	if err != nil {
		tb.Fatalf("pgtest: free port: %v", err)
	}
	dir, err := os.MkdirTemp("", "pgbouncer")
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			logPgBouncerTrouble(tb, filepath.Join(dir, "pgbouncer.log"))
		}
		os.RemoveAll(dir)
	})
	_ = os.Chmod(dir, 0o777) // pgbouncer refuses to run as root; it runs as postgres
	ini := fmt.Sprintf(`[databases]
%s = host=%s port=%d dbname=%s user=postgres

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = %d
max_db_connections = %d
max_client_conn = 500
; on a full server, try again for a connection every second (not 15):
; the clients wait meanwhile
server_login_retry = 1
logfile = %s/pgbouncer.log
pidfile = %s/pgbouncer.pid
%s
`, db.Name, host, port, db.Name, listenPort, pgbouncerServerConns, pgbouncerServerConns, dir, dir, strings.Join(settings, "\n"))
	path := filepath.Join(dir, "pgbouncer.ini")
	if err := os.WriteFile(path, []byte(ini), 0o644); err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	args := []string{path}
	if os.Geteuid() == 0 {
		args = []string{"-u", "postgres", path}
	}
	// Its connections to the server count against this process's budget:
	// when the server refuses one for want of a slot, PgBouncer drops the
	// clients waiting for a server instead of letting them wait.
	tb.Cleanup(processBudget.Load().reserve(pgbouncerServerConns))
	cmd := exec.Command(bin, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		tb.Fatalf("pgtest: start pgbouncer: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	tb.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	dsn := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable&application_name=%s", listenPort, db.Name, pgbouncerApp)
	deadline := time.Now().Add(10 * time.Second)
	for {
		conn, err := connect(context.Background(), dsn+"&default_query_exec_mode=simple_protocol")
		if err == nil {
			conn.Close(context.Background())
			return dsn
		}
		select {
		case <-exited:
			tb.Fatalf("pgtest: pgbouncer exited: %s", out.String())
		default:
		}
		if time.Now().After(deadline) {
			tb.Fatalf("pgtest: pgbouncer does not answer on port %d: %v\n%s", listenPort, err, out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// pgbouncerBinary is the path of the local pgbouncer: on PATH, or where
// Debian's package puts it (outside a non-root user's PATH).
func pgbouncerBinary() string {
	if bin, err := exec.LookPath("pgbouncer"); err == nil {
		return bin
	}
	return "/usr/sbin/pgbouncer"
}

// PoolReaders is the goleak option for a test that checks for leaks while a
// pool it does not own (the test database's) stays open: pgx starts a
// background reader on a connection while it writes, and that reader may
// still wait on the idle connection after the write finished. It ends when
// the pool closes the connection, so it is not a leak of the code under test.
var PoolReaders = goleak.IgnoreAnyFunction("github.com/jackc/pgx/v5/pgconn/internal/bgreader.(*BGReader).bgRead")

// VerifyNoLeaks fails tb if goroutines other than those opts allow (and
// PoolReaders) still run after 30 s, as goleak.VerifyNone does at once.
// Beside db's pool a stop leaves goroutines of the pool's own for a while:
// an Acquire whose context ended leaves the pool to finish opening its
// connection, and a statement whose context ended has its connection
// cancelled and closed in the background. Those end on their own (pgx
// bounds a close at 15 s), on a busy server later than goleak waits;
// what leaked never ends.
func (db *DB) VerifyNoLeaks(tb testing.TB, opts ...goleak.Option) {
	tb.Helper()
	opts = append(opts, PoolReaders)
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if db.Pool.Stat().ConstructingConns() == 0 && goleak.Find(opts...) == nil {
			return
		}
	}
	goleak.VerifyNone(tb, opts...)
}
