// Package childproc runs the test binary again as a child process, for
// tests that kill, freeze or restart what runs in it.
//
// The parent calls Start with an environment variable holding the
// child's spec (JSON); the test binary's TestMain sees the variable, runs
// what the spec says, prints "ready" on a line of its own once it runs,
// and never returns. A child dies with the test process (on Linux): a
// test process killed or timed out leaves no child behind, frozen or not,
// holding its transactions open on the server for the tests after it.
package childproc

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Child is a process running the test binary.
type Child struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Start runs the test binary with env set to spec as JSON and waits until
// the child printed "ready". The process is killed when the test ends.
func Start(tb testing.TB, env string, spec any) *Child {
	tb.Helper()
	b, err := json.Marshal(spec)
	if err != nil {
		tb.Fatal(err)
	}
	cmd := command(env, string(b))
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	c := &Child{cmd: cmd, done: make(chan struct{})}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.TrimSpace(sc.Text()) == "ready" {
				close(ready)
			}
		}
	}()
	go func() { c.err = cmd.Wait(); close(c.done) }()
	tb.Cleanup(func() { c.Kill(); <-c.done })
	select {
	case <-ready:
	case <-c.done:
		tb.Fatalf("child process exited before it started: %v", c.err)
	case <-time.After(30 * time.Second):
		tb.Fatal("child process did not start within 30s")
	}
	return c
}

// command is the test binary run with env set to spec, dying with the
// process that starts it (see dieWithParent).
func command(env, spec string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env+"="+spec)
	cmd.Stderr = os.Stderr
	dieWithParent(cmd)
	return cmd
}

// Kill kills the process (SIGKILL): nothing it held is released.
func (c *Child) Kill() { _ = c.cmd.Process.Signal(syscall.SIGKILL) }

// Freeze stops the process (SIGSTOP): it holds what it held, and does
// nothing, until Thaw.
func (c *Child) Freeze() { _ = c.cmd.Process.Signal(syscall.SIGSTOP) }

// Thaw continues a frozen process (SIGCONT).
func (c *Child) Thaw() { _ = c.cmd.Process.Signal(syscall.SIGCONT) }

// Exited is closed when the process has exited.
func (c *Child) Exited() <-chan struct{} { return c.done }

// Err is how the process exited, once Exited is closed.
func (c *Child) Err() error { return c.err }
