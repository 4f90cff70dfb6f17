package router_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
)

// receiverEnv, when set to a duration, makes the test binary a receiver
// for the benchmarks instead (see startReceiver).
const receiverEnv = "PGOUTBOX_BENCH_RECEIVER_DELAY"

func TestMain(m *testing.M) {
	if d := os.Getenv(receiverEnv); d != "" {
		runReceiver(d)
		return
	}
	if spec := os.Getenv(childEnv); spec != "" {
		runChild(spec)
		return
	}
	pgtest.Main(m)
}

// runReceiver serves POSTs that each take the given delay and ack, prints
// its address, and exits when its standard input closes.
func runReceiver(delay string) {
	d, err := time.ParseDuration(delay)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	go func() {
		_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			if d > 0 {
				time.Sleep(d)
			}
			_, _ = w.Write([]byte(`{"ack":true}`))
		}))
	}()
	fmt.Println(ln.Addr().String())
	_, _ = io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

// startReceiver runs a receiver taking delay per call in a process of its
// own, so that a benchmark's CPU time is the caller's alone, and returns
// its host:port.
func startReceiver(b *testing.B, delay time.Duration) string {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), receiverEnv+"="+delay.String())
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		b.Fatalf("receiver: %v", err)
	}
	return strings.TrimSpace(line)
}
