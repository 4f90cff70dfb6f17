package engine

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/cfgcheck"
	"github.com/pgoutbox/pgoutbox/internal/groupwalk"
	"github.com/pgoutbox/pgoutbox/internal/pipeline"
	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/internal/startstop"
	"github.com/pgoutbox/pgoutbox/internal/tracing"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// The fetcher: one goroutine per instance, running a pipeline.Loop whose
// looks are Fetcher.look. It owns everything in Fetcher but its config.
//
// Each look at the database is one short transaction that locks the
// group's offsets row (FOR UPDATE SKIP LOCKED: if another instance holds
// it, that instance is fetching), reads the subscription's state under
// that lock, and then does the first thing that applies:
//  1. nothing, if the group is PAUSED or DEAD (or stop, if it is CANCELLED
//     or gone);
//  2. take over one batch whose lease ran out: its messages go to the
//     retry table, each having spent an attempt;
//  3. claim due retries;
//  4. read the next rows of the current snapshot pair as a new batch and
//     move the position, or, taking turns with it while a backfill is
//     pending, read the backfill's next rows as a batch (a catch-up
//     batch) and move its cursor.
//
// A backfill (a group that subscribed with Backfill, or came back from
// DEAD) is a snapshot pair of its own (from, upto) read beside the stream,
// which starts at upto: new messages flow at once while the old ones are
// caught up. Its rows need not require the group (they were written
// before it subscribed, or while it was DEAD); cleanup leaves them alone
// while the backfill is pending. Catch-up reads are throttled: at most
// BackfillPace.Rate rows a second, and paused while the reads' p95
// latency is above BackfillPace.TargetLatency (the database is busy with
// other work).

var (
	// ErrSubscriptionGone: the group's subscription row was deleted while
	// the instance ran. It matches outbox.ErrNotFound too.
	ErrSubscriptionGone = cfgcheck.NotFound("consumergroup: subscription no longer exists")
	// ErrCancelled: the group's subscription was cancelled while the
	// instance ran.
	ErrCancelled = errors.New("consumergroup: subscription cancelled")
)

// The subscription states a look tells apart (the status column's
// values): any other, PAUSED or DEAD, fetches nothing.
const (
	statusActive    = "ACTIVE"
	statusCancelled = "CANCELLED"
)

// FetchConfig is what a Fetcher needs of its group: its settings, how it
// tracks messages, where the work goes, and what it reports.
type FetchConfig struct {
	Topic, Group string
	// PollInterval is the longest a look waits for the next when no
	// notification comes; looks reap expired retries at most this often.
	PollInterval time.Duration
	Lease        time.Duration // of a batch or retry delivery
	MaxAttempts  int
	// ByMessageGroup: the group reads by message group (see ordered.go);
	// DeadLettersBlock: a dead letter blocks its message group.
	ByMessageGroup, DeadLettersBlock bool
	// Catchup is which rows a backfill reads, Backfill how fast.
	Catchup  CatchupRange
	Backfill BackfillPace

	// Tracking is the group's tracking now (nil until Start read it);
	// SetTracking records what a look read of it (the group's bit, -1 for
	// none, the topic's mode, and whether it is mixing modes) and reports
	// whether that changed it.
	Tracking    func() *Tracking
	SetTracking func(bit int, mode outbox.TrackingMode, mixing bool) (bool, error)
	// CanFetch reports whether the instance's heartbeats go through: it
	// fetches nothing while they do not.
	CanFetch func() bool
	// End stops the instance, because its subscription is gone or
	// cancelled (ErrSubscriptionGone, ErrCancelled). The fetcher returns
	// right after.
	End   func(cause error)
	Looks LookObserver

	Window    *pipeline.Window   // what the instance holds, and when it looks next
	Wake      <-chan struct{}    // notifications of the topic
	Exec      *pipeline.Executor // what the fetcher hands out goes there
	ProbePool *pgxpool.Pool      // the backfill's load probes' (see throttle.go)
	Tracer    *tracing.Tracer    // spans of what it hands out
	FetchTime func(ctx context.Context, d time.Duration)
	// Delivered counts messages handed out, Backfilled those a backfill
	// read, BackfillPauses a backfill's pauses, TakenOver messages taken
	// over from another instance, by reason.
	Delivered, Backfilled, BackfillPauses func(ctx context.Context, n int64)
	TakenOver                             func(ctx context.Context, n int64, reason string)
}

// LookObserver is told the outcome of every look (a group's Status reads
// it).
type LookObserver interface {
	// Looked records a look's outcome at now; catchup says it read from a
	// backfill.
	Looked(err error, catchup bool, now time.Time)
	// NoBackfill records that the group has no backfill pending.
	NoBackfill()
}

