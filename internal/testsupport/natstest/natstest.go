// Package natstest starts real nats-server processes (with JetStream) for
// tests, on a free loopback port, and can kill and restart them.
//
// It runs Debian's /usr/sbin/nats-server, or the nats-server on PATH, or the
// binary PGOUTBOX_NATS_SERVER names. When there is none, the test fails
// saying so: no test is skipped.
package natstest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/pgfind"
)

// EnvBinary names the nats-server binary to run, overriding the search.
const EnvBinary = "PGOUTBOX_NATS_SERVER"

// Server is one nats-server process with JetStream, storing in a
// directory of the test's that outlives its restarts.
type Server struct {
	tb     testing.TB
	bin    string
	dir    string
	port   int
	config string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited
}

// Options configure a server beyond the defaults.
type Options struct {
	// Config is extra nats-server configuration (its file syntax), such
	// as an authorization block or a tls block.
	Config string
}

// Binary returns the nats-server binary the tests run.
func Binary() (string, error) {
	if b := os.Getenv(EnvBinary); b != "" {
		return b, nil
	}
	if _, err := os.Stat("/usr/sbin/nats-server"); err == nil {
		return "/usr/sbin/nats-server", nil
	}
	if b, err := exec.LookPath("nats-server"); err == nil {
		return b, nil
	}
	return "", fmt.Errorf("natstest: no nats-server: install Debian's nats-server package or set %s", EnvBinary)
}

// Start starts a server, stopped when the test ends.
func Start(tb testing.TB, opts Options) *Server {
	tb.Helper()
	bin, err := Binary()
	if err != nil {
		tb.Fatal(err)
	}
	port, err := pgfind.FreePort()
	if err != nil {
		tb.Fatal(err)
	}
	s := &Server{tb: tb, bin: bin, dir: tb.TempDir(), port: port, config: opts.Config}
	cfg := fmt.Sprintf("listen: 127.0.0.1:%d\njetstream { store_dir: %q }\n%s\n", s.port, filepath.Join(s.dir, "js"), opts.Config)
	if err := os.WriteFile(filepath.Join(s.dir, "nats.conf"), []byte(cfg), 0o600); err != nil {
		tb.Fatal(err)
	}
	s.Restart()
	tb.Cleanup(s.Kill)
	return s
}

// URL is the server's client URL.
func (s *Server) URL() string { return "nats://127.0.0.1:" + strconv.Itoa(s.port) }

// Dir is a directory of the test's beside the server's store, for files
// its configuration names.
func (s *Server) Dir() string { return s.dir }

// Kill kills the server with SIGKILL (it keeps what it stored) and waits
// for it to exit. It does nothing when the server is not running.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.exited
	s.cmd = nil
}

// Restart starts the server again (after Kill) on the same port and store,
// and waits until it accepts connections.
func (s *Server) Restart() {
	s.tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		s.tb.Fatal("natstest: Restart of a running server")
	}
	logPath := filepath.Join(s.dir, "nats.log")
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		s.tb.Fatal(err)
	}
	defer log.Close() // the process has its own copy
	cmd := exec.Command(s.bin, "-c", filepath.Join(s.dir, "nats.conf"))
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		s.tb.Fatalf("natstest: start %s: %v", s.bin, err)
	}
	s.cmd, s.exited = cmd, make(chan struct{})
	go func(exited chan struct{}) { _ = cmd.Wait(); close(exited) }(s.exited)
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(s.port), time.Second)
		if err == nil {
			c.Close()
			return
		}
		select {
		case <-s.exited:
			out, _ := os.ReadFile(logPath)
			s.cmd = nil
			s.tb.Fatalf("natstest: nats-server exited:\n%s", out)
		default:
		}
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(logPath)
			s.tb.Fatalf("natstest: nats-server did not accept connections within 30s: %v\n%s", err, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
