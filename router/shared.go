package router

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// DefaultPermitLease is how long a router holds concurrency permits of a
// shared pool without renewing them.
const DefaultPermitLease = 10 * time.Second

// SharedLimits makes each pool's Concurrency and RateLimitPerMinute hold
// for every router of the same Name together, coordinated through the
// database, instead of for each router alone.
//
// Concurrency: a router holds permits of a pool, granted from a row per
// pool so that all routers' permits never add up to more than its
// Concurrency, and delivers at most as many messages at once as it holds.
// It asks for more when it has messages waiting (one round trip, not one
// per delivery), gives back what it does not use at its next renewal, and
// renews what it holds every Lease/4. The permits of a router that died,
// or cannot reach the database, come back when their Lease ends; such a
// router starts no delivery once its lease may have ended. The limit is
// exact but for a router frozen (SIGSTOP) longer than its Lease in the
// middle of calls: those calls go on when it thaws, beside the permits
// others took meanwhile.
//
// Rate: a pool's rate is a token bucket in its row, filling at
// RateLimitPerMinute/60 a second up to a second's worth. A router takes
// tokens for the deliveries it is about to make, up to a second's worth
// at once, and drops the tokens it has not used within a second. Over any
// minute the routers together make at most RateLimitPerMinute deliveries,
// plus a second's worth (the bucket's depth).
type SharedLimits struct {
	// Client is the database the routers share. Required.
	Client *outbox.Client
	// Name: the routers with the same name share their pools' limits.
	// Required.
	Name string
	// Instance names this router among them (shown with the permits it
	// holds); a random id by default.
	Instance string
	// Lease is how long permits are held without renewal; defaults to
	// DefaultPermitLease.
	Lease time.Duration
}

func (s *SharedLimits) withDefaults() {
	if s.Instance == "" {
		b := make([]byte, 6)
		_, _ = rand.Read(b)
		s.Instance = "router-" + hex.EncodeToString(b)
	}
	s.Lease = cmp.Or(s.Lease, DefaultPermitLease)
}

func (s *SharedLimits) validate() error {
	switch {
	case s.Client == nil:
		return fmt.Errorf("%w: SharedLimits.Client is nil", ErrInvalidConfig)
	case s.Name == "":
		return fmt.Errorf("%w: SharedLimits.Name is empty", ErrInvalidConfig)
	case s.Lease < 2*time.Second:
		return fmt.Errorf("%w: SharedLimits.Lease %s is under 2s", ErrInvalidConfig, s.Lease)
	}
	return nil
}

// shared coordinates a router's pools with the other routers of its name.
type shared struct {
	cfg    SharedLimits
	q      *sqlq.Router
	logger *slog.Logger
	wake   chan struct{} // a pool wants permits now
}

func newShared(cfg SharedLimits, logger *slog.Logger) *shared {
	return &shared{cfg: cfg, q: sqlq.ForRouter(cfg.Client.Schema()), logger: logger, wake: make(chan struct{}, 1)}
}

// want asks the coordinator to look at the pools' demand now.
func (s *shared) want() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// permitState is what a pool of a shared router holds.
type permitState struct {
	held       int       // permits granted
	wanted     int       // permits asked for at the last grant
	validUntil time.Time // when the lease may have ended (local time, with a margin)
	tokens     int       // rate tokens taken and not used
	tokensEnd  time.Time // when they are dropped
	fetching   sync.Mutex
}

// permits returns how many deliveries the pool may run at once now
// (callers hold p.mu).
func (ps *permitState) permits(now time.Time) int {
	if now.After(ps.validUntil) {
		return 0
	}
	return ps.held
}

// adjustEvery is how often a router renews and adjusts the permits of
// its pools that hold or want some: the fair share moves between routers
// that want permits within about this long.
const adjustEvery = 500 * time.Millisecond

