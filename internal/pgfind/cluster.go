package pgfind

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"time"
)

// cluster is an ephemeral PostgreSQL server in a temporary directory.
type cluster struct {
	dir   string
	pgCtl []string // command prefix to run pg_ctl (as the postgres user when we are root)
	dsn   string
}

// binDir finds the directory holding initdb and pg_ctl: PATH first, then
// Debian's /usr/lib/postgresql/<version>/bin, newest version first.
func binDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if _, err := exec.LookPath("pg_ctl"); err == nil {
			return filepath.Dir(p), nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return versionOf(dirs[i]) > versionOf(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", errors.New("initdb/pg_ctl not found on PATH or under /usr/lib/postgresql/*/bin")
}

func versionOf(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

// FreePort returns a loopback port nothing listens on now, for a server a
// test starts.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// StartCluster starts an ephemeral cluster (initdb and pg_ctl from the local
// binaries, in a temporary directory, on a free loopback port) with these
// server settings ("max_connections=4", ...) on top of the finder's own;
// Server.Stop stops and removes it. Tests use it for a server whose limits
// they choose.
func StartCluster(ctx context.Context, settings ...string) (*Server, error) {
	c, err := startCluster(ctx, settings...)
	if err != nil {
		return nil, err
	}
	return &Server{AdminDSN: c.dsn, Source: "ephemeral cluster in " + c.dir, cluster: c}, nil
}

// startCluster runs initdb and pg_ctl start. PostgreSQL refuses to run as
// root, so as root it runs them as the "postgres" system user.
func startCluster(ctx context.Context, settings ...string) (*cluster, error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgoutbox-pg-")
	if err != nil {
		return nil, err
	}
	var prefix []string
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("running as root and no postgres user to run initdb as: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, err
		}
		prefix = []string{"runuser", "-u", "postgres", "--"}
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	data := filepath.Join(dir, "data")
	run := func(args ...string) error {
		full := append(append([]string{}, prefix...), args...)
		cmd := exec.CommandContext(ctx, full[0], full[1:]...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %w\n%s", args, err, out)
		}
		return nil
	}
	if err := run(filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "-A", "trust", "--no-sync"); err != nil {
		return nil, err
	}
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=300", port, dir)
	for _, s := range settings {
		opts += " -c " + s
	}
	if err := run(filepath.Join(bin, "pg_ctl"), "-D", data, "-o", opts, "-l", filepath.Join(dir, "log"), "-w", "-t", "60", "start"); err != nil {
		return nil, err
	}
	c := &cluster{
		dir:   dir,
		pgCtl: append(append([]string{}, prefix...), filepath.Join(bin, "pg_ctl"), "-D", data, "-m", "immediate", "-w", "stop"),
		dsn:   fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port),
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := Ping(ctx, c.dsn); answers(err) {
			return c, nil
		} else if time.Now().After(deadline) {
			c.stop()
			return nil, fmt.Errorf("ephemeral cluster did not answer: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *cluster) stop() {
	_ = exec.Command(c.pgCtl[0], c.pgCtl[1:]...).Run()
	_ = os.RemoveAll(c.dir)
}
