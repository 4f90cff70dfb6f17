// Package migrations creates and upgrades the tables pgoutbox needs.
//
// The SQL files are embedded in the binary and applied with golang-migrate,
// so a service runs them at boot:
//
//	if err := migrations.Up(ctx, pool, migrations.Config{Schema: "app"}); err != nil {
//		return err
//	}
//
// Up is idempotent and safe when several service instances call it at the
// same time: the first applies what is missing while the others wait on an
// advisory lock, then find nothing to do. pgoutbox records its own version in
// the table pgoutbox_schema_migrations of the chosen schema, so it never
// collides with the host application's schema_migrations.
package migrations

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/golang-migrate/migrate/v4"
	migratepgx "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgoutbox/pgoutbox/internal/ident"
)

//go:embed sql/*.sql
var files embed.FS

// VersionTable is the table, in the chosen schema, where golang-migrate
// records which migrations ran.
const VersionTable = "pgoutbox_schema_migrations"

// ErrInvalidSchema is returned for a schema name pgoutbox refuses to use: it
// must be lower-case letters, digits and underscores, at most 63 bytes.
var ErrInvalidSchema = ident.ErrInvalidSchema

// ErrPooledConnection is returned when migrations run through a connection
// that does not keep session settings (a transaction pooler such as
// PgBouncer in transaction mode): they need a direct connection to
// PostgreSQL, or a session-mode pool, because they set search_path and hold
// a session advisory lock. Nothing was changed.
var ErrPooledConnection = errors.New("pgoutbox migrations: need a direct or session-pooled connection (not a transaction pooler)")

// ErrDirty is returned when a previous migration failed half-way and the
// version table is marked dirty; an operator has to repair it by hand.
var ErrDirty = errors.New("pgoutbox migrations: database is dirty")

// ErrNoConnection is returned when the database cannot be reached or
// refuses the connection (nothing listens at the address, a name that does
// not resolve, a password or TLS setting the server refuses). The error
// names the address, database and user it tried, and wraps the driver's
// error (a *pgconn.ConnectError).
var ErrNoConnection = errors.New("pgoutbox: cannot connect to the database")

// connectionError is err, said as ErrNoConnection with the address cfg
// names, when err is a failure to connect; otherwise it is nil.
func connectionError(err error, cfg *pgconn.Config) error {
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) {
		return nil
	}
	where := cfg.Host
	if !strings.HasPrefix(where, "/") { // a Unix socket directory has no port
		where = fmt.Sprintf("%s:%d", cfg.Host, cfg.Port)
	}
	return fmt.Errorf("%w at %s (database %q, user %q): %w", ErrNoConnection, where, cfg.Database, cfg.User, err)
}

// Config says where the tables live.
type Config struct {
	// Schema holds pgoutbox's tables. It is created when missing.
	// Defaults to "public".
	Schema string
	// Logger receives one line per applied migration step.
	// Defaults to slog.Default().
	Logger *slog.Logger
}

// Up applies every migration not yet applied, using pool's connection
// settings (it opens two short-lived connections of its own, so the caller's
// pool is never left with a changed search_path).
func Up(ctx context.Context, pool *pgxpool.Pool, cfg Config) error {
	return run(ctx, pool.Config(), cfg, (*migrate.Migrate).Up)
}

// UpDSN is Up for a connection string instead of a pool.
func UpDSN(ctx context.Context, dsn string, cfg Config) error {
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return fmt.Errorf("pgoutbox migrations: parse DSN: %w", err)
	}
	return run(ctx, pcfg, cfg, (*migrate.Migrate).Up)
}

// Down reverts every migration: it drops pgoutbox's tables and everything in
// them. The schema itself is kept.
func Down(ctx context.Context, pool *pgxpool.Pool, cfg Config) error {
	return run(ctx, pool.Config(), cfg, (*migrate.Migrate).Down)
}

// DownDSN is Down for a connection string instead of a pool.
func DownDSN(ctx context.Context, dsn string, cfg Config) error {
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return fmt.Errorf("pgoutbox migrations: parse DSN: %w", err)
	}
	return run(ctx, pcfg, cfg, (*migrate.Migrate).Down)
}

// Version reports the applied migration version (0 when none is applied).
func Version(ctx context.Context, pool *pgxpool.Pool, cfg Config) (uint, error) {
	var version uint
	err := run(ctx, pool.Config(), cfg, func(m *migrate.Migrate) error {
		v, dirty, err := m.Version()
		if errors.Is(err, migrate.ErrNilVersion) {
			return nil
		}
		if err != nil {
			return err
		}
		if dirty {
			return fmt.Errorf("%w at version %d", ErrDirty, v)
		}
		version = v
		return nil
	})
	return version, err
}

