// Package pgtest is the one place tests get a PostgreSQL database from.
//
// It finds a server in this order and fails loudly when none works, never
// skipping a test:
//
//  1. PGOUTBOX_TEST_DSN (any database on the server; it must allow CREATE DATABASE);
//  2. a server on 127.0.0.1:5432, user postgres;
//  3. an ephemeral cluster started from local initdb/pg_ctl binaries in a
//     temporary directory (stopped by Main when the tests end);
//  4. otherwise the error says what to set.
//
// Each test gets its own database, cloned from a template that was migrated
// once (per version of the migration files), so tests run in parallel and
// never see each other's rows. Test pools run with an empty search_path, so a
// query that forgets to qualify a table with its schema fails.
package pgtest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox/internal/ident"
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
	adminDSN string // a DSN on the server, database "postgres"
	source   string // where it came from, for messages
	cluster  *cluster
	template string
	tmplOnce sync.Once
	tmplErr  error
}

// Main runs the package's tests, stops an ephemeral cluster if one was
// started, and fails the run when a test left goroutines behind.
func Main(m *testing.M) {
	code := m.Run()
	if server != nil && server.cluster != nil {
		server.cluster.stop()
	}
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreCurrent()); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// AdminDSN returns a DSN for database "postgres" on the test server,
// finding (or starting) the server on first use.
func AdminDSN(tb testing.TB) string {
	tb.Helper()
	s := find(tb)
	return s.adminDSN
}

func find(tb testing.TB) *found {
	tb.Helper()
	serverOnce.Do(func() { server, serverErr = locate(context.Background()) })
	if serverErr != nil {
		tb.Fatalf("pgtest: no PostgreSQL server for tests: %v", serverErr)
	}
	return server
}

func locate(ctx context.Context) (*found, error) {
	var tried []string
	if dsn := os.Getenv(EnvDSN); dsn != "" {
		admin, err := withDatabase(dsn, "postgres")
		if err == nil {
			err = ping(ctx, admin)
		}
		if err != nil {
			// An explicit choice that does not work is an error, not a fallback.
			return nil, fmt.Errorf("%s=%q: %w", EnvDSN, dsn, err)
		}
		return &found{adminDSN: admin, source: EnvDSN}, nil
	}
	const local = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	if err := ping(ctx, local); err == nil {
		return &found{adminDSN: local, source: "127.0.0.1:5432"}, nil
	} else {
		tried = append(tried, fmt.Sprintf("127.0.0.1:5432: %v", err))
	}
	c, err := startCluster(ctx)
	if err == nil {
		return &found{adminDSN: c.dsn, source: "ephemeral cluster in " + c.dir, cluster: c}, nil
	}
	tried = append(tried, fmt.Sprintf("ephemeral cluster: %v", err))
	return nil, fmt.Errorf("set %s to a server where user may CREATE DATABASE; tried:\n  %s",
		EnvDSN, strings.Join(tried, "\n  "))
}

func ping(ctx context.Context, dsn string) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	return conn.Close(ctx)
}

func withDatabase(dsn, db string) (string, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return "", err
	}
	// Rebuild a URL; the password, if any, stays in the environment-free form.
	u := fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable", cfg.User, cfg.Host, cfg.Port, db)
	if cfg.Password != "" {
		u = fmt.Sprintf("postgres://%s:%s@%s:%d/%s?sslmode=disable", cfg.User, cfg.Password, cfg.Host, cfg.Port, db)
	}
	return u, nil
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

// NewPool opens another pool on dsn (empty search_path, 20 connections),
// closed when the test ends: use it to play a second process.
func NewPool(tb testing.TB, dsn string) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	cfg.MaxConns = 20
	cfg.ConnConfig.RuntimeParams["search_path"] = ""
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
	ctx := context.Background()
	template := "template0"
	if migrated {
		s.tmplOnce.Do(func() { s.template, s.tmplErr = s.ensureTemplate(ctx) })
		if s.tmplErr != nil {
			tb.Fatalf("pgtest: template database: %v", s.tmplErr)
		}
		template = s.template
	}
	name := fmt.Sprintf("pgoutbox_t%d_%d_%d", os.Getpid(), time.Now().UnixNano()%1e6, dbCounter.Add(1))
	admin, err := pgx.Connect(ctx, s.adminDSN)
	if err != nil {
		tb.Fatalf("pgtest: connect to %s: %v", s.source, err)
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
		tb.Fatalf("pgtest: %s: %v", create, err)
	}
	tb.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), s.adminDSN)
		if err != nil {
			tb.Errorf("pgtest: drop %s: %v", name, err)
			return
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+ident.Quote(name)+" WITH (FORCE)"); err != nil {
			tb.Errorf("pgtest: drop %s: %v", name, err)
		}
	})
	dsn, err := withDatabase(s.adminDSN, name)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	return &DB{DSN: dsn, Name: name, Schema: Schema}
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
	admin, err := pgx.Connect(ctx, s.adminDSN)
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
	dsn, err := withDatabase(s.adminDSN, name)
	if err != nil {
		return "", err
	}
	if err := migrations.UpDSN(ctx, dsn, migrations.Config{Schema: Schema}); err != nil {
		return "", fmt.Errorf("migrate template: %w", err)
	}
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+ident.Quote(name)+" WITH IS_TEMPLATE true"); err != nil {
		return "", err
	}
	return name, nil
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
