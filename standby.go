package pgoutbox

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/leader"
	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/internal/startstop"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/router"
)

// RouterOption changes how Client.NewRouter runs a router.
type RouterOption func(*routerOptions)

type routerOptions struct {
	standby string
}

// Standby makes a router deliver only while it leads name: of the
// processes that run a router with this name on one schema, one leads and
// the others stand by (each schema elects its own). The leader holds a session advisory lock on a connection of
// its client's own (made like its LISTEN connection: Config.ListenDSN,
// else the pool's settings). When the leader's process dies, or its
// connection is cut, the server frees the lock (at once; for a host that
// vanished, within outbox.KeepaliveBound), and a router standing by
// takes it within a second, waits 2 seconds more, and starts: its
// sources start reading, and the messages the old leader held come back
// to it (at once, with a session of its own: see outbox.KeepaliveBound).
//
// A leader that loses its session (the server ended it, or a ping did
// not come back within 2 s) stops at once and abandons its calls in
// flight (their messages are retried), so two leaders never deliver at
// the same time: the new one waits 2 s after it took the lock, longer
// than the old one needs to stop. A leader frozen but alive (SIGSTOP)
// keeps its session and its leadership.
//
// A router on standby needs a session of its own: not with PollOnly, nor
// through a transaction pooler (its client's connection is checked as it
// starts: a router that finds no session of its own stands by and logs
// why). The client's health shows whether it leads (ComponentHealth's
// Standby).
func Standby(name string) RouterOption {
	return func(o *routerOptions) { o.standby = name }
}

// StandbyHealth is where a router on standby stands in its election.
type StandbyHealth struct {
	// Name is the name it leads or stands by for.
	Name string `json:"name"`
	// Leading: it leads, and delivers, since Since. Otherwise it stands
	// by since Since, and Error says why its session ended or could not
	// be made, if it did.
	Leading bool      `json:"leading"`
	Since   time.Time `json:"since"`
	Error   string    `json:"error,omitempty"`
}

// standbyRouter runs a router only while its process leads a name.
type standbyRouter struct {
	name     string
	instance string // host:pid, recorded as the leader's
	el       *leader.Election
	rt       *router.Router
	c        *Client
	logger   *slog.Logger

	mu       sync.Mutex
	cancel   context.CancelFunc // ends the election
	ended    chan struct{}      // closed when the election ended
	stopCtx  context.Context    // the client's Stop: how long the leading router may take to stop
	abandon  bool               // the client's Stop abandons calls in flight
	stopping bool               // the client stops it: not a lost lead
}

// standby makes comp run rt only while it leads o.standby.
func (c *Client) standby(comp *component, rt *router.Router, o routerOptions, logger *slog.Logger) error {
	conn := c.outbox.SessionConfig()
	if conn == nil {
		return fmt.Errorf("%w: a router on standby needs a session of its own, and the client has PollOnly", outbox.ErrInvalidConfig)
	}
	host, _ := os.Hostname()
	s := &standbyRouter{name: o.standby, rt: rt, c: c, logger: logger, instance: fmt.Sprintf("%s:%d", host, os.Getpid()),
		el: leader.New(leader.Config{Name: o.standby, Schema: c.cfg.Schema, Conn: conn, Pool: c.pool, Logger: logger})}
	comp.name = "router (standby for " + o.standby + ")"
	comp.start, comp.stop, comp.status = s.start, s.stop, s.status
	return nil
}

func (s *standbyRouter) start(context.Context) error {
	ctx, cancel := context.WithCancel(context.Background())
	ended := make(chan struct{})
	s.mu.Lock()
	s.cancel, s.ended, s.stopping = cancel, ended, false
	s.mu.Unlock()
	go func() {
		defer close(ended)
		s.el.Run(ctx, s.lead)
	}()
	return nil
}

// lead runs the router while ctx lasts. A lost lead abandons the calls in
// flight at once; the client's Stop stops it as the client was asked to.
func (s *standbyRouter) lead(ctx context.Context) error {
	if err := s.rt.Start(ctx); err != nil {
		return err
	}
	// For operators (admin.Admin.Routers): who leads, since when.
	q := sqlq.ForRouter(s.c.outbox.Schema())
	if _, err := s.c.pool.Exec(ctx, q.SetLeader, pgx.StrictNamedArgs{"router": s.name, "instance": s.instance}); err != nil && ctx.Err() == nil {
		s.logger.Warn("pgoutbox: recording the router's leadership for operators failed", slog.String("name", s.name), slog.Any("error", err))
	}
	<-ctx.Done()
	s.mu.Lock()
	stopping, stopCtx, abandon := s.stopping, s.stopCtx, s.abandon
	s.mu.Unlock()
	if !stopping {
		return stopRouter(context.WithoutCancel(ctx), s.rt, true)
	}
	return stopRouter(stopCtx, s.rt, abandon)
}

func (s *standbyRouter) stop(ctx context.Context, abandon bool) error {
	s.mu.Lock()
	cancel, ended := s.cancel, s.ended
	s.stopping, s.stopCtx, s.abandon = true, ctx, abandon
	s.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	select {
	case <-ended:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *standbyRouter) status() ComponentHealth {
	st := s.el.State()
	h := ComponentHealth{Standby: &StandbyHealth{Name: s.name, Leading: st.Leading, Since: st.Since, Error: st.Err}}
	s.mu.Lock()
	h.Running = s.ended != nil && !startstop.Closed(s.ended)
	s.mu.Unlock()
	if st.Leading {
		h.Sources = s.rt.Sources()
	}
	return h
}
