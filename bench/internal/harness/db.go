package harness

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// OpenPool opens a pool on dsn, creating its database if it is missing.
// Unless the DSN sets pool_max_conns, the pool has 2·workers + 8
// connections (pgxpool's default, max(4, cores), would halve an 8-way
// workload on a small machine). Each of configure may change the pool's
// configuration before it opens.
func OpenPool(ctx context.Context, dsn string, workers int, configure ...func(*pgxpool.Config)) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	if err := ensureDatabase(ctx, cfg.ConnConfig); err != nil {
		return nil, err
	}
	if !strings.Contains(dsn, "pool_max_conns") {
		cfg.MaxConns = int32(2*workers + 8)
	}
	for _, f := range configure {
		f(cfg)
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

// ensureDatabase creates cfg's database if connecting says it does not
// exist.
func ensureDatabase(ctx context.Context, cfg *pgx.ConnConfig) error {
	conn, err := pgx.ConnectConfig(ctx, cfg.Copy())
	if err == nil {
		return conn.Close(ctx)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "3D000" { // invalid_catalog_name
		return err
	}
	admin := cfg.Copy()
	admin.Database = "postgres"
	aconn, aerr := pgx.ConnectConfig(ctx, admin)
	if aerr != nil {
		return fmt.Errorf("%v; and connecting to postgres to create it: %w", err, aerr)
	}
	defer aconn.Close(ctx)
	_, err = aconn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{cfg.Database}.Sanitize())
	if err != nil && !strings.Contains(err.Error(), "already exists") {
		return err
	}
	return nil
}

// ResetSchema drops schema with everything in it, calls create to make
// what the system needs, then checkpoints, so that every run starts from
// the same state. The DROP runs on a connection of its own: a backend
// that once held the hundreds of locks a cascading DROP SCHEMA takes
// keeps a grown lock table, and scans all of it at every later commit,
// which would slow whichever pooled connection a producer got.
func ResetSchema(ctx context.Context, pool *pgxpool.Pool, schema string, create func(context.Context) error) error {
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
		return err
	}
	if err := create(ctx); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, "CHECKPOINT"); err != nil {
		Logf("CHECKPOINT skipped: %v", err)
	}
	return nil
}
