package outbox

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox/internal/backoff"
	"github.com/pgoutbox/pgoutbox/internal/ident"
	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/internal/startstop"
)

// Liveness: a client proves that it is alive through a database session
// of its own. While the client runs consumer group instances, it keeps one
// connection (made like the LISTEN connection: Config.ListenDSN, else the
// pool's settings) whose session holds a session advisory lock on the
// client's key, and records its instances with that key
// (outbox_live_instances). The connection receives nothing it did not ask
// for, so a paused process keeps it: its kernel answers the server's
// keepalives. When the session ends — the process was killed, its host
// vanished (the server notices within KeepaliveBound), its connection was
// cut — the lock is free at once, and the clients still running find it
// free and take the instances' leases back, so their messages are
// delivered again within about a second, however long the topic's Lease.
//
// A client without a LISTEN connection (PollOnly), or whose connection
// goes through a transaction pooler such as PgBouncer (no session of its
// own: a notification the client sends itself never comes back on it),
// records nothing: its instances' work comes back when its lease ends.

// KeepaliveBound is how long the server takes at most to notice that the
// host of a client vanished without closing its connection (a power cut,
// a network path cut without a reset): the session that proves the client
// alive sets TCP keepalives of 5 s idle, 1 s interval and 5 probes, and a
// 10 s TCP user timeout, so the server ends it, and the client's proof of
// life, within this bound.
const KeepaliveBound = 10 * time.Second

// noIdleTimeout lifts the server's idle_session_timeout from the
// proof-of-life session, which sits idle while its client lives: the
// timeout would end it, and its client would count as gone (PostgreSQL 14
// and later).
const noIdleTimeout = `SET idle_session_timeout = 0`

const (
	// reapEvery is how often a client looks for instances whose session
	// ended; reapGrace how long an instance's lock must have been found
	// free before its leases are taken back (a client whose connection
	// dropped reconnects at once and takes its lock again within it).
	reapEvery = 250 * time.Millisecond
	reapGrace = 600 * time.Millisecond
	// reconnectGrace: a client whose own session had to be made again (a
	// server restart or a failover ends every session) takes nothing back
	// for this long, while the other clients reconnect too; they retry at
	// least every reconnectMax.
	reconnectGrace = 5 * time.Second
	reconnectMax   = time.Second
	// checkTimeout is how long a notification the client sends itself is
	// awaited on a new session; noSessionRetry is how long a client whose
	// connection proved no session of its own waits to try again.
	checkTimeout   = 5 * time.Second
	noSessionRetry = time.Minute
	// connectTimeout bounds a connection attempt; lockWait how long a new
	// session waits for the client's key before it takes another.
	connectTimeout = 5 * time.Second
	lockWait       = 300 * time.Millisecond
	// forgetWait is how long a new instance waits for the session of an
	// earlier process's instance with its id to end.
	forgetWait = 2 * time.Second
	// firstSessionWait is how long the first instance of a client waits
	// for the client's session to record it before it leases anything.
	firstSessionWait = 2 * time.Second
	// pingEvery is how often the session pings the server; a ping that
	// does not come back within pingTimeout ends it (the client cannot
	// reach the server, and no longer takes anything back).
	pingEvery   = time.Second
	pingTimeout = 3 * time.Second
)

var errNoSession = errors.New("the connection is not a session of its own: a notification sent to it never came back (a transaction pooler such as PgBouncer?)")

type liveness struct {
	c       *Client
	q       *sqlq.Liveness
	channel string // the session's own channel, for its check
	nonce   string

	mu            sync.Mutex
	key           int32          // the lock's key; 0 until a session holds one
	held          bool           // a checked session holds key now
	members       map[string]int // registered instances, by member (a count: a member may register twice)
	run           *liveRun       // the running session keeper and reaper, while members is not empty
	sessions      int            // sessions that held the key so far
	reconnectedAt time.Time      // when a session after the first took the key
	noSession     bool           // the last attempt found no session of its own (a pooler)
	lastErr       string         // why the last session ended or could not be made
}