// Fetcher is an instance's producer: it looks for work in the database
// (expired leases to take over, due retries, the stream's next rows, a
// backfill's) and hands what it claims to the executor. Run runs it.
type Fetcher struct {
	*Instance
	cfg   FetchConfig
	ctx   context.Context // Run's
	conns *LookConns      // the looks' connections
	tasks startstop.Tasks // the load sampler and ANALYZE runs, which Run waits for

	// It takes turns between the stream and a pending backfill, whose
	// reads the throttle paces.
	catchupTurn        bool
	readCatchup        bool // the look in progress read from a backfill
	throttle           *throttle
	catchupWait        time.Duration // until the throttle allows the next catch-up read (0: none waits)
	backfilling        atomic.Bool   // a backfill is pending: the load sampler probes
	idleSince          time.Time     // when an empty look last moved the position (see idlePositionEvery)
	idle               bool          // the last full look found nothing to do (see look)
	silent             bool          // it stopped fetching for want of heartbeats (see CanFetch)
	tookAhead          int64         // messages the last look took ahead of the backlog (see takeAhead)
	lastReap           time.Time     // when a look last reaped retries
	lastFullLook       time.Time     // when the fetcher last looked in full (see idleFullLookEvery)
	walkAfter          string        // an ordered group's next claim walks the message groups from after this one
	noReadAhead        bool          // the last look took over, claimed retries or had a backfill pending (see readAhead)
	parkedSinceAnalyze int           // rows queued in the retry table since lastAnalyze (see analyze.go)
	lastAnalyze        time.Time     // when the fetcher last analyzed the retry table
}

// NewFetcher returns in's fetcher.
func NewFetcher(in *Instance, cfg FetchConfig) *Fetcher {
	return &Fetcher{Instance: in, cfg: cfg, throttle: newThrottle(cfg.Backfill)}
}

// fetchResult says what a look found.
type fetchResult int

const (
	fetchedNothing fetchResult = iota // the stream is drained
	fetchedWork                       // look again at once
	fetchBusy                         // another instance is fetching
	fetchInactive                     // PAUSED or DEAD
)

// Run fetches until ctx ends (or the subscription is gone or cancelled:
// see FetchConfig.End), and returns once everything it started stopped.
// Statements already sent are not cut off when ctx ends (see fetchOnce).
func (f *Fetcher) Run(ctx context.Context) {
	f.ctx = ctx
	f.conns = f.lookConns(ctx)
	defer f.conns.Wait()
	f.conns.Warm()
	sampling, stopSampling := context.WithCancel(ctx)
	defer f.tasks.Wait()
	defer stopSampling()
	if f.throttle.slowdown > 0 {
		f.tasks.Go(func() { f.sampleLoad(sampling) })
	}
	loop := pipeline.Loop{
		Window:       f.cfg.Window,
		Wake:         f.cfg.Wake,
		PollInterval: f.cfg.PollInterval,
		// Executors are not tracked as idle or busy: fetched work waiting
		// in the channel means none is idle with nothing to take.
		Waiting: f.cfg.Exec.Waiting,
		Look:    f.look,
		Logger:  f.Logger,
	}
	loop.Run(ctx)
}

// look looks for work: in full (fetchOnce), or, when the last full look
// found nothing and was less than idleFullLookEvery ago and no
// notification of the topic came since, first with one statement that
// tells whether a full look could find anything (sqlq's anyWork). A full
// look reaps retries when PollInterval has passed since the last that did
// (lastReap).
func (f *Fetcher) look(limit int, notified bool) (pipeline.Found, error) {
	if !f.cfg.CanFetch() {
		if !f.silent {
			f.silent = true
			f.Logger.Warn("pgoutbox: this instance sent no heartbeat for its HeartbeatTimeout: it fetches nothing until one goes through (to the others the group may be DEAD)")
		}
		return pipeline.Found{Retry: f.cfg.PollInterval}, nil
	}
	f.silent = false
	if f.idle && !notified && time.Since(f.lastFullLook) < idleFullLookEvery {
		work, err := f.anyWork()
		if err == nil && !work {
			f.cfg.Looks.Looked(nil, false, time.Now())
			return pipeline.Found{}, nil // nothing to do
		}
		if f.ctx.Err() != nil {
			return pipeline.Found{}, nil // stopping
		} // on an error, the full look reports it
	}
	reap := time.Since(f.lastReap) >= f.cfg.PollInterval
	if reap {
		f.lastReap = time.Now()
	}
	f.lastFullLook = time.Now()
	f.tookAhead = 0
	res, err := f.fetchOnce(limit, reap)
	if f.tookAhead > 0 && err == nil {
		f.cfg.Window.Urge() // the next look claims them, however little room there is
	}
	f.cfg.FetchTime(f.ctx, time.Since(f.lastFullLook))
	catchup := f.readCatchup
	f.readCatchup = false
	if f.ctx.Err() == nil {
		f.cfg.Looks.Looked(err, catchup, time.Now())
	}
	if errors.Is(err, ErrSubscriptionGone) || errors.Is(err, ErrCancelled) {
		f.cfg.End(err)
		return pipeline.Found{Done: true}, nil
	}
	switch res {
	case fetchedWork:
		return pipeline.Found{More: true}, err
	case fetchBusy:
		return pipeline.Found{Retry: min(f.cfg.PollInterval, 5*time.Millisecond)}, err
	case fetchInactive:
		return pipeline.Found{Retry: f.cfg.PollInterval}, err
	}
	return pipeline.Found{Within: f.catchupWait}, err
}