// ErrNotMigrated is returned for a schema whose pgoutbox tables are missing
// or older than this code needs: run Up (at boot, from every instance: it
// is idempotent) before creating clients.
var ErrNotMigrated = errors.New("pgoutbox: schema not migrated; run migrations.Up first")

// Check reports whether cfg.Schema holds pgoutbox's tables at the version
// this code needs (Latest), reading the version table with one query. A
// missing or older schema, or one left dirty by a failed migration, is
// ErrNotMigrated (ErrDirty too for the latter). A newer schema is fine: an
// instance of the previous release may run while a new one migrated.
func Check(ctx context.Context, pool *pgxpool.Pool, cfg Config) error {
	schema, err := ident.Schema(cfg.Schema)
	if err != nil {
		return err
	}
	var version uint
	var dirty bool
	err = pool.QueryRow(ctx, `SELECT version, dirty FROM `+ident.Quote(schema)+`.`+ident.Quote(VersionTable)+` LIMIT 1`).Scan(&version, &dirty)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "3F000"): // undefined table or schema
		return fmt.Errorf("%w (schema %q has no pgoutbox tables)", ErrNotMigrated, schema)
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("%w (schema %q: no migration applied)", ErrNotMigrated, schema)
	case err != nil:
		if cerr := connectionError(err, &pool.Config().ConnConfig.Config); cerr != nil {
			return cerr
		}
		return fmt.Errorf("pgoutbox: read the schema's migration version: %w", err)
	case dirty:
		return fmt.Errorf("%w: %w at version %d in schema %q", ErrNotMigrated, ErrDirty, version, schema)
	case version < Latest():
		return fmt.Errorf("%w (schema %q is at version %d, this code needs %d)", ErrNotMigrated, schema, version, Latest())
	}
	return nil
}

// Latest is the version Up migrates to.
func Latest() uint {
	src, err := iofs.New(files, "sql")
	if err != nil {
		return 0
	}
	defer src.Close()
	v, err := src.First()
	for err == nil {
		next, nerr := src.Next(v)
		if nerr != nil {
			break
		}
		v = next
	}
	return v
}

// lockClass is the first key of the advisory lock that serialises
// concurrent migration runs on one schema; the second is hashtext(schema).
const lockClass = 0x70676f // "pgo"

