package pgoutbox_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/internal/pgfind"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
)

// The quick start program and a runnable godoc example build in a module
// of their own (a user's service) that requires pgoutbox: they use only
// public packages.
func TestExamplesBuildInAnotherModule(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs(".")
	require.NoError(t, err)
	dir := t.TempDir()
	goMod := "module example.com/shop\n\ngo 1.26\n\nrequire github.com/pgoutbox/pgoutbox v0.0.0\n\nreplace github.com/pgoutbox/pgoutbox => " + root + "\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte(goMod), 0o644))
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o644))
	program, err := os.ReadFile(filepath.Join(root, "examples", "quickstart", "main.go"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), program, 0o644))
	example, err := os.ReadFile(filepath.Join(root, "outbox", "example_test.go"))
	require.NoError(t, err)
	example = []byte(strings.Replace(string(example), "package outbox_test", "package main_test", 1))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "example_test.go"), example, 0o644))

	run := func(args ...string) {
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		// Modules come from the module cache, or from GOPROXY for what it
		// lacks (tidy reads go.mod files of old versions that building
		// pgoutbox never needed: a fresh machine's cache has none).
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "go %s:\n%s", strings.Join(args, " "), out)
	}
	run("mod", "tidy")
	run("vet", "./...") // builds the program and type-checks the example
}

// The quick start says which database it uses, and where that choice came
// from, so a user who set DATABASE_URL sees it was read. A database that
// cannot be reached is named as such, with its address.
func TestQuickstartSaysWhichDatabase(t *testing.T) {
	t.Parallel()
	db := pgtest.NewEmptyDB(t)
	cfg, err := pgx.ParseConfig(db.DSN)
	require.NoError(t, err)
	run := func(dsn string) (string, error) {
		cmd := exec.Command("go", "run", "./examples/quickstart")
		cmd.Env = append(os.Environ(), "DATABASE_URL="+dsn)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run(db.DSN)
	require.NoError(t, err, out)
	require.Contains(t, out, fmt.Sprintf("database %q at %s:%d (DATABASE_URL)", db.Name, cfg.Host, cfg.Port))
	require.NotContains(t, out, "set DATABASE_URL")

	port, err := pgfind.FreePort()
	require.NoError(t, err)
	out, err = run(fmt.Sprintf("postgres://postgres@127.0.0.1:%d/shop?sslmode=disable", port))
	require.Error(t, err)
	require.Contains(t, out, fmt.Sprintf(`cannot connect to the database at 127.0.0.1:%d (database "shop", user "postgres")`, port))
	require.NotContains(t, out, "migrations")
}