// idleFullLookEvery is how often an idle instance looks in full anyway:
// that look moves its position (see idlePositionEvery).
const idleFullLookEvery = 30 * time.Second

// anyWork runs sqlq's anyWork: false when the group is ACTIVE and a full
// look would find nothing to do. It only reads, so Stop cuts it off. It
// runs in a transaction of its own with a look's plan settings (see
// sqlq's LookPlanning), in one round trip: planned for its values, as a
// statement outside a transaction is in its first five calls on a
// connection, it took 3–6 ms a call.
func (f *Fetcher) anyWork() (bool, error) {
	ctx, cancel := context.WithTimeout(f.ctx, 30*time.Second)
	defer cancel()
	args := f.anyWorkArgs(f.Subscription)
	var status, mode string
	var bit int
	var mixing, work, gone bool
	var b pgx.Batch
	b.Queue("BEGIN READ ONLY")
	b.Queue(sqlq.LookPlanning)
	b.Queue(f.Statements.AnyWork.Numbered, f.Statements.AnyWork.Bind(args)...).QueryRow(func(row pgx.Row) error {
		err := row.Scan(&status, &bit, &mode, &mixing, &work)
		gone = errors.Is(err, pgx.ErrNoRows)
		if gone {
			return nil
		}
		return err
	})
	b.Queue("COMMIT")
	conn, err := f.conns.Acquire(ctx)
	if err != nil {
		return true, err
	}
	err = conn.SendBatch(ctx, &b).Close()
	conn.Release()
	if err != nil {
		return true, err
	}
	if gone {
		return true, nil // the subscription is gone: the full look says so
	}
	// A change of tracking makes the answer stale: look again in full.
	changed, err := f.cfg.SetTracking(bit, outbox.TrackingMode(mode), mixing)
	return work || changed || status != statusActive, err
}

// noSubscription is a subscription id no row has: readyConn's statements
// read nothing with it and lock nothing.
const noSubscription = int64(-1)

// errNoTracking: the instance does not know yet how its group's messages
// are tracked, so it cannot ready a connection for its looks.
var errNoTracking = errors.New("consumergroup: the group's tracking is not known yet")

// lookConns returns the looks' connections (see LookConns), readied by
// readyConn, until ctx ends. A connection's mark names the statements
// readyConn readies, by a hash of their text (which has the schema in
// it): every look checks it.
func (f *Fetcher) lookConns(ctx context.Context) *LookConns {
	statements := sha256.Sum256([]byte(f.Statements.FetchRowsAhead.Numbered + f.Statements.AnyWork.Numbered))
	key := fmt.Sprintf("pgoutbox: ready for looks %x", statements[:8])
	return NewLookConns(ctx, f.Pool, key, f.readyConn)
}

// readyConn readies c for the looks: in one round trip, a transaction
// that is rolled back runs the look's read of the log and the idle check
// once, for a subscription that does not exist, with the plan settings of
// a look (see sqlq's LookPlanning). The server then holds them prepared
// and planned on c. An error leaves c as it was: the first look on it
// plans them.
//
// It runs beside the fetcher's goroutine (in the background: see
// LookConns), so it reads nothing but the config.
func (f *Fetcher) readyConn(ctx context.Context, c *pgxpool.Conn) error {
	t := f.cfg.Tracking()
	if t == nil {
		return errNoTracking
	}
	var b pgx.Batch
	b.Queue("BEGIN")
	b.Queue(sqlq.LookPlanning)
	if !f.cfg.ByMessageGroup { // a group that reads by message group reads no rows ahead (see readAhead)
		args := t.Stream.Bind(sqlq.Args{"sub": noSubscription, "topic": f.cfg.Topic, "limit": 1})
		b.Queue(f.Statements.FetchRowsAhead.Numbered, f.Statements.FetchRowsAhead.Bind(args)...)
	}
	b.Queue(f.Statements.AnyWork.Numbered, f.Statements.AnyWork.Bind(f.anyWorkArgs(noSubscription))...)
	b.Queue("ROLLBACK")
	return c.SendBatch(ctx, &b).Close()
}

// anyWorkArgs are sqlq's anyWork's arguments for subscription sub.
func (f *Fetcher) anyWorkArgs(sub int64) sqlq.Args {
	return f.cfg.Tracking().Stream.Bind(sqlq.Args{"sub": sub, "topic": f.cfg.Topic, "now": f.Now()})
}