func run(ctx context.Context, base *pgxpool.Config, cfg Config, step func(*migrate.Migrate) error) error {
	schema, err := ident.Schema(cfg.Schema)
	if err != nil {
		return err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}

	pcfg := base.Copy()
	pcfg.MaxConns = 2 // one holds the advisory lock, one runs golang-migrate
	pcfg.MinConns = 0
	pcfg.ConnConfig.RuntimeParams["search_path"] = ident.Quote(schema)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("pgoutbox migrations: connect: %w", err)
	}
	defer pool.Close()

	lockConn, err := pool.Acquire(ctx)
	if err != nil {
		if strings.Contains(err.Error(), "unsupported startup parameter") {
			return fmt.Errorf("%w: %w", ErrPooledConnection, err)
		}
		if cerr := connectionError(err, &pcfg.ConnConfig.Config); cerr != nil {
			return cerr
		}
		return fmt.Errorf("pgoutbox migrations: connect: %w", err)
	}
	defer lockConn.Release()
	// A transaction pooler that ignores the search_path startup parameter
	// would have the tables created in the wrong schema (and the session
	// lock below held on a shared server connection): refuse.
	var searchPath string
	if err := lockConn.QueryRow(ctx, `SELECT current_setting('search_path')`).Scan(&searchPath); err != nil {
		return fmt.Errorf("pgoutbox migrations: connect: %w", err)
	}
	if searchPath != ident.Quote(schema) && searchPath != schema {
		return fmt.Errorf("%w: the connection's search_path is %q, not %q", ErrPooledConnection, searchPath, schema)
	}
	if _, err := lockConn.Exec(ctx, `SELECT pg_advisory_lock($1, hashtext($2))`, lockClass, schema); err != nil {
		return fmt.Errorf("pgoutbox migrations: waiting for the migration lock: %w", err)
	}
	defer func() {
		// Unlock even when ctx is done; closing the connection would too.
		_, _ = lockConn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1, hashtext($2))`, lockClass, schema)
	}()
	if _, err := lockConn.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+ident.Quote(schema)); err != nil {
		return fmt.Errorf("pgoutbox migrations: create schema %s: %w", schema, err)
	}

	m, err := newMigrate(pool, schema, logger)
	if err != nil {
		return err
	}
	defer m.Close()

	done := make(chan error, 1)
	go func() { done <- step(m) }()
	select {
	case err = <-done:
	case <-ctx.Done():
		m.GracefulStop <- true // stops between two migration files
		err = <-done
		if err == nil {
			err = ctx.Err()
		}
	}
	if errors.Is(err, migrate.ErrNoChange) {
		return nil
	}
	var dirty migrate.ErrDirty
	if errors.As(err, &dirty) {
		return fmt.Errorf("%w at version %d", ErrDirty, dirty.Version)
	}
	if err != nil {
		return fmt.Errorf("pgoutbox migrations (schema %s): %w", schema, err)
	}
	return nil
}

func newMigrate(pool *pgxpool.Pool, schema string, logger *slog.Logger) (*migrate.Migrate, error) {
	src, err := iofs.New(files, "sql")
	if err != nil {
		return nil, fmt.Errorf("pgoutbox migrations: embedded files: %w", err)
	}
	db := stdlib.OpenDBFromPool(pool)
	driver, err := migratepgx.WithInstance(db, &migratepgx.Config{
		SchemaName:      schema,
		MigrationsTable: VersionTable,
	})
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("pgoutbox migrations: open driver: %w", err)
	}
	m, err := migrate.NewWithInstance("iofs", src, "pgx/v5", driver)
	if err != nil {
		_ = driver.Close()
		return nil, fmt.Errorf("pgoutbox migrations: %w", err)
	}
	m.Log = migrateLogger{logger}
	return m, nil
}

// migrateLogger adapts slog to golang-migrate's Logger interface.
type migrateLogger struct{ l *slog.Logger }

func (l migrateLogger) Printf(format string, v ...any) {
	l.l.Info(strings.TrimRight(fmt.Sprintf(format, v...), "\n"), slog.String("component", "pgoutbox.migrations"))
}

func (l migrateLogger) Verbose() bool { return false }

// Files returns the embedded migration files (directory "sql"), for tools
// that want to inspect or checksum them.
func Files() fs.FS { return files }

// SQL returns the SQL of the migrations after version from (0: all of
// them), in order, for a schema, as one script for a migration tool of
// the caller's (goose, atlas, sqitch): it creates the schema, sets
// search_path for the session, runs the files, and records the version
// reached in VersionTable, so Check, NewClient and a later Up find the
// schema current. Run it in one transaction.
func SQL(schema string, from uint) (string, error) {
	schema, err := ident.Schema(schema)
	if err != nil {
		return "", err
	}
	names, err := fs.Glob(files, "sql/*.up.sql")
	if err != nil {
		return "", fmt.Errorf("pgoutbox migrations: embedded files: %w", err)
	}
	slices.Sort(names)
	q := ident.Quote(schema)
	var b strings.Builder
	fmt.Fprintf(&b, "-- pgoutbox migrations %d to %d, schema %s\n", from+1, Latest(), schema)
	fmt.Fprintf(&b, "CREATE SCHEMA IF NOT EXISTS %s;\nSET search_path TO %s;\n", q, q)
	for _, name := range names {
		base := path.Base(name)
		v, err := strconv.ParseUint(base[:strings.IndexByte(base, '_')], 10, 64)
		if err != nil {
			return "", fmt.Errorf("pgoutbox migrations: file %s: %w", base, err)
		}
		if uint(v) <= from {
			continue
		}
		body, err := fs.ReadFile(files, name)
		if err != nil {
			return "", fmt.Errorf("pgoutbox migrations: file %s: %w", base, err)
		}
		fmt.Fprintf(&b, "\n-- %s\n%s\n", base, strings.TrimRight(string(body), "\n"))
	}
	fmt.Fprintf(&b, "\n-- the version reached, where Up records it\n"+
		"CREATE TABLE IF NOT EXISTS %s.%s (version bigint NOT NULL PRIMARY KEY, dirty boolean NOT NULL);\n"+
		"DELETE FROM %s.%s;\nINSERT INTO %s.%s (version, dirty) VALUES (%d, false);\n",
		q, ident.Quote(VersionTable), q, ident.Quote(VersionTable), q, ident.Quote(VersionTable), Latest())
	return b.String(), nil
}