// liveRun is one run of the session keeper and the reaper.
type liveRun struct {
	cancel context.CancelFunc
	tasks  startstop.Tasks

	suspects   map[string]time.Time // instances found gone, and since when (the reaper's goroutine only)
	lastAnswer time.Time            // when the reaper's last look had its answer

	settled chan struct{} // closed once the run's first session recorded the instances, or failed
	settle  sync.Once
}

// firstSessionSettled closes run.settled.
func (run *liveRun) firstSessionSettled() { run.settle.Do(func() { close(run.settled) }) }

func newLiveness(c *Client) *liveness {
	nonce := strconv.FormatUint(rand.Uint64(), 36)
	return &liveness{c: c, q: sqlq.ForLiveness(c.schema), channel: "pgoutbox_alive_" + nonce, nonce: nonce, members: map[string]int{}}
}

// LiveInstance records member (a consumer group instance's id) as an
// instance of this client, proven alive by the client's database session:
// if that session ends while the instance holds leases, the clients still
// running take them back at once. A registration of member left by an
// earlier process whose session ended is taken back first. unregister
// forgets it; call it when the instance stops. Member ids must be unique
// among running processes. Package consumergroup calls it, and
// WaitRecorded before its instance leases anything; a program rarely
// needs to.
func (c *Client) LiveInstance(ctx context.Context, member string) (unregister func()) {
	l := c.live
	if l == nil { // PollOnly
		return func() {}
	}
	l.mu.Lock()
	if l.members[member] == 0 {
		// An earlier process's registration of member whose session ended:
		// its leases are taken back and the row forgotten before this
		// instance leases anything, so that none of this instance's is
		// taken back with them.
		if err := l.forgetEarlier(ctx, member); err != nil {
			c.logger.Warn("pgoutbox: could not take back the leases of an earlier process's instance with this id", slog.String("instance", member), slog.Any("error", err))
		}
	}
	l.members[member]++
	if l.run == nil {
		run := &liveRun{settled: make(chan struct{})}
		var runCtx context.Context
		runCtx, run.cancel = context.WithCancel(context.Background())
		l.run = run
		run.tasks.Go(func() { l.keepSession(runCtx, run) })
		run.tasks.Go(func() { l.reap(runCtx, run) })
	}
	if l.held {
		l.record(member)
	}
	l.mu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { l.unregister(member) }) }
}

// WaitRecorded waits until the client's first session has recorded the
// instances registered with LiveInstance (connecting and checking take
// milliseconds on a quiet server), its first attempt failed, 2 s passed
// (without a session of its own, behind a transaction pooler, the check
// takes longer) or ctx ends. An instance that leased messages before it
// was recorded and then died would get them back only when their lease
// ends. It returns at once when no instance is registered, or once a
// session was made.
func (c *Client) WaitRecorded(ctx context.Context) {
	l := c.live
	if l == nil {
		return
	}
	l.mu.Lock()
	if l.held || l.run == nil {
		l.mu.Unlock()
		return
	}
	settled := l.run.settled
	l.mu.Unlock()
	wait := time.NewTimer(firstSessionWait)
	defer wait.Stop()
	select {
	case <-settled:
	case <-ctx.Done():
	case <-wait.C:
	}
}

func (l *liveness) unregister(member string) {
	l.mu.Lock()
	if l.members[member]--; l.members[member] > 0 {
		l.mu.Unlock()
		return
	}
	delete(l.members, member)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, _ = l.c.pool.Exec(ctx, l.q.UnregisterInstance, pgx.StrictNamedArgs{"member": member, "key": l.key})
	var stopping *liveRun
	if len(l.members) == 0 {
		stopping, l.run, l.held = l.run, nil, false
	}
	l.mu.Unlock()
	if stopping != nil {
		stopping.cancel()
		stopping.tasks.Wait()
	}
}