// position is the group's offsets row.
type position struct {
	position  string
	pairCur   *string
	resumeXID *string
	resumeID  *int64
	backfill  *backfill // nil: none pending
}

// backfill is a pending backfill's part of the offsets row.
type backfill struct {
	from, upto   string // the pair it reads now
	more         bool   // pairs are queued behind it (see sqlq's nextBackfillPair)
	afterXID     string // cursor; "0" at the start
	afterID      int64
	left, total  int64
	done         int64
	startedAt    time.Time
	readingEnded bool // cancelled, capped or read to the end: waiting for its batches to finish
}

// fetchOnce is one look (see the top of this file). Its statements are not
// cut off by Stop: a claim cut off after it committed would leave its
// messages leased until the lease expires.
func (f *Fetcher) fetchOnce(limit int, reap bool) (fetchResult, error) {
	f.catchupWait, f.idle = 0, false
	ctx, cancel := context.WithTimeout(context.WithoutCancel(f.ctx), 30*time.Second)
	defer cancel()
	var p position
	var from, upto, bxid *string
	var bid *int64
	var b backfill
	var noJIT bool // see sqlq's lockOffset
	var status, snapshot, mode string
	var bit int
	var mixing, expired, due, locked, found bool
	ahead := f.readAhead(limit)
	tx, err := BeginLook(ctx, f.conns.Acquire, func(batch *pgx.Batch) {
		batch.Queue(f.Statements.LockOffset.Numbered, f.Statements.LockOffset.Bind(sqlq.Args{"sub": f.Subscription})...).QueryRow(func(row pgx.Row) error {
			err := row.Scan(&p.position, &p.pairCur, &p.resumeXID, &p.resumeID,
				&from, &upto, &bxid, &bid, &b.left, &b.total, &b.done, &b.startedAt, &b.readingEnded, &b.more, &noJIT)
			locked = err == nil
			if errors.Is(err, pgx.ErrNoRows) {
				return nil // another instance holds it, or the subscription is gone
			}
			if err != nil {
				return fmt.Errorf("lock position: %w", err)
			}
			return nil
		})
		batch.Queue(f.Statements.FetchState.Numbered, f.Statements.FetchState.Bind(sqlq.Args{"sub": f.Subscription, "now": f.Now()})...).QueryRow(func(row pgx.Row) error {
			err := row.Scan(&status, &snapshot, &bit, &mode, &mixing, &expired, &due)
			found = err == nil
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			if err != nil {
				return fmt.Errorf("read state: %w", err)
			}
			return nil
		})
		if ahead != nil {
			batch.Queue(f.Statements.FetchRowsAhead.Numbered, f.Statements.FetchRowsAhead.Bind(ahead.args)...).Query(func(rows pgx.Rows) error {
				var err error
				ahead.rows, err = f.collectRows(rows, &ahead.cur)
				if err != nil {
					return fmt.Errorf("fetch rows: %w", err)
				}
				return nil
			})
		}
	})
	if err != nil {
		return 0, err
	}
	defer tx.End(ctx)
	if !locked {
		var exists bool
		if err := tx.QueryRow(ctx, f.Statements.OffsetExists.Numbered, f.Statements.OffsetExists.Bind(sqlq.Args{"sub": f.Subscription})...).Scan(&exists); err != nil {
			return 0, fmt.Errorf("lock position: %w", err)
		}
		if !exists {
			return 0, fmt.Errorf("%w: group %q on %q", ErrSubscriptionGone, f.cfg.Group, f.cfg.Topic)
		}
		return fetchBusy, nil
	}
	if from != nil && upto != nil {
		b.from, b.upto, b.afterXID = *from, *upto, "0"
		if bxid != nil && bid != nil {
			b.afterXID, b.afterID = *bxid, *bid
		}
		p.backfill = &b
	}
	if !found {
		return 0, fmt.Errorf("%w: group %q on %q", ErrSubscriptionGone, f.cfg.Group, f.cfg.Topic)
	}
	changed, err := f.cfg.SetTracking(bit, outbox.TrackingMode(mode), mixing)
	if err != nil {
		return 0, fmt.Errorf("read state: %w", err)
	}
	switch status {
	case statusActive:
	case statusCancelled:
		return 0, fmt.Errorf("%w: group %q on %q", ErrCancelled, f.cfg.Group, f.cfg.Topic)
	default:
		f.noReadAhead = true // a paused group's looks would drop the rows
		return fetchInactive, nil
	}

	if reap {
		var expired, gone int64
		if err := tx.QueryRow(ctx, f.Statements.ReapRetries.Numbered, f.Statements.ReapRetries.Bind(sqlq.Args{"sub": f.Subscription, "now": f.Now(), "max_attempts": f.cfg.MaxAttempts})...).
			Scan(&expired, &gone); err != nil {
			return 0, fmt.Errorf("reap retries: %w", err)
		}
		// Logged before the look commits (on one of its several paths): a
		// look that fails is rolled back, and the next one reaps, and
		// counts, the same leases again.
		f.loggedTakeover(expired, "", false)
		f.loggedTakeover(gone, "", true)
		due = due || expired+gone > 0
		tx.Queue("copy dead letters", f.Statements.CopyDeadLetters.Numbered, f.Statements.CopyDeadLetters.Bind(sqlq.Args{"sub": f.Subscription})...)
		if p.backfill != nil && p.backfill.readingEnded {
			tx.Queue("finish backfill", f.Statements.FinishBackfill.Numbered, f.Statements.FinishBackfill.Bind(sqlq.Args{"sub": f.Subscription})...)
		}
		tx.Queue("forget messages set aside", f.Statements.ForgetSetAside.Numbered, f.Statements.ForgetSetAside.Bind(sqlq.Args{"sub": f.Subscription})...)
	}
	if f.cfg.ByMessageGroup {
		if expired { // a batch of an instance that read the stream (before consumergroup.Config.ByMessageGroup was set)
			if took, err := f.takeOver(ctx, tx); err != nil || took {
				return fetchedWork, err
			}
		}
		return f.lookOrdered(ctx, tx, p, snapshot, limit)
	}
	catchup := p.backfill != nil && !p.backfill.readingEnded
	f.noReadAhead = expired || due || catchup
	if changed { // the rows were read with the old mode's stream
		ahead = nil
	}
	if expired {
		if took, err := f.takeOver(ctx, tx); err != nil || took {
			return fetchedWork, err
		}
	}
	if due {
		if n, err := f.claimRetries(ctx, tx, limit); err != nil || n > 0 {
			return fetchedWork, err
		}
	}
	f.backfilling.Store(catchup)
	if p.backfill == nil {
		f.cfg.Looks.NoBackfill()
	}
	if catchup && f.catchupTurn {
		f.catchupTurn = false
		f.readCatchup = true
		if n, err := f.fetchCatchup(ctx, tx, p.backfill, limit); err != nil || n > 0 {
			return fetchedWork, err
		}
	}
	f.catchupTurn = catchup
	res, err := f.fetchBatch(ctx, tx, p, snapshot, limit, ahead)
	f.idle = res == fetchedNothing && err == nil && !catchup && p.backfill == nil
	if res == fetchedNothing && catchup {
		want := max(1, f.catchupSize(p.backfill, limit))
		if f.throttle.ready(time.Now(), want) {
			return fetchedWork, err // the stream is drained: the backfill's turn at once
		}
		f.catchupWait = f.throttle.wait(time.Now(), want)
	}
	return res, err
}