// run renews and adjusts every pool's permits until ctx ends, then gives
// them back.
func (s *shared) run(ctx context.Context, r *Router) {
	renew := time.NewTicker(min(adjustEvery, s.cfg.Lease/4))
	defer renew.Stop()
	for {
		s.adjust(ctx, r)
		select {
		case <-ctx.Done():
			s.release(r)
			return
		case <-renew.C:
		case <-s.wake:
			// Several pools may ask at once: one pass serves them all.
			select {
			case <-ctx.Done():
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
}

// adjust asks for each pool's demand: the permits its deliveries in
// flight and waiting need, up to its Concurrency.
func (s *shared) adjust(ctx context.Context, r *Router) {
	r.mu.Lock()
	pools := make([]*pool, 0, len(r.pools))
	for _, p := range r.pools {
		pools = append(pools, p)
	}
	r.mu.Unlock()
	for _, p := range pools {
		p.mu.Lock()
		want := min(p.concurrency, p.inFlight+p.queued)
		limit, inUse, held, wanted := p.concurrency, p.inFlight, p.permits.held, p.permits.wanted
		p.mu.Unlock()
		if want == 0 && held == 0 && wanted == 0 {
			continue // nothing held, nothing wanted, nothing to say
		}
		asked := time.Now()
		held, leaseMS, err := s.grant(ctx, p.code, limit, want, inUse)
		if err != nil {
			if ctx.Err() == nil {
				r.events.Log(slog.LevelWarn, "permits|"+p.code, "pgoutbox router: renewing the shared permits of a pool failed; it starts nothing once its lease may have ended",
					slog.String("pool", p.code), slog.Any("error", err))
			}
			continue
		}
		// The lease counts from the server's clock; here it counts from
		// before the request, less a margin: never later than the server's.
		until := asked.Add(time.Duration(leaseMS*float64(time.Millisecond)) - s.cfg.Lease/4)
		p.setPermits(held, want, until)
	}
}

// grant asks for want permits of pool, inUse of them in use (see sqlq's
// routerPermits), and returns those granted, and the lease in ms.
func (s *shared) grant(ctx context.Context, pool string, limit, want, inUse int) (int, float64, error) {
	args := pgx.StrictNamedArgs{"router": s.cfg.Name, "pool": pool}
	var held int
	var leaseMS float64
	var b pgx.Batch
	b.Queue("BEGIN")
	b.Queue(s.q.EnsurePool, args)
	b.Queue(s.q.LockPool, args)
	b.Queue(s.q.Permits, pgx.StrictNamedArgs{"router": s.cfg.Name, "pool": pool, "instance": s.cfg.Instance,
		"want": want, "in_use": inUse, "limit": limit, "lease_ms": s.cfg.Lease.Milliseconds()}).QueryRow(func(row pgx.Row) error {
		return row.Scan(&held, &leaseMS)
	})
	b.Queue("COMMIT")
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Lease/4)
	defer cancel()
	err := s.cfg.Client.Pool().SendBatch(ctx, &b).Close()
	return held, leaseMS, err
}

// tokens takes up to want rate tokens of pool (perMinute a minute).
func (s *shared) tokens(ctx context.Context, pool string, perMinute, want int) (int, error) {
	perSecond := float64(perMinute) / 60
	burst := max(1, perSecond)
	args := pgx.StrictNamedArgs{"router": s.cfg.Name, "pool": pool}
	var got int
	var b pgx.Batch
	b.Queue(s.q.EnsurePool, args)
	b.Queue(s.q.Tokens, pgx.StrictNamedArgs{"router": s.cfg.Name, "pool": pool, "want": min(want, int(burst)),
		"burst": burst, "per_second": perSecond}).QueryRow(func(row pgx.Row) error { return row.Scan(&got) })
	err := s.cfg.Client.Pool().SendBatch(ctx, &b).Close()
	return got, err
}

// release gives the router's permits back as it stops.
func (s *shared) release(r *Router) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := s.cfg.Client.Pool().Exec(ctx, s.q.ReleasePermits, pgx.StrictNamedArgs{"router": s.cfg.Name, "instance": s.cfg.Instance})
	if err != nil && !errors.Is(err, context.Canceled) {
		s.logger.Warn("pgoutbox router: giving its shared permits back failed; they come back when their lease ends",
			slog.String("router", s.cfg.Name), slog.Any("error", err))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.pools {
		p.setPermits(0, 0, time.Time{})
	}
}
