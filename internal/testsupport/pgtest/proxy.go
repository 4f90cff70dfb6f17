package pgtest

import (
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/pgfind"
)

// Proxy forwards TCP connections to the test server (or another target)
// and can be taken down (every connection cut, new ones refused) and up
// again: a database that becomes unreachable, for one pool only. It can
// also be slowed down: each new connection then reaches the target a
// while after it was accepted; and given latency: what the target sends
// reaches the client a while later (each statement's answer comes late,
// as from a server far away or under load).
type Proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	down    bool
	delay   time.Duration // before a new connection is forwarded
	latency time.Duration // before what the target sent is forwarded
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
}

// NewProxy starts a proxy to the test server, closed when the test ends.
func NewProxy(tb testing.TB) *Proxy {
	tb.Helper()
	s := find(tb)
	host, port, err := pgfind.HostPort(s.AdminDSN)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	return NewProxyTo(tb, net.JoinHostPort(host, strconv.Itoa(int(port))))
}

// NewProxyTo starts a proxy to any TCP server (a NATS server, say),
// closed when the test ends.
func NewProxyTo(tb testing.TB, target string) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("pgtest: proxy: %v", err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	tb.Cleanup(func() {
		ln.Close()
		p.Down()
		p.wg.Wait()
	})
	return p
}

// Addr is the proxy's address (host:port).
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// DSN returns dsn (a test database's) pointed at the proxy.
func (p *Proxy) DSN(tb testing.TB, db *DB) string {
	tb.Helper()
	return "postgres://postgres@" + p.ln.Addr().String() + "/" + db.Name + "?sslmode=disable"
}

// Down cuts every connection and refuses new ones until Up.
func (p *Proxy) Down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for c := range p.conns {
		c.Close()
	}
}

// Up accepts connections again.
func (p *Proxy) Up() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = false
}

// SlowDown makes each connection accepted from now on reach the target d
// after it was accepted (a slow network or server): 0 forwards at once.
func (p *Proxy) SlowDown(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay = d
}

// Latency makes what the target sends reach the client d later, on the
// connections made from now on and those open.
func (p *Proxy) Latency(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency = d
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.forward(client)
	}
}

// forward connects client to the target, after the proxy's delay, unless
// the proxy is down by then.
func (p *Proxy) forward(client net.Conn) {
	defer p.wg.Done()
	p.mu.Lock()
	delay := p.delay
	p.mu.Unlock()
	time.Sleep(delay)
	p.mu.Lock()
	if p.down {
		p.mu.Unlock()
		client.Close()
		return
	}
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		p.mu.Unlock()
		client.Close()
		return
	}
	p.conns[client], p.conns[server] = struct{}{}, struct{}{}
	p.wg.Add(2)
	p.mu.Unlock()
	pipe := func(dst, src net.Conn, late bool) {
		defer p.wg.Done()
		if late {
			_, _ = io.Copy(dst, lateReader{src, p})
		} else {
			_, _ = io.Copy(dst, src) // until either side closes
		}
		dst.Close()
		src.Close()
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		p.mu.Unlock()
	}
	go pipe(server, client, false)
	go pipe(client, server, true)
}

// lateReader reads from the target, and returns what it read after the
// proxy's latency.
type lateReader struct {
	net.Conn
	p *Proxy
}

func (r lateReader) Read(b []byte) (int, error) {
	n, err := r.Conn.Read(b)
	r.p.mu.Lock()
	latency := r.p.latency
	r.p.mu.Unlock()
	if n > 0 && latency > 0 {
		time.Sleep(latency)
	}
	return n, err
}