// takeOver moves the messages of one batch whose lease ran out to the
// retry table (and commits), reporting whether there was one.
func (f *Fetcher) takeOver(ctx context.Context, tx *LookTx) (bool, error) {
	var prev, cur, afterXID, lastXID, member string
	var afterID, lastID int64
	var catchup, gone bool
	err := tx.QueryRow(ctx, f.Statements.TakeExpiredBatch.Numbered, f.Statements.TakeExpiredBatch.Bind(sqlq.Args{"sub": f.Subscription, "now": f.Now()})...).
		Scan(&prev, &cur, &afterXID, &afterID, &lastXID, &lastID, &member, &catchup, &gone)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("take over batch: %w", err)
	}
	stream := f.cfg.Tracking().Stream
	if stream.SubID == nil { // the move skips the messages a handler acked in its transaction (see AckTx)
		id := f.Subscription
		stream.SubID = &id
	}
	args := sqlq.Args{"sub": f.Subscription, "now": f.Now(), "topic": f.cfg.Topic, "prev": prev, "cur": cur,
		"after_xid": afterXID, "after_id": afterID, "last_xid": lastXID, "last_id": lastID, "member": member, "catchup": catchup}
	f.cfg.Catchup.Bind(stream.BindDone(stream.Bind(args)))
	var moved int64
	if err := tx.QueryRow(ctx, f.Statements.MoveBatchToRetries.Numbered, f.Statements.MoveBatchToRetries.Bind(args)...).Scan(&moved); err != nil {
		return false, fmt.Errorf("take over batch: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, err
	}
	f.loggedTakeover(moved, member, gone)
	return true, nil
}

