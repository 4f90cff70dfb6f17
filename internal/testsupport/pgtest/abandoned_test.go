package pgtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/ident"
)

func TestMain(m *testing.M) { Main(m) }

// A test process killed before its cleanup ran leaves its databases on
// the server; the next run drops them, and only them: not those of a
// process that still runs, nor those named by another host.
func TestDropAbandonedDatabases(t *testing.T) {
	s := find(t)
	ctx := context.Background()
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{ // name → dropped
		fmt.Sprintf("%s%d_1_1", dbPrefix(), gone.Process.Pid):      true,
		fmt.Sprintf("%s%d_1_2", dbPrefix(), os.Getpid()):           false,
		fmt.Sprintf("pgoutbox_t00000000_%d_1_3", gone.Process.Pid): false,
	}
	admin, err := pgx.Connect(ctx, s.AdminDSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close(context.Background()) }) // after the drops below
	for name := range names {
		if _, err := admin.Exec(ctx, "CREATE DATABASE "+ident.Quote(name)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+ident.Quote(name)) })
	}
	if err := dropAbandoned(ctx, s.AdminDSN); err != nil {
		t.Fatal(err)
	}
	for name, dropped := range names {
		var exists bool
		if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
			t.Fatal(err)
		}
		if exists == dropped {
			t.Errorf("%s: exists=%v after the sweep, want dropped=%v", name, exists, dropped)
		}
	}
}
