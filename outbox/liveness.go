package outbox

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/internal/startstop"
)

// Liveness: a client proves that it is alive through its LISTEN
// connection's session. The session holds a session advisory lock on the
// client's key for as long as it lives, and the client's consumer group
// instances are recorded with that key (outbox_live_instances). When the
// session ends — the process was killed, its host vanished (the server
// notices within KeepaliveBound), its connection was cut — the lock is
// free at once, and the next client that looks finds it free and takes the
// instances' leases back, so their messages are delivered again within a
// second or two, however long the topic's Lease. A process that is alive
// keeps its session, however slow or paused it is, and its leases run
// until they end as before.
//
// A client without a LISTEN connection (PollOnly), or whose LISTEN
// connection goes through a transaction pooler such as PgBouncer (which
// does not keep a session), records nothing: its instances' work comes
// back when its lease ends.

// KeepaliveBound is how long the server takes at most to notice that the
// host of a client's LISTEN connection vanished without closing it (a
// power cut, a network path cut without a reset): the connection's
// session sets TCP keepalives of 5 s idle, 1 s interval and 5 probes, and
// a 10 s TCP user timeout, so the session, and with it the client's proof
// of life, ends within this bound.
const KeepaliveBound = 10 * time.Second

// keepaliveSettings are the LISTEN session's TCP settings (see
// KeepaliveBound). A Unix-domain socket ignores them.
const keepaliveSettings = `SELECT set_config('tcp_keepalives_idle', '5', false), set_config('tcp_keepalives_interval', '1', false),
       set_config('tcp_keepalives_count', '5', false), set_config('tcp_user_timeout', '10000', false)`

// reapEvery is how often a client looks for instances whose session
// ended; reapGrace how long an instance's lock must have been found free
// before its leases are taken back: a client whose connection dropped for
// a moment (a server restart ends every session) has that long to take
// its lock again.
const (
	reapEvery = 250 * time.Millisecond
	reapGrace = 400 * time.Millisecond
)

type liveness struct {
	c *Client
	q *sqlq.Liveness

	mu      sync.Mutex
	key     int32          // the lock's key; 0 until the first session holds one
	locked  bool           // the current session holds key
	checked bool           // ... and is a session of its own
	members map[string]int // registered instances, by member (a count: a member may register twice)

	suspects map[string]time.Time // instances found gone, and since when (reap's goroutine only)
}

func newLiveness(c *Client) *liveness {
	return &liveness{c: c, q: sqlq.ForLiveness(c.schema), members: map[string]int{}}
}

// connected sets the LISTEN session's TCP keepalives and takes the
// client's lock on it: the first session picks the client's key, a later
// one takes the same again (the instances are recorded with it). A
// session that cannot take it (the previous one has not ended on the
// server yet) serves LISTEN without proving the client alive.
func (l *liveness) connected(ctx context.Context, conn *pgx.Conn) error {
	if _, err := conn.Exec(ctx, keepaliveSettings); err != nil {
		l.c.logger.Warn("pgoutbox: could not set the LISTEN connection's TCP keepalives", slog.Any("error", err))
	}
	l.mu.Lock()
	key := l.key
	l.mu.Unlock()
	tries := 1
	if key == 0 {
		tries = 10 // a key another client holds is taken: try another
	}
	for range tries {
		try := key
		if try == 0 {
			try = rand.Int32N(1<<31-2) + 1
		}
		var got bool
		if err := conn.QueryRow(ctx, l.q.LockInstance, pgx.StrictNamedArgs{"namespace": sqlq.LockNamespace, "key": try}).Scan(&got); err != nil {
			return err
		}
		if got {
			l.mu.Lock()
			l.key, l.locked = try, true
			l.mu.Unlock()
			return nil
		}
	}
	l.c.logger.Warn("pgoutbox: the LISTEN connection could not take the client's instance lock (its previous connection has not ended on the server yet): until it reconnects, the work of this process comes back only when its lease ends if it crashes",
		slog.Int("key", int(key)))
	return nil
}

