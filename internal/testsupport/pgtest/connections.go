package pgtest

// Connections on a shared server.
//
// A CI runner's PostgreSQL is not always the suite's alone: other clients,
// another copy of the suite, the suite's child processes and PgBouncers
// take its connection slots too. So the harness
//
//   - keeps the connections this process opens to the test server under a
//     budget read from the server when the process first finds it
//     (max_connections minus the reserved slots, those in use and a
//     margin), and
//   - has a connection the server refuses for want of a free slot
//     (SQLSTATE 53300) wait and try again instead of failing.
//
// Both live in the connection settings of every pool and connection the
// harness hands out (pgconn.Config.AfterNetConnect), so they travel with
// copies of those settings: the pools and LISTEN connections pgoutbox opens
// from a test's pool are handled too.
//
// Nothing waits forever while holding what others need: a pool's idle
// connections are closed after idleTimeout, a connection that waited
// budgetPatience for its turn goes ahead anyway (the server's own limit,
// met with retries, is the hard one), and a refused connection gives up
// after retryFor, failing with the server's refusal.

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/pgfind"
)

const (
	// retryFor bounds how long a refused connection keeps trying.
	retryFor = 3 * time.Minute
	// budgetPatience is how long a connection waits for room in the
	// budget before it goes ahead anyway.
	budgetPatience = 10 * time.Second
	// idleTimeout closes a harness pool's connections unused this long, so
	// that a test does not sit on slots it does not use.
	idleTimeout = 5 * time.Second
	// minBudget is the budget on a server that is (nearly) full when the
	// tests start: they still run, one connection after another.
	minBudget = 2
)

// processBudget is the budget of this test process, set once it found the
// server; child processes have none (their connections only retry).
var processBudget atomic.Pointer[budget]

// PoolConfig parses dsn into a pool configuration whose connections wait
// for a free slot on a busy server (see the package's connection rules)
// and are closed after a few idle seconds (and, through a PgBouncer older
// than 1.21, send no cancel requests: see cancels.go). Tests that build a pool of
// their own, and child processes of tests, use it instead of
// pgxpool.ParseConfig.
func PoolConfig(dsn string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	shareServer(&cfg.ConnConfig.Config, processBudget.Load())
	keepCancelsFromOldPgBouncer(&cfg.ConnConfig.Config)
	if !strings.Contains(dsn, "pool_max_conn_idle_time") {
		cfg.MaxConnIdleTime = idleTimeout
	}
	if !strings.Contains(dsn, "pool_health_check_period") {
		cfg.HealthCheckPeriod = time.Second // when idle connections are closed
	}
	return cfg, nil
}

// ConnConfig is PoolConfig for a single connection (pgx.ConnectConfig).
func ConnConfig(dsn string) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	shareServer(&cfg.Config, processBudget.Load())
	keepCancelsFromOldPgBouncer(&cfg.Config)
	return cfg, nil
}

// connect opens a connection on dsn with the harness's connection rules.
func connect(ctx context.Context, dsn string) (*pgx.Conn, error) {
	cfg, err := ConnConfig(dsn)
	if err != nil {
		return nil, err
	}
	return pgx.ConnectConfig(ctx, cfg)
}

// shareServer makes the connections cfg opens count against b (nil: no
// budget) and wait out refusals for want of a slot. TLS connections are
// left alone: a refused one cannot be replayed without a new handshake
// (the harness's connection strings disable TLS).
func shareServer(cfg *pgconn.Config, b *budget) {
	cfg.AfterNetConnect = func(ctx context.Context, config *pgconn.Config, conn net.Conn) (net.Conn, error) {
		if _, isTLS := conn.(*tls.Conn); isTLS {
			return conn, nil
		}
		release, err := b.take(ctx, config)
		if err != nil {
			return conn, err // pgconn closes what it gets back
		}
		return &patientConn{
			ctx: ctx, dial: config.DialFunc, release: release, giveUp: time.Now().Add(retryFor),
			network: conn.RemoteAddr().Network(), address: conn.RemoteAddr().String(),
			conn: conn, recording: true,
		}, nil
	}
}

// budget counts this process's open connections to the test server.
type budget struct {
	host     string
	port     uint16
	slots    chan struct{} // one element per open connection
	patience time.Duration
}

