// Package leader elects one leader among the processes that share a name,
// through a session advisory lock on a database connection of its own:
// the process whose session holds the lock leads, the others stand by
// and try again every CheckEvery. When the leader's session ends — the
// process died, its connection was cut, the server ended it — the server
// frees the lock at once (or, for a vanished host, within the session's
// TCP keepalive bound), and a process standing by takes it.
//
// A leader that cannot reach the server (its ping fails) stops leading at
// once; a new leader waits Grace after it took the lock before it leads,
// so that an earlier leader that lost its session has stopped by then.
package leader

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/ident"
	"github.com/pgoutbox/pgoutbox/internal/sqlq"
)

// lockClass is the first key of the leadership locks (the second is the
// hash of the schema and the name), apart from pgoutbox's other advisory
// locks.
const lockClass = 1885826915

// Defaults of Config.
const (
	DefaultCheckEvery = time.Second
	DefaultGrace      = 2 * time.Second
	pingTimeout       = 2 * time.Second
	connectTimeout    = 5 * time.Second
	checkTimeout      = 5 * time.Second
)

// ErrNoSession: the connection is not a session of its own (a
// transaction pooler lends server connections out), so a lock on it
// proves nothing.
var ErrNoSession = errors.New("leader: the connection is not a session of its own (a transaction pooler such as PgBouncer?): a notification sent to it never came back")

// Config configures an election.
type Config struct {
	// Name is what the processes elect a leader of.
	Name string
	// Schema is the schema of the pgoutbox installation the processes
	// use: each installation elects its own leader of a name (an
	// advisory lock is database-wide).
	Schema string
	// Conn makes the session that holds the lock: a direct connection,
	// not through a transaction pooler.
	Conn *pgx.ConnConfig
	// Pool sends the notification that proves Conn a session of its own.
	Pool *pgxpool.Pool
	// CheckEvery is how often a process standing by tries the lock, and
	// the leader pings the server; DefaultCheckEvery when 0.
	CheckEvery time.Duration
	// Grace is how long a new leader holds the lock before it leads;
	// DefaultGrace when 0.
	Grace  time.Duration
	Logger *slog.Logger
}

// State is where a process stands in its election.
type State struct {
	// Leading: the process leads, since Since. Otherwise it stands by
	// (Since: since when), and Err says why its last session ended or
	// could not be made ("" while it stands by with a session).
	Leading bool
	Since   time.Time
	Err     string
}

// Election runs one process's part in an election.
type Election struct {
	cfg Config
	key int32

	mu    sync.Mutex
	state State
}

// New returns an election for cfg, not running yet.
func New(cfg Config) *Election {
	cfg.CheckEvery = cmp.Or(cfg.CheckEvery, DefaultCheckEvery)
	cfg.Grace = cmp.Or(cfg.Grace, DefaultGrace)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(cfg.Schema + "\x00" + cfg.Name))
	return &Election{cfg: cfg, key: int32(h.Sum32()), state: State{Since: time.Now()}}
}

// State returns where the process stands.
func (e *Election) State() State {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.state
}

func (e *Election) set(leading bool, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.state.Leading != leading {
		e.state.Since = time.Now()
	}
	e.state.Leading = leading
	e.state.Err = ""
	if err != nil {
		e.state.Err = err.Error()
	}
}

// Run takes part in the election until ctx ends. Each time the process
// leads, it calls lead with a context that ends when it stops leading (its
// session ended, or ctx), and waits for lead to return before it tries to
// lead again. A lead that returns an error before its context ended gives
// the leadership up (another process may take it) and is tried again
// after CheckEvery. Run returns once lead has returned, after ctx ended.
func (e *Election) Run(ctx context.Context, lead func(ctx context.Context) error) {
	for ctx.Err() == nil {
		err := e.session(ctx, lead)
		e.set(false, err)
		if ctx.Err() != nil {
			return
		}
		wait := e.cfg.CheckEvery
		if errors.Is(err, ErrNoSession) {
			wait = time.Minute
		}
		if err != nil {
			e.cfg.Logger.Warn("pgoutbox: standing by: the session that would hold the leadership ended or could not be made",
				slog.String("name", e.cfg.Name), slog.Any("error", err), slog.Duration("retry_in", wait))
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
}

// session makes a session, tries the lock every CheckEvery until it holds
// it, and leads while the session lasts.
func (e *Election) session(ctx context.Context, lead func(ctx context.Context) error) error {
	connectCtx, cancel := context.WithTimeout(ctx, connectTimeout)
	conn, err := pgx.ConnectConfig(connectCtx, e.cfg.Conn)
	cancel()
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, sqlq.SessionSettings); err != nil {
		return err
	}
	if err := e.check(ctx, conn); err != nil {
		return err
	}
	e.set(false, nil)
	for {
		var held bool
		if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, $2)`, lockClass, e.key).Scan(&held); err != nil {
			return err
		}
		if held {
			break
		}
		if err := e.wait(ctx, conn, e.cfg.CheckEvery); err != nil {
			return err
		}
	}
	// The lock is held: wait out the grace, still watching the session.
	if err := e.wait(ctx, conn, e.cfg.Grace); err != nil {
		return err
	}
	e.set(true, nil)
	e.cfg.Logger.Info("pgoutbox: leading", slog.String("name", e.cfg.Name))
	leadCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- lead(leadCtx) }()
	var leadErr error
	for err == nil {
		select {
		case leadErr = <-done:
			stop()
			return fmt.Errorf("leading: %w", cmp.Or(leadErr, errors.New("stopped leading")))
		default:
		}
		err = e.wait(ctx, conn, e.cfg.CheckEvery)
	}
	stop()
	<-done
	if ctx.Err() == nil {
		e.cfg.Logger.Warn("pgoutbox: stopped leading: the session that held the leadership ended", slog.String("name", e.cfg.Name), slog.Any("error", err))
	}
	return err
}

// wait watches the session for d: the server's word that it ends the
// session ends the wait at once; a ping that does not come back within
// pingTimeout ends it too (the process cannot reach the server, so it
// cannot know whether it still holds the lock).
func (e *Election) wait(ctx context.Context, conn *pgx.Conn, d time.Duration) error {
	waitCtx, cancel := context.WithTimeout(ctx, d)
	_, err := conn.WaitForNotification(waitCtx)
	timedOut := waitCtx.Err() != nil
	cancel()
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case err != nil && !timedOut:
		return err
	}
	pingCtx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	if _, err := conn.Exec(pingCtx, ";"); err != nil {
		return fmt.Errorf("ping: %w", err)
	}
	return nil
}

// check proves conn a session of its own: a notification sent through
// the pool to a channel only conn listens on comes back on it.
func (e *Election) check(ctx context.Context, conn *pgx.Conn) error {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	channel := "pgoutbox_leader_" + hex.EncodeToString(b)
	if _, err := conn.Exec(ctx, "LISTEN "+ident.Quote(channel)); err != nil {
		return err
	}
	if _, err := e.cfg.Pool.Exec(ctx, `SELECT pg_notify($1, '')`, channel); err != nil {
		return err
	}
	waitCtx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	if _, err := conn.WaitForNotification(waitCtx); err != nil {
		if ctx.Err() == nil && waitCtx.Err() != nil {
			return ErrNoSession
		}
		return err
	}
	return nil
}
