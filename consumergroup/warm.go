package consumergroup

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/engine"
	"github.com/pgoutbox/pgoutbox/internal/sqlq"
)

// noSubscription is a subscription id no row has: readyConn's statements
// read nothing with it and lock nothing.
const noSubscription = int64(-1)

// errNoTracking: the instance does not know yet how its group's messages
// are tracked, so it cannot ready a connection for its looks.
var errNoTracking = errors.New("consumergroup: the group's tracking is not known yet")

// lookConns returns the instance's looks' connections (see
// engine.LookConns), readied by readyConn. Readying ends with the run.
// A connection's mark names the statements readyConn readies, by a hash
// of their text (which has the schema in it): every look checks it.
func (r *runner) lookConns() *engine.LookConns {
	statements := sha256.Sum256([]byte(r.g.q.FetchRowsAhead.Numbered + r.g.q.AnyWork.Numbered))
	key := fmt.Sprintf("pgoutbox: ready for looks %x", statements[:8])
	return engine.NewLookConns(r.fetchCtx, r.g.pool, key, r.readyConn)
}

// readyConn readies c for the instance's looks: in one round trip, a
// transaction that is rolled back runs the look's read of the log and the
// idle check once, for a subscription that does not exist, with the plan
// settings of a look (see sqlq's LookPlanning). The server then holds
// them prepared and planned on c. An error leaves c as it was: the first
// look on it plans them.
//
// It runs beside the fetcher (in the background: see engine.LookConns),
// so it reads nothing the fetcher owns: the group's tracking and settings
// only.
func (r *runner) readyConn(ctx context.Context, c *pgxpool.Conn) error {
	g := r.g
	t := g.tracking()
	if t == nil {
		return errNoTracking
	}
	var b pgx.Batch
	b.Queue("BEGIN")
	b.Queue(sqlq.LookPlanning)
	if !g.byMessageGroup() { // a group that reads by message group reads no rows ahead (see readAhead)
		args := t.stream.bind(sqlq.Args{"sub": noSubscription, "topic": g.cfg.Topic, "limit": 1})
		b.Queue(g.q.FetchRowsAhead.Numbered, g.q.FetchRowsAhead.Bind(args)...)
	}
	b.Queue(g.q.AnyWork.Numbered, g.q.AnyWork.Bind(r.anyWorkArgs(noSubscription))...)
	b.Queue("ROLLBACK")
	return c.SendBatch(ctx, &b).Close()
}
