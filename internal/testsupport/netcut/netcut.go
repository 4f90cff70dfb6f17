// Package netcut gives a test a network path it can cut the way a vanished
// host or a failed link does: packets stop, and neither end receives a FIN
// or a reset.
//
// The path is a veth pair between the test's network namespace and a new
// one; a PostgreSQL cluster of the test's own listens on the host end.
// Connections dialled with Path.Dial are made from inside the new
// namespace (the dialling thread enters it for the socket call only), so
// they cross the pair; Cut takes the link down. Creating namespaces needs
// root (CAP_NET_ADMIN) and iproute2's ip.
package netcut

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pgoutbox/pgoutbox/internal/pgfind"
)

// Path is a cuttable path to a PostgreSQL server of the test's own.
type Path struct {
	// HostDSN reaches the server from the test's namespace (loopback).
	// FarDSN reaches it over the path: dial it with Dial.
	HostDSN, FarDSN string

	ns, hostLink, farLink string
}

// New sets up the namespace, the link and the server; all are removed
// when the test ends.
func New(tb testing.TB) *Path {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Fatal("netcut: a network namespace needs root (CAP_NET_ADMIN); CI runs the tests as root")
	}
	id := fmt.Sprintf("pgo%06x", rand.Uint32()&0xffffff)
	p := &Path{ns: id, hostLink: id + "h", farLink: id + "f"}
	a, b := 16+rand.IntN(16), rand.IntN(64)*4 // 172.16-31.x.y/30: two addresses
	hostIP, farIP := fmt.Sprintf("172.%d.%d.%d", a, b/256, b%256+1), fmt.Sprintf("172.%d.%d.%d", a, b/256, b%256+2)
	tb.Cleanup(func() {
		_ = exec.Command("ip", "netns", "del", p.ns).Run()
		_ = exec.Command("ip", "link", "del", p.hostLink).Run()
	})
	for _, args := range [][]string{
		{"netns", "add", p.ns},
		{"link", "add", p.hostLink, "type", "veth", "peer", "name", p.farLink},
		{"link", "set", p.farLink, "netns", p.ns},
		{"addr", "add", hostIP + "/30", "dev", p.hostLink},
		{"link", "set", p.hostLink, "up"},
		{"netns", "exec", p.ns, "ip", "addr", "add", farIP + "/30", "dev", p.farLink},
		{"netns", "exec", p.ns, "ip", "link", "set", p.farLink, "up"},
		{"netns", "exec", p.ns, "ip", "link", "set", "lo", "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			tb.Fatalf("netcut: ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}

	// The server trusts the far end: an hba file of the test's own.
	dir, err := os.MkdirTemp("", "pgoutbox-hba-") // the server's user reads it: not under the test's private TempDir
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	hba := filepath.Join(dir, "pg_hba.conf")
	if err := os.WriteFile(hba, []byte("local all all trust\nhost all all 127.0.0.1/32 trust\nhost all all "+farIP+"/32 trust\n"), 0o644); err != nil {
		tb.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	s, err := pgfind.StartCluster(context.Background(), "listen_addresses=127.0.0.1,"+hostIP, "hba_file="+hba)
	if err != nil {
		tb.Fatalf("netcut: a server of the test's own: %v", err)
	}
	tb.Cleanup(s.Stop)
	p.HostDSN = s.AdminDSN
	_, port, err := pgfind.HostPort(s.AdminDSN)
	if err != nil {
		tb.Fatal(err)
	}
	p.FarDSN = fmt.Sprintf("postgres://postgres@%s:%d/postgres?sslmode=disable", hostIP, port)
	return p
}

// Dial dials from inside the far namespace (for pgx's ConnConfig.DialFunc).
func (p *Path) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	runtime.LockOSThread()
	home, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	defer unix.Close(home)
	far, err := unix.Open("/var/run/netns/"+p.ns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	defer unix.Close(far)
	if err := unix.Setns(far, unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	// The far end gives up on its connections soon after a cut (a TCP user
	// timeout, keepalives), so that what runs there fails and stops
	// instead of waiting minutes for TCP to: the server is told nothing.
	d := net.Dialer{
		KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: time.Second, Interval: time.Second, Count: 2},
		Control: func(_, _ string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, 2000)
			})
			return cmp.Or(err, serr)
		},
	}
	conn, dialErr := d.DialContext(ctx, network, addr) // the socket is made here, in the far namespace
	if err := unix.Setns(home, unix.CLONE_NEWNET); err != nil {
		// The thread stays in the far namespace: left locked, it ends with
		// this goroutine instead of serving others.
		if conn != nil {
			conn.Close()
		}
		return nil, fmt.Errorf("netcut: back to the test's namespace: %w", err)
	}
	runtime.UnlockOSThread()
	return conn, dialErr
}

// Cut takes the link down: from now on no packet crosses the path, and
// no end is told.
func (p *Path) Cut(tb testing.TB) {
	tb.Helper()
	if out, err := exec.Command("ip", "netns", "exec", p.ns, "ip", "link", "set", p.farLink, "down").CombinedOutput(); err != nil {
		tb.Fatalf("netcut: cut: %v\n%s", err, out)
	}
}