// newBudget is a budget of n connections to the server at dsn.
func newBudget(dsn string, n int, patience time.Duration) (*budget, error) {
	host, port, err := pgfind.HostPort(dsn)
	if err != nil {
		return nil, err
	}
	return &budget{host: host, port: port, slots: make(chan struct{}, n), patience: patience}, nil
}

// readBudget reads from the server how many connections the tests may
// open: the free slots, less a margin of a tenth of max_connections (at
// least 2) for everybody else.
func readBudget(ctx context.Context, dsn string) (int, error) {
	conn, err := connect(ctx, dsn)
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	var maxConns, free int
	// Superusers may use the reserved slots; the tests leave them alone.
	err = conn.QueryRow(ctx, `
SELECT current_setting('max_connections')::int,
       current_setting('max_connections')::int
       - current_setting('superuser_reserved_connections')::int
       - coalesce(current_setting('reserved_connections', true)::int, 0) -- PostgreSQL 16
       - (SELECT count(*) FROM pg_catalog.pg_stat_activity WHERE backend_type = 'client backend')::int`).Scan(&maxConns, &free)
	if err != nil {
		return 0, err
	}
	return free - max(2, maxConns/10), nil
}

// take waits for room for a connection to config's server and returns
// the function that gives it back. Connections elsewhere (a PgBouncer, a
// proxy) and those of a process without a budget are not counted.
func (b *budget) take(ctx context.Context, config *pgconn.Config) (release func(), err error) {
	if b == nil || config.Host != b.host || config.Port != b.port {
		return func() {}, nil
	}
	wait := time.NewTimer(b.patience)
	defer wait.Stop()
	select {
	case b.slots <- struct{}{}:
		return sync.OnceFunc(func() { <-b.slots }), nil
	case <-wait.C:
		return func() {}, nil // over budget: see the package's connection rules
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// reserve takes n slots of b for connections to its server that this
// process does not open itself (a PgBouncer's), waiting at most b's
// patience for them in all, and returns what gives them back.
func (b *budget) reserve(n int) (release func()) {
	if b == nil {
		return func() {}
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.patience)
	defer cancel()
	server := &pgconn.Config{Host: b.host, Port: b.port}
	var taken []func()
	for range n {
		r, err := b.take(ctx, server)
		if err != nil {
			break // over budget: see the package's connection rules
		}
		taken = append(taken, r)
	}
	return func() {
		for _, r := range taken {
			r()
		}
	}
}

// patientConn is a connection that, until the server has answered its
// startup message, dials again when the answer is "too many connections"
// (SQLSTATE 53300) and replays what the client sent, so pgx never sees
// the refusal. After the answer it is the connection it wraps.
type patientConn struct {
	ctx              context.Context // the connect's: waiting ends with it
	dial             pgconn.DialFunc
	network, address string
	release          func() // gives the budget's room back
	giveUp           time.Time

	readMu     sync.Mutex // serialises Read
	answered   bool       // the server's answer was read (readMu)
	answer     []byte     // ... and not all handed to the client yet (readMu)
	answerErr  error      // what ended reading the answer (readMu)
	mu         sync.Mutex // guards the fields below
	conn       net.Conn
	recording  bool // the client's writes go to sent
	closed     bool
	sent       []byte // what the client wrote before the answer
	rDL, wDL   time.Time
	closeOnce  sync.Once
	closeError error
}

func (c *patientConn) current() net.Conn {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.conn
}

// Read hands over the server's answer to the startup message (waited
// for, see awaitAnswer), then reads the connection.
func (c *patientConn) Read(p []byte) (int, error) {
	c.readMu.Lock()
	defer c.readMu.Unlock()
	if !c.answered {
		c.answered = true
		c.answer, c.answerErr = c.awaitAnswer()
	}
	if len(c.answer) > 0 {
		n := copy(p, c.answer)
		c.answer = c.answer[n:]
		return n, nil
	}
	if err := c.answerErr; err != nil {
		c.answerErr = nil
		return 0, err
	}
	return c.current().Read(p)
}

// awaitAnswer reads the server's answer to the startup message and, while
// it is a refusal for want of a slot, dials again after a growing pause.
func (c *patientConn) awaitAnswer() ([]byte, error) {
	pause := 20 * time.Millisecond
	for {
		answer, last, err := readAnswer(c.current())
		if err != nil || !refused(last) || time.Now().After(c.giveUp) || c.redial(pause) != nil {
			c.mu.Lock()
			c.recording, c.sent = false, nil
			c.mu.Unlock()
			return answer, err // a failed redial hands over the refusal
		}
		pause = min(2*pause, time.Second)
	}
}

// redial replaces the refused connection with a new one, after pause
// (±50%, so that many waiting connections do not come back at once), and
// replays the client's startup on it.
func (c *patientConn) redial(pause time.Duration) error {
	_ = c.current().Close()
	timer := time.NewTimer(pause/2 + rand.N(pause))
	defer timer.Stop()
	select {
	case <-c.ctx.Done():
		return c.ctx.Err()
	case <-timer.C:
	}
	conn, err := c.dial(c.ctx, c.network, c.address)
	if err != nil {
		return err
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		_ = conn.Close()
		return net.ErrClosed
	}
	c.conn = conn
	sent := c.sent
	_ = conn.SetReadDeadline(c.rDL)
	_ = conn.SetWriteDeadline(c.wDL)
	c.mu.Unlock()
	_, err = conn.Write(sent)
	return err
}

// maxAnswerMessage bounds a message of the startup answer the harness
// reads ahead: the answer's messages are small, a larger one is handed
// over unread.
const maxAnswerMessage = 1 << 16

// readAnswer reads the server's answer to a startup message: its messages
// up to an error, ReadyForQuery, or an authentication request the client
// must reply to (after which the exchange could not be replayed). It
// returns them all and the last one.
func readAnswer(r io.Reader) (answer, last []byte, err error) {
	for {
		var header [5]byte // type, then length (including itself)
		n, err := io.ReadFull(r, header[:])
		answer = append(answer, header[:n]...)
		if err != nil {
			return answer, nil, err
		}
		size := int(binary.BigEndian.Uint32(header[1:])) - 4
		if size < 0 || size > maxAnswerMessage {
			return answer, nil, nil
		}
		start := len(answer)
		answer = append(answer, make([]byte, size)...)
		n, err = io.ReadFull(r, answer[start:])
		answer = answer[:start+n]
		if err != nil {
			return answer, nil, err
		}
		last = answer[start-5:]
		switch header[0] {
		case 'E', 'Z':
			return answer, last, nil
		case 'R': // authentication: 0 is "ok", anything else asks the client
			if size < 4 || binary.BigEndian.Uint32(last[5:]) != 0 {
				return answer, last, nil
			}
		}
	}
}

// refused reports whether msg is an ErrorResponse for want of a
// connection slot.
func refused(msg []byte) bool {
	if len(msg) < 5 || msg[0] != 'E' {
		return false
	}
	var e pgproto3.ErrorResponse
	return e.Decode(msg[5:]) == nil && e.Code == "53300" // too_many_connections
}

// Write sends p, kept for a replay while the server has not answered.
func (c *patientConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	if c.recording {
		c.sent = append(c.sent, p...)
	}
	conn := c.conn
	c.mu.Unlock()
	return conn.Write(p)
}

// Close closes the connection and gives its room in the budget back.
func (c *patientConn) Close() error {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closed = true
		conn := c.conn
		c.mu.Unlock()
		c.release()
		c.closeError = conn.Close()
	})
	return c.closeError
}

// LocalAddr is the connection's local address.
func (c *patientConn) LocalAddr() net.Addr { return c.current().LocalAddr() }

// RemoteAddr is the server's address.
func (c *patientConn) RemoteAddr() net.Addr { return c.current().RemoteAddr() }

// SetDeadline sets both deadlines, kept for a connection dialled again.
func (c *patientConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rDL, c.wDL = t, t
	return c.conn.SetDeadline(t)
}

// SetReadDeadline sets the read deadline, kept for a connection dialled
// again.
func (c *patientConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rDL = t
	return c.conn.SetReadDeadline(t)
}

// SetWriteDeadline sets the write deadline, kept for a connection dialled
// again.
func (c *patientConn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wDL = t
	return c.conn.SetWriteDeadline(t)
}
