package migrations

import (
	"context"

	"github.com/golang-migrate/migrate/v4"
	"github.com/jackc/pgx/v5/pgxpool"
)

// MigrateTo moves the schema to version v, up or down (tests only).
func MigrateTo(ctx context.Context, pool *pgxpool.Pool, cfg Config, v uint) error {
	return run(ctx, pool.Config(), cfg, func(m *migrate.Migrate) error { return m.Migrate(v) })
}