// loggedTakeover logs that this instance took over n messages from
// another (a batch of member's, or retry deliveries) because their lease
// had expired or, when gone, because the instance holding them was found
// gone (its client's database session ended: see outbox.Client.LiveInstance):
// at most once per LogInterval and reason, the next record counting those
// left out, so a crashed instance's hundreds of batches cost one line.
func (f *Fetcher) loggedTakeover(n int64, member string, gone bool) {
	if n == 0 {
		return
	}
	reason, key, msg := "lease_expired", "lease-takeover", "pgoutbox: took over messages whose lease had expired (the instance handling them crashed, froze or lost its database); they are retried"
	if gone {
		reason, key, msg = "owner_gone", "owner-gone-takeover", "pgoutbox: took over messages of an instance that is gone (its database session ended: the process died or lost its connection); they are retried at once, before their lease ends"
	}
	f.cfg.TakenOver(context.Background(), n, reason)
	attrs := []slog.Attr{slog.String("event", "takeover"), slog.String("reason", reason)}
	if member != "" {
		attrs = append(attrs, slog.String("member", member))
	}
	f.Events.Sum(slog.LevelWarn, key, msg, "messages", n, attrs...)
}

// claimRetries leases due retries of the group (and commits), and hands
// them out.
func (f *Fetcher) claimRetries(ctx context.Context, tx *LookTx, limit int) (int, error) {
	args := sqlq.Args{"sub": f.Subscription, "member": f.ID, "now": f.Now(), "lease_us": f.cfg.Lease.Microseconds(), "limit": limit}
	query := f.Statements.ClaimRetries
	if f.cfg.ByMessageGroup {
		query = f.Statements.ClaimOrderedRetries
		args["after_group"], args["dead_letter_blocks"], args["run_limit"] = f.walkAfter, f.cfg.DeadLettersBlock, pipeline.OrderedRun
	}
	rows, err := tx.Query(ctx, query.Numbered, query.Bind(args)...)
	if err != nil {
		return 0, fmt.Errorf("claim retries: %w", err)
	}
	ds, err := pgx.CollectRows(rows, func(cr pgx.CollectableRow) (*outbox.Delivery, error) {
		d := &outbox.Delivery{Topic: f.cfg.Topic, MaxAttempts: f.cfg.MaxAttempts}
		var xid string
		var prio int16
		err := cr.Scan(&d.ID, &xid, &d.Payload, &d.Headers, &d.CorrelationID, &d.Group, &prio, &d.CreatedAt, &d.Attempt, &d.LeaseUntil)
		d.Priority = int(prio)
		return d, err
	})
	if err != nil {
		return 0, fmt.Errorf("claim retries: %w", err)
	}
	if len(ds) == 0 {
		return 0, nil
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, err
	}
	if f.cfg.ByMessageGroup {
		f.walkAfter = groupwalk.End(f.walkAfter, ds, func(d *outbox.Delivery) string { return d.Group })
	}
	jobs := make([]*pipeline.Job, len(ds))
	ids := make([]int64, len(ds))
	for i, d := range ds {
		jobs[i], ids[i] = &pipeline.Job{D: d}, d.ID
	}
	f.Held.Add(0, ids)
	f.dispatch(jobs)
	return len(ds), nil
}

type row struct {
	d         *outbox.Delivery
	xid       string
	due       time.Time // when the message is available (Delay, NotBefore)
	scheduled bool      // sent to be available later and not due yet: it waits in the retry table (see park)
}

// idlePositionEvery is how often a look that found nothing new moves the
// position to its snapshot anyway. Every move is a new version of the
// offsets row, which nothing can reclaim while a transaction elsewhere
// holds the database's xmin back, and every fetch walks the versions it
// cannot reclaim; an idle group polling every few milliseconds wrote
// hundreds a second. A position left behind costs little: the next look
// reads only what its snapshot had not seen (see sqlq's unseenRows), and
// it lags only while nothing new is there for the group (an idle
// instance looks in full once every idleFullLookEvery).
const idlePositionEvery = time.Second

// fetchBatch reads the next rows of the snapshot pair, records them as a
// batch with a lease and moves the position, and commits.
func (f *Fetcher) fetchBatch(ctx context.Context, tx *LookTx, p position, snapshot string, limit int, ahead *rowsAhead) (fetchResult, error) {
	pr, err := f.nextRows(ctx, tx, p, snapshot, limit, ahead)
	if err != nil {
		return 0, err
	}
	if len(pr.rows) == 0 {
		return fetchedNothing, tx.Commit(ctx)
	}
	if !pr.exhausted || p.pairCur != nil { // rows are left behind this batch
		if err := f.takeAhead(ctx, tx, pr, snapshot, limit); err != nil {
			return 0, err
		}
	}
	if err := f.recordBatch(ctx, tx, pr.prev, pr.cur, pr.afterXID, pr.afterID, pr.rows, false); err != nil {
		return 0, err
	}
	return fetchedWork, nil
}

