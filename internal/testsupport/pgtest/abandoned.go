package pgtest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/ident"
)

// dbPrefix starts the name of every test database this host creates:
// "pgoutbox_t", a tag of the host name, then "_". The process id follows,
// so dropAbandoned can tell whose databases they are.
func dbPrefix() string {
	host, _ := os.Hostname()
	sum := sha256.Sum256([]byte(host))
	return "pgoutbox_t" + hex.EncodeToString(sum[:4]) + "_"
}

// dropAbandoned drops the test databases that processes of this host
// created and left behind when they were killed or crashed before their
// cleanup ran: those named with this host's prefix and the id of a process
// that no longer runs. A database somebody is connected to is left alone
// (DROP DATABASE without FORCE refuses it).
func dropAbandoned(ctx context.Context, adminDSN string) error {
	conn, err := connect(ctx, adminDSN)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	prefix := dbPrefix()
	rows, err := conn.Query(ctx, `SELECT datname FROM pg_catalog.pg_database WHERE starts_with(datname, $1)`, prefix)
	if err != nil {
		return err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range names {
		pid, err := strconv.Atoi(strings.SplitN(strings.TrimPrefix(name, prefix), "_", 2)[0])
		if err != nil || processRuns(pid) {
			continue
		}
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+ident.Quote(name)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// processRuns reports whether a process with this id exists on this host.
func processRuns(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