// sessionChecked records that the session holds the key for as long as it
// lasts, and records every registered instance with it.
func (l *liveness) sessionChecked() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.locked {
		return
	}
	l.checked = true
	for member := range l.members {
		l.record(member)
	}
}

func (l *liveness) ended() {
	l.mu.Lock()
	l.locked, l.checked = false, false
	l.mu.Unlock()
}

// record writes member's row; l.mu is held.
func (l *liveness) record(member string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := l.c.pool.Exec(ctx, l.q.RegisterInstance, pgx.StrictNamedArgs{"member": member, "key": l.key}); err != nil {
		l.c.logger.Warn("pgoutbox: could not record a consumer group instance as alive; its work comes back when its lease ends if it crashes",
			slog.String("instance", member), slog.Any("error", err))
	}
}

// LiveInstance records member (a consumer group instance's id) as an
// instance of this client: if the client's database session ends while
// the instance holds leases, any client that looks for work takes them
// back at once. unregister forgets it; call it when the instance stops.
// Package consumergroup calls it; a program rarely needs to.
func (c *Client) LiveInstance(member string) (unregister func()) {
	if c.live == nil { // PollOnly
		return func() {}
	}
	l := c.live
	l.mu.Lock()
	l.members[member]++
	if l.checked {
		l.record(member)
	}
	l.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			if l.members[member]--; l.members[member] > 0 {
				return
			}
			delete(l.members, member)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, _ = l.c.pool.Exec(ctx, l.q.UnregisterInstance, pgx.StrictNamedArgs{"member": member})
		})
	}
}

// reap looks for recorded instances whose lock no session holds every
// reapEvery until ctx ends, and takes their leases back.
func (l *liveness) reap(ctx context.Context, tasks *startstop.Tasks) {
	tasks.Go(func() {
		t := time.NewTicker(reapEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if err := l.reapOnce(ctx); err != nil && ctx.Err() == nil {
				l.c.logger.Warn("pgoutbox: looking for crashed instances failed", slog.Any("error", err))
			}
		}
	})
}

// reapOnce takes back the leases of the recorded instances whose session
// ended, and wakes their topics' consumers.
func (l *liveness) reapOnce(ctx context.Context) error {
	rows, err := l.c.pool.Query(ctx, l.q.GoneInstances, pgx.StrictNamedArgs{"namespace": sqlq.LockNamespace})
	if err != nil {
		return err
	}
	found, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	var gone []string
	now := time.Now()
	suspects := make(map[string]time.Time, len(found))
	for _, m := range found {
		since, ok := l.suspects[m]
		if !ok {
			since = now
		}
		suspects[m] = since
		if now.Sub(since) >= reapGrace {
			gone = append(gone, m)
		}
	}
	l.suspects = suspects
	if len(gone) == 0 {
		return nil
	}
	var batches, retries int64
	var topics, members []string
	if err := l.c.pool.QueryRow(ctx, l.q.TakeBack, pgx.StrictNamedArgs{"namespace": sqlq.LockNamespace, "members": gone}).
		Scan(&batches, &retries, &topics, &members); err != nil {
		return err
	}
	if len(members) == 0 { // another client took them back first, or they came back
		return nil
	}
	if len(topics) > 0 {
		if _, err := l.c.pool.Exec(ctx, `SELECT pg_notify(@channel, t) FROM unnest(@topics::text[]) AS t`,
			pgx.StrictNamedArgs{"channel": NotifyChannel(l.c.schema), "topics": topics}); err != nil {
			return err
		}
	}
	l.c.logger.Warn("pgoutbox: consumer group instances whose database session ended (their process died, or lost its connection): their leases are taken back at once and their messages delivered again",
		slog.Any("instances", members), slog.Int64("batches", batches), slog.Int64("retries", retries), slog.Any("topics", topics))
	return nil
}
