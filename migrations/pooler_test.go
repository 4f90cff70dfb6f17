package migrations_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/migrations"
)

// Migrations through a transaction pooler are refused with a clear error
// and change nothing: PgBouncer rejects the search_path they set, or,
// told to ignore it, would have them create the tables in public.
func TestMigrationsRefuseATransactionPooler(t *testing.T) {
	for name, settings := range map[string][]string{
		"rejects search_path": nil,
		"ignores search_path": {"ignore_startup_parameters = search_path"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := pgtest.NewEmptyDB(t)
			dsn := pgtest.PgBouncer(t, db, settings...)
			err := migrations.UpDSN(context.Background(), dsn+"&default_query_exec_mode=simple_protocol", migrations.Config{Schema: "app"})
			require.ErrorIs(t, err, migrations.ErrPooledConnection)
			var tables int
			require.NoError(t, db.Pool.QueryRow(context.Background(),
				`SELECT count(*) FROM pg_tables WHERE tablename LIKE 'outbox%' OR tablename = $1`, migrations.VersionTable).Scan(&tables))
			require.Zero(t, tables, "no table created anywhere")
		})
	}
}