// takeAhead, in tx, takes up to limit messages of a priority above 0 from
// the rows the stream has not read once pr is read (sqlq's takeAhead): the
// next look claims them from the retry table, ahead of the backlog, as
// soon as the window has room for one (see pipeline.Window.Urge).
func (f *Fetcher) takeAhead(ctx context.Context, tx *LookTx, pr pairRows, snapshot string, limit int) error {
	position, pairCur := pr.cur, (*string)(nil) // the read reached the end of the pair
	var resumeXID *string
	var resumeID *int64
	if !pr.exhausted {
		last := pr.rows[len(pr.rows)-1]
		position, pairCur, resumeXID, resumeID = pr.prev, &pr.cur, &last.xid, &last.d.ID
	}
	args := f.cfg.Tracking().Stream.Bind(sqlq.Args{"sub": f.Subscription, "topic": f.cfg.Topic, "snapshot": snapshot,
		"position": position, "pair_cur": pairCur, "resume_xid": resumeXID, "resume_id": resumeID, "now": f.Now(), "limit": limit})
	tx.Queue("take prioritized messages ahead", f.Statements.TakeAhead.Numbered, f.Statements.TakeAhead.Bind(args)...).
		QueryRow(func(row pgx.Row) error { return row.Scan(&f.tookAhead) })
	return nil
}

// pairRows are rows read from a snapshot pair.
type pairRows struct {
	prev, cur, afterXID string // the pair, and the rows' start after (afterXID, afterID)
	afterID             int64
	rows                []row
	exhausted           bool // no rows of the pair are left after these
}

// nextRows reads the next rows of the snapshot pair in progress, or of a
// new pair ending at snapshot, at most limit, and moves the position past
// them (when nothing new came, at most every idlePositionEvery). Rows read
// ahead (non-nil ahead) are those rows: a new pair then ends at the
// snapshot their read took, later than snapshot (when they are none, the
// pair ending at snapshot holds none either).
func (f *Fetcher) nextRows(ctx context.Context, tx *LookTx, p position, snapshot string, limit int, ahead *rowsAhead) (pairRows, error) {
	pr := pairRows{prev: p.position, cur: snapshot, afterXID: "0"}
	if p.pairCur != nil {
		pr.cur, pr.afterXID, pr.afterID = *p.pairCur, *p.resumeXID, *p.resumeID
	}
	var got []row
	if ahead != nil {
		if got = ahead.rows; len(got) > 0 {
			pr.cur = ahead.cur
		}
	} else {
		args := f.cfg.Tracking().Stream.Bind(sqlq.Args{"topic": f.cfg.Topic, "prev": pr.prev, "cur": pr.cur,
			"after_xid": pr.afterXID, "after_id": pr.afterID, "limit": limit, "sub": f.Subscription})
		var err error
		if got, err = f.readRows(ctx, tx, f.Statements.FetchRows.Numbered, f.Statements.FetchRows.Bind(args)...); err != nil {
			return pr, fmt.Errorf("fetch rows: %w", err)
		}
	}
	pr.rows, pr.exhausted = got, len(got) < limit
	switch {
	case len(got) == 0 && p.pairCur == nil && time.Since(f.idleSince) < idlePositionEvery:
		// nothing new: the position stays (no row version written)
	case pr.exhausted: // the position moves to cur
		if len(got) == 0 && p.pairCur == nil {
			f.idleSince = time.Now()
		}
		tx.Queue("advance position", f.Statements.AdvanceOffset.Numbered,
			f.Statements.AdvanceOffset.Bind(sqlq.Args{"sub": f.Subscription, "position": pr.cur, "pair_cur": nil, "resume_xid": nil, "resume_id": nil})...)
	default:
		last := got[len(got)-1]
		tx.Queue("advance position", f.Statements.AdvanceOffset.Numbered,
			f.Statements.AdvanceOffset.Bind(sqlq.Args{"sub": f.Subscription, "position": pr.prev, "pair_cur": pr.cur, "resume_xid": last.xid, "resume_id": last.d.ID})...)
	}
	return pr, nil
}

// readRows reads messages (the columns of sqlq's nextUnseenRows) as first
// deliveries.
func (f *Fetcher) readRows(ctx context.Context, tx *LookTx, query string, args ...any) ([]row, error) {
	rows, err := tx.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return f.collectRows(rows)
}

// collectRows collects rows read by readRows, or by sqlq's fetchRowsAhead,
// whose last column (the pair's end) goes to cur. Whether one is scheduled
// (sent to be available later than it was written, and not due yet) is the
// database's answer, or by the group's clock when it has one.
func (f *Fetcher) collectRows(rows pgx.Rows, cur ...any) ([]row, error) {
	now := f.Now()
	return pgx.CollectRows(rows, func(cr pgx.CollectableRow) (row, error) {
		d := &outbox.Delivery{Topic: f.cfg.Topic, MaxAttempts: f.cfg.MaxAttempts, Attempt: 1}
		var x row
		var prio int16
		err := cr.Scan(append([]any{&d.ID, &x.xid, &d.Payload, &d.Headers, &d.CorrelationID, &d.Group, &prio, &d.CreatedAt,
			&x.due, &x.scheduled}, cur...)...)
		if now != nil {
			x.scheduled = x.due.After(d.CreatedAt) && x.due.After(*now)
		}
		d.Priority, x.d = int(prio), d
		return x, err
	})
}

