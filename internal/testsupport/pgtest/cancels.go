package pgtest

// Cancel requests through an old PgBouncer.
//
// pgx sends the server a cancel request whenever a statement's context ends
// before its result came back (pgconn closes the connection and cancels
// what it was running). PgBouncer before 1.21 can exit on such a request:
// "server_proto: server in bad state: 11" when the request reaches a
// server connection it is still cancelling, and "bad client state: 6/7"
// when pgx closes the cancel connection with a Terminate message
// (pgbouncer/pgbouncer#822, #904; fixed in 1.21 by #927 and #928). Debian
// 12 ships 1.18, and a PgBouncer that dies takes every connection of the
// test with it.
//
// So the harness's connections through a PgBouncer older than 1.21 do not
// send cancel requests: a cancelled statement's connection is still closed
// at once, and the server finishes the statement, or finds the client
// gone, on its own. Nothing pgoutbox promises rests on a cancel request
// arriving: PostgreSQL never promises that one does.

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"os/exec"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgconn"
)

// cancelRequestCode is the protocol code of a CancelRequest message.
const cancelRequestCode = 80877102

// pgbouncerDropsOnCancel reports whether the local pgbouncer is older than
// 1.21, which can exit on a client's cancel request (see above).
var pgbouncerDropsOnCancel = sync.OnceValue(func() bool {
	out, err := exec.Command(pgbouncerBinary(), "--version").Output()
	if err != nil {
		return false // no pgbouncer: no connection goes through one
	}
	m := regexp.MustCompile(`PgBouncer (\d+)\.(\d+)`).FindSubmatch(out)
	if m == nil {
		return false
	}
	major, _ := strconv.Atoi(string(m[1]))
	minor, _ := strconv.Atoi(string(m[2]))
	return major < 1 || (major == 1 && minor < 21)
})

// keepCancelsFromOldPgBouncer makes the connections cfg opens through the
// harness's PgBouncer drop their cancel requests when that PgBouncer is
// older than 1.21.
func keepCancelsFromOldPgBouncer(cfg *pgconn.Config) {
	if cfg.RuntimeParams["application_name"] != pgbouncerApp || !pgbouncerDropsOnCancel() {
		return
	}
	dial := cfg.DialFunc
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &cancelDropper{Conn: conn}, nil
	}
}

// cancelDropper is a connection that, when the first message written to
// it is a cancel request, closes instead of sending it, and then reads as
// a server that answered the request by closing.
type cancelDropper struct {
	net.Conn
	written atomic.Bool // a first message went out
	dropped atomic.Bool // it was a cancel request, not sent
}

func (c *cancelDropper) Write(b []byte) (int, error) {
	if !c.written.Swap(true) && len(b) >= 8 && binary.BigEndian.Uint32(b[4:8]) == cancelRequestCode {
		c.dropped.Store(true)
		_ = c.Conn.Close()
		return len(b), nil
	}
	return c.Conn.Write(b)
}

func (c *cancelDropper) Read(b []byte) (int, error) {
	if c.dropped.Load() {
		return 0, io.EOF
	}
	return c.Conn.Read(b)
}