// record writes member's row with the held key; l.mu is held.
func (l *liveness) record(member string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := l.c.pool.Exec(ctx, l.q.RegisterInstances, pgx.StrictNamedArgs{"members": []string{member}, "key": l.key}); err != nil {
		l.c.logger.Warn("pgoutbox: could not record a consumer group instance as alive; if its process dies, its work comes back when its lease ends",
			slog.String("instance", member), slog.Any("error", err))
	}
}

// keepSession keeps a session holding the client's key until ctx ends,
// making a new one at once when one ends.
func (l *liveness) keepSession(ctx context.Context, run *liveRun) {
	failures := 0
	warned := false
	for ctx.Err() == nil {
		held, err := l.session(ctx, run)
		run.firstSessionSettled()
		if ctx.Err() != nil {
			return
		}
		l.mu.Lock()
		l.noSession = errors.Is(err, errNoSession)
		if err != nil {
			l.lastErr = err.Error()
		}
		l.mu.Unlock()
		delay := time.Duration(0) // after a session that held the key: at once
		switch {
		case errors.Is(err, errNoSession):
			delay = noSessionRetry
			if !warned {
				warned = true
				l.c.logger.Warn("pgoutbox: the LISTEN connection's settings give no session of its own (a transaction pooler such as PgBouncer?): if this process dies, its consumers' work comes back only when its lease ends. Give it a direct connection (ListenDSN)",
					slog.Any("error", err))
			}
		case held:
			failures = 0
			l.c.logger.Warn("pgoutbox: the session proving this process alive ended; making a new one", slog.Any("error", err))
		default:
			failures++
			delay = backoff.Exponential(failures, 100*time.Millisecond, reconnectMax)
			if failures == 1 {
				l.c.logger.Warn("pgoutbox: could not make the session proving this process alive; retrying", slog.Any("error", err), slog.Duration("retry_in", delay))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
	}
}

// session makes one session: it checks that the connection is a session
// of its own, takes the client's key (another if a session of the
// client's that the server has not seen end yet still holds it), records
// the instances with it, and holds it, pinging the server every
// pingEvery, until the server ends it, a ping fails or ctx ends. held reports whether it got
// as far as holding the key.
func (l *liveness) session(ctx context.Context, run *liveRun) (held bool, err error) {
	connectCtx, cancel := context.WithTimeout(ctx, connectTimeout)
	conn, err := pgx.ConnectConfig(connectCtx, l.c.listen)
	cancel()
	if err != nil {
		return false, err
	}
	defer conn.Close(context.Background())
	// A first session is checked before it takes a lock (through a pooler
	// the lock would stay on a server connection the pooler lends to
	// others); a later one, on settings a session was checked on, takes
	// its lock first, so that the clients looking for free locks find it
	// taken again as soon as can be.
	l.mu.Lock()
	checkedBefore := l.sessions > 0
	l.mu.Unlock()
	var key int32
	if checkedBefore {
		if key, err = l.lock(ctx, conn); err != nil {
			return false, err
		}
	}
	if _, err := conn.Exec(ctx, sqlq.SessionSettings); err != nil {
		return false, err
	}
	_, _ = conn.Exec(ctx, noIdleTimeout) // refused before PostgreSQL 14, where there is no such timeout
	if _, err := conn.Exec(ctx, "LISTEN "+ident.Quote(l.channel)); err != nil {
		return false, err
	}
	if err := l.check(ctx, conn); err != nil {
		return false, err
	}
	if !checkedBefore {
		if key, err = l.lock(ctx, conn); err != nil {
			return false, err
		}
	}
	l.mu.Lock()
	if l.run != run { // stopped meanwhile
		l.mu.Unlock()
		return false, ctx.Err()
	}
	// Every instance is recorded with the key, on this session: a key
	// that changed must reach every row, or the rows would name a key
	// nobody holds.
	members := make([]string, 0, len(l.members))
	for m := range l.members {
		members = append(members, m)
	}
	if _, err := conn.Exec(ctx, l.q.RegisterInstances, pgx.StrictNamedArgs{"members": members, "key": key}); err != nil {
		l.mu.Unlock()
		return false, err
	}
	l.key, l.held = key, true
	run.firstSessionSettled()
	if l.sessions++; l.sessions > 1 {
		l.reconnectedAt = time.Now()
	}
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		if l.run == run {
			l.held = false
		}
		l.mu.Unlock()
	}()
	for {
		// Nothing is sent to this connection but the server's word that
		// it ends the session, which ends the wait at once.
		waitCtx, cancel := context.WithTimeout(ctx, pingEvery)
		_, err := conn.WaitForNotification(waitCtx)
		timedOut := waitCtx.Err() != nil
		cancel()
		switch {
		case ctx.Err() != nil:
			return true, ctx.Err()
		case err == nil:
			continue
		case !timedOut:
			return true, err
		}
		pingCtx, cancel := context.WithTimeout(ctx, pingTimeout)
		_, err = conn.Exec(pingCtx, ";")
		cancel()
		if err != nil { // the client cannot reach the server: its leases are not safe to count on, nor are others' to take
			return true, err
		}
	}
}

// check sends a notification to the session's channel through the pool
// and waits for it on conn: through a transaction pooler it never comes.
func (l *liveness) check(ctx context.Context, conn *pgx.Conn) error {
	payload := l.nonce + ":" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if _, err := l.c.pool.Exec(ctx, `SELECT pg_notify($1, $2)`, l.channel, payload); err != nil {
		return err
	}
	waitCtx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	for {
		n, err := conn.WaitForNotification(waitCtx)
		if err != nil {
			if ctx.Err() == nil && waitCtx.Err() != nil {
				return errNoSession
			}
			return err
		}
		if n.Payload == payload {
			return nil
		}
	}
}

// lock takes the client's key on conn, waiting up to lockWait for it (a
// client looking for free locks holds it for the length of a statement),
// or a new key when it cannot: the instances are then recorded with the
// new key (see session).
func (l *liveness) lock(ctx context.Context, conn *pgx.Conn) (int32, error) {
	l.mu.Lock()
	key := l.key
	l.mu.Unlock()
	if key != 0 {
		if _, err := conn.Exec(ctx, l.q.SetLockTimeout, pgx.StrictNamedArgs{"wait": strconv.Itoa(int(lockWait.Milliseconds())) + "ms"}); err != nil {
			return 0, err
		}
		_, lockErr := conn.Exec(ctx, l.q.WaitForLock, pgx.StrictNamedArgs{"namespace": sqlq.LockNamespace, "key": key})
		var pgErr *pgconn.PgError
		if lockErr != nil && !(errors.As(lockErr, &pgErr) && pgErr.Code == pgerrcode.LockNotAvailable) {
			return 0, lockErr
		}
		if _, err := conn.Exec(ctx, l.q.SetLockTimeout, pgx.StrictNamedArgs{"wait": "0"}); err != nil {
			return 0, err
		}
		if lockErr == nil {
			return key, nil
		}
	}
	for range 10 {
		key = rand.Int32N(1<<31-2) + 1
		var got bool
		if err := conn.QueryRow(ctx, l.q.LockInstance, pgx.StrictNamedArgs{"namespace": sqlq.LockNamespace, "key": key}).Scan(&got); err != nil {
			return 0, err
		}
		if got {
			return key, nil
		}
	}
	return 0, errors.New("no free instance lock key after 10 tries")
}

// reap looks for recorded instances whose lock is free every reapEvery
// until ctx ends, and takes their leases back.
func (l *liveness) reap(ctx context.Context, run *liveRun) {
	t := time.NewTicker(reapEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := l.reapOnce(ctx, run); err != nil && ctx.Err() == nil {
			l.c.logger.Warn("pgoutbox: looking for instances whose process died failed", slog.Any("error", err))
		}
	}
}

// reapOnce takes back the leases of the recorded instances whose lock has
// been free for reapGrace, and wakes their topics' consumers. It does
// nothing while the client's own session is not held, or was made again
// less than reconnectGrace ago.
func (l *liveness) reapOnce(ctx context.Context, run *liveRun) error {
	now := time.Now()
	// A look that starts long after the last one had its answer (this
	// process was paused, or its ticks were) cannot tell that what that
	// one saw went on meanwhile: the instances it suspected start their
	// grace again. A slow answer is no such gap: the ticks that came
	// meanwhile make the next look start at once (counted from the
	// look's start, every look slower than 2*reapEvery restarted every
	// grace, and a client with slow statements took nothing back).
	if now.Sub(run.lastAnswer) > 2*reapEvery {
		run.suspects = nil
	}
	defer func() { run.lastAnswer = time.Now() }()
	l.mu.Lock()
	ready := l.held && now.Sub(l.reconnectedAt) >= reconnectGrace
	own := l.key
	l.mu.Unlock()
	if !ready {
		run.suspects = nil
		return nil
	}
	rows, err := l.c.pool.Query(ctx, l.q.GoneInstances, pgx.StrictNamedArgs{"namespace": sqlq.LockNamespace, "own": own})
	if err != nil {
		return err
	}
	found, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	var gone []string
	suspects := make(map[string]time.Time, len(found))
	for _, m := range found {
		since, ok := run.suspects[m]
		if !ok {
			since = now
		}
		suspects[m] = since
		if now.Sub(since) >= reapGrace {
			gone = append(gone, m)
		}
	}
	run.suspects = suspects
	if len(gone) == 0 {
		return nil
	}
	return l.takeBack(ctx, gone, own)
}

// forgetEarlier takes back the leases of an earlier registration of
// member whose lock is free, and forgets it.
// A process restarted at once after its predecessor was killed can get
// here before the server has seen the predecessor's session end: it waits
// for that up to forgetWait. l.mu is held.
func (l *liveness) forgetEarlier(ctx context.Context, member string) error {
	deadline := time.Now().Add(forgetWait)
	for {
		if err := l.takeBack(ctx, []string{member}, 0); err != nil {
			return err
		}
		var left []int32
		rows, err := l.c.pool.Query(ctx, l.q.ForgetInstance, pgx.StrictNamedArgs{"namespace": sqlq.LockNamespace, "member": member})
		if err == nil {
			left, err = pgx.CollectRows(rows, pgx.RowTo[int32])
		}
		if err != nil {
			return err
		}
		if len(left) == 0 || left[0] == l.key {
			return nil
		}
		if time.Now().After(deadline) {
			l.c.logger.Error("pgoutbox: another running process has a consumer group instance with this id: instance ids must be unique among running processes",
				slog.String("instance", member))
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// takeBack takes back the leases of those of members whose lock is free,
// forgets those that hold none any more, and wakes their topics. own is
// the client's key: when it is not 0 and no session holds it on the
// server the pool reaches (a failover moved the pool to another server),
// nothing is taken back.
func (l *liveness) takeBack(ctx context.Context, members []string, own int32) error {
	var batches, retries int64
	var topics, gone []string
	if err := l.c.pool.QueryRow(ctx, l.q.TakeBack, pgx.StrictNamedArgs{"namespace": sqlq.LockNamespace, "members": members, "own": own}).
		Scan(&batches, &retries, &topics, &gone); err != nil {
		return err
	}
	if batches+retries == 0 {
		return nil
	}
	if _, err := l.c.pool.Exec(ctx, `SELECT pg_notify(@channel, t) FROM unnest(@topics::text[]) AS t`,
		pgx.StrictNamedArgs{"channel": NotifyChannel(l.c.schema), "topics": topics}); err != nil {
		return err
	}
	l.c.logger.Warn("pgoutbox: consumer group instances whose process died or lost its database session: their leases are taken back at once and their messages delivered again",
		slog.Any("instances", gone), slog.Int64("batches", batches), slog.Int64("retries", retries), slog.Any("topics", topics))
	return nil
}