// rowsAhead are the rows a look read ahead (see readAhead).
type rowsAhead struct {
	args sqlq.Args // sqlq's fetchRowsAhead's
	rows []row     // what it read
	cur  string    // the end of the pair they belong to
}

// readAhead says whether the look about to begin reads its stream in the
// round trip that begins it (sqlq's fetchRowsAhead), and with what: an
// unordered group's look does, unless the last look took over a batch,
// claimed retries or had a backfill pending (this one then likely does
// the same, and would drop the rows).
func (f *Fetcher) readAhead(limit int) *rowsAhead {
	t := f.cfg.Tracking()
	if f.cfg.ByMessageGroup || f.noReadAhead || t == nil {
		return nil
	}
	return &rowsAhead{args: t.Stream.Bind(sqlq.Args{"sub": f.Subscription, "topic": f.cfg.Topic, "limit": limit})}
}

// park puts rows in the group's retry table, in tx, as retries that never
// ran (sqlq's parkRows), available now, or a scheduled one from its due
// time: an ordered group's queue, and every group's scheduled messages.
func (f *Fetcher) park(ctx context.Context, tx *LookTx, rows []row) error {
	if len(rows) == 0 {
		return nil
	}
	ids, groups, due := make([]int64, len(rows)), make([]string, len(rows)), make([]*time.Time, len(rows))
	for i, x := range rows {
		ids[i] = x.d.ID
		if x.scheduled {
			due[i] = &x.due
		}
		if f.cfg.ByMessageGroup { // the queue is walked by message group
			groups[i] = x.d.Group
		}
	}
	tx.Queue("park rows", f.Statements.ParkRows.Numbered,
		f.Statements.ParkRows.Bind(sqlq.Args{"sub": f.Subscription, "now": f.Now(), "message_ids": ids, "message_groups": groups, "dues": due})...)
	f.parked(len(rows))
	return nil
}

// recordBatch records rows as a batch of pair (prev, cur) after
// (afterXID, afterID) with a lease, commits, and hands them out.
//
// An ordered group queues them instead (see lookOrdered), and does not
// commit.
//
// Scheduled rows are parked in the retry table until they are due (see
// park) and recorded as set aside; the batch, which still spans them, is
// the rest. A takeover of the batch reads its rows again and skips them,
// parked or already handled.
func (f *Fetcher) recordBatch(ctx context.Context, tx *LookTx, prev, cur, afterXID string, afterID int64, got []row, catchup bool) error {
	if f.cfg.ByMessageGroup {
		return f.park(ctx, tx, got)
	}
	last := got[len(got)-1]
	if slices.ContainsFunc(got, func(x row) bool { return x.scheduled }) {
		var due, later []row
		for _, x := range got {
			if x.scheduled {
				later = append(later, x)
			} else {
				due = append(due, x)
			}
		}
		if err := f.park(ctx, tx, later); err != nil {
			return err
		}
		ids, xids := make([]int64, len(later)), make([]string, len(later))
		for i, x := range later {
			ids[i], xids[i] = x.d.ID, x.xid
		}
		tx.Queue("set scheduled messages aside", f.Statements.SetAside.Numbered, f.Statements.SetAside.Bind(sqlq.Args{"sub": f.Subscription, "message_ids": ids, "xids": xids})...)
		if got = due; len(got) == 0 {
			return tx.Commit(ctx)
		}
	}
	var bid int64
	var leaseUntil time.Time
	tx.Queue("record batch", f.Statements.InsertBatch.Numbered, f.Statements.InsertBatch.Bind(sqlq.Args{"sub": f.Subscription, "prev": prev, "cur": cur,
		"after_xid": afterXID, "after_id": afterID, "last_xid": last.xid, "last_id": last.d.ID,
		"member": f.ID, "now": f.Now(), "lease_us": f.cfg.Lease.Microseconds(), "catchup": catchup})...).
		QueryRow(func(row pgx.Row) error { return row.Scan(&bid, &leaseUntil) })
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	b := pipeline.NewBatch(bid, len(got))
	jobs := make([]*pipeline.Job, len(got))
	for i, x := range got {
		x.d.LeaseUntil = leaseUntil
		jobs[i] = &pipeline.Job{D: x.d, Batch: b}
	}
	f.Held.Add(bid, nil)
	f.dispatch(jobs)
	return nil
}

// dispatch hands jobs to the executor, counting them.
func (f *Fetcher) dispatch(jobs []*pipeline.Job) {
	f.cfg.Delivered(context.Background(), int64(len(jobs)))
	f.cfg.Tracer.Received(context.Background(), f.cfg.Topic, f.cfg.Group, len(jobs), f.lastFullLook)
	f.cfg.Exec.Dispatch(jobs)
}
