package consumergroup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/engine"
	"github.com/pgoutbox/pgoutbox/internal/groupwalk"
	"github.com/pgoutbox/pgoutbox/internal/pipeline"
	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// The fetcher: one goroutine per instance, running a pipeline.Loop whose
// looks are the runner's look. It owns lastReap and the backfill throttle.
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
// BackfillRate rows a second, and paused while the reads' p95 latency is
// above BackfillTargetLatency (the database is busy with other work).

// fetchResult says what a look found.
type fetchResult int

const (
	fetchedNothing fetchResult = iota // the stream is drained
	fetchedWork                       // look again at once
	fetchBusy                         // another instance is fetching
	fetchInactive                     // PAUSED or DEAD
)

func (r *runner) fetch() {
	g := r.g
	defer r.conns.Wait()
	r.conns.Warm()
	loop := pipeline.Loop{
		Window:       r.window,
		Wake:         r.wake,
		PollInterval: g.cfg.PollInterval,
		// Executors are not tracked as idle or busy: fetched work waiting
		// in the channel means none is idle with nothing to take.
		Waiting: r.exec.Waiting,
		Look:    r.look,
		Logger:  g.logger,
	}
	loop.Run(r.fetchCtx)
}

// look looks for work: in full (fetchOnce), or, when the last full look
// found nothing and was less than idleFullLookEvery ago and no
// notification of the topic came since, first with one statement that
// tells whether a full look could find anything (sqlq's anyWork). A full
// look reaps retries when PollInterval has passed since the last that did
// (lastReap).
func (r *runner) look(limit int, notified bool) (pipeline.Found, error) {
	g := r.g
	if !r.canFetch() {
		if !r.silent {
			r.silent = true
			g.logger.Warn("pgoutbox: this instance sent no heartbeat for its HeartbeatTimeout: it fetches nothing until one goes through (to the others the group may be DEAD)")
		}
		return pipeline.Found{Retry: g.cfg.PollInterval}, nil
	}
	r.silent = false
	if r.idle && !notified && time.Since(r.lastFullLook) < idleFullLookEvery {
		work, err := r.anyWork()
		if err == nil && !work {
			r.looks.record(nil, time.Now())
			return pipeline.Found{}, nil // nothing to do
		}
		if r.fetchCtx.Err() != nil {
			return pipeline.Found{}, nil // stopping
		} // on an error, the full look reports it
	}
	reap := time.Since(r.lastReap) >= g.cfg.PollInterval
	if reap {
		r.lastReap = time.Now()
	}
	r.lastFullLook = time.Now()
	res, err := r.fetchOnce(limit, reap)
	g.metrics.fetchTime.Record(r.fetchCtx, time.Since(r.lastFullLook).Seconds())
	if r.fetchCtx.Err() == nil {
		r.looks.record(err, time.Now())
	}
	if errors.Is(err, ErrSubscriptionGone) || errors.Is(err, ErrCancelled) {
		r.end(err)
		return pipeline.Found{Done: true}, nil
	}
	switch res {
	case fetchedWork:
		return pipeline.Found{More: true}, err
	case fetchBusy:
		return pipeline.Found{Retry: min(g.cfg.PollInterval, 5*time.Millisecond)}, err
	case fetchInactive:
		return pipeline.Found{Retry: g.cfg.PollInterval}, err
	}
	return pipeline.Found{Within: r.catchupWait}, err
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
func (r *runner) anyWork() (bool, error) {
	g := r.g
	ctx, cancel := context.WithTimeout(r.fetchCtx, 30*time.Second)
	defer cancel()
	args := r.anyWorkArgs(g.sub.ID)
	var status, mode string
	var bit int
	var mixing, work, gone bool
	var b pgx.Batch
	b.Queue("BEGIN READ ONLY")
	b.Queue(sqlq.LookPlanning)
	b.Queue(g.q.AnyWork.Numbered, g.q.AnyWork.Bind(args)...).QueryRow(func(row pgx.Row) error {
		err := row.Scan(&status, &bit, &mode, &mixing, &work)
		gone = errors.Is(err, pgx.ErrNoRows)
		if gone {
			return nil
		}
		return err
	})
	b.Queue("COMMIT")
	conn, err := r.conns.Acquire(ctx)
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
	changed, err := g.setTracking(bit, outbox.TrackingMode(mode), mixing)
	return work || changed || State(status) != Active, err
}

// anyWorkArgs are sqlq's anyWork's arguments for subscription sub.
func (r *runner) anyWorkArgs(sub int64) sqlq.Args {
	g := r.g
	return g.tracking().stream.bind(sqlq.Args{"sub": sub, "topic": g.cfg.Topic, "now": g.now()})
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
func (r *runner) fetchOnce(limit int, reap bool) (fetchResult, error) {
	g := r.g
	r.catchupWait, r.idle = 0, false
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.fetchCtx), 30*time.Second)
	defer cancel()
	var p position
	var from, upto, bxid *string
	var bid *int64
	var b backfill
	var noJIT bool // see sqlq's lockOffset
	var status, snapshot, mode string
	var bit int
	var mixing, expired, due, locked, found bool
	ahead := r.readAhead(limit)
	tx, err := engine.BeginLook(ctx, r.conns.Acquire, func(batch *pgx.Batch) {
		batch.Queue(g.q.LockOffset, pgx.StrictNamedArgs{"sub": g.sub.ID}).QueryRow(func(row pgx.Row) error {
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
		batch.Queue(g.q.FetchState, pgx.StrictNamedArgs{"sub": g.sub.ID, "now": g.now()}).QueryRow(func(row pgx.Row) error {
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
			batch.Queue(g.q.FetchRowsAhead.Numbered, g.q.FetchRowsAhead.Bind(ahead.args)...).Query(func(rows pgx.Rows) error {
				var err error
				ahead.rows, err = r.collectRows(rows, &ahead.cur)
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
		if err := tx.QueryRow(ctx, g.q.OffsetExists, pgx.StrictNamedArgs{"sub": g.sub.ID}).Scan(&exists); err != nil {
			return 0, fmt.Errorf("lock position: %w", err)
		}
		if !exists {
			return 0, fmt.Errorf("%w: group %q on %q", ErrSubscriptionGone, g.cfg.Group, g.cfg.Topic)
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
		return 0, fmt.Errorf("%w: group %q on %q", ErrSubscriptionGone, g.cfg.Group, g.cfg.Topic)
	}
	changed, err := g.setTracking(bit, outbox.TrackingMode(mode), mixing)
	if err != nil {
		return 0, fmt.Errorf("read state: %w", err)
	}
	switch State(status) {
	case Active:
	case Cancelled:
		return 0, fmt.Errorf("%w: group %q on %q", ErrCancelled, g.cfg.Group, g.cfg.Topic)
	default:
		r.noReadAhead = true // a paused group's looks would drop the rows
		return fetchInactive, nil
	}

	if reap {
		var expired, gone int64
		if err := tx.QueryRow(ctx, g.q.ReapRetries, pgx.StrictNamedArgs{"sub": g.sub.ID, "now": g.now(), "max_attempts": g.topic.MaxAttempts}).
			Scan(&expired, &gone); err != nil {
			return 0, fmt.Errorf("reap retries: %w", err)
		}
		// Logged before the look commits (on one of its several paths): a
		// look that fails is rolled back, and the next one reaps, and
		// counts, the same leases again.
		r.loggedTakeover(expired, "", false)
		r.loggedTakeover(gone, "", true)
		due = due || expired+gone > 0
		tx.Queue("copy dead letters", g.q.CopyDeadLetters, pgx.StrictNamedArgs{"sub": g.sub.ID})
		if p.backfill != nil && p.backfill.readingEnded {
			tx.Queue("finish backfill", g.q.FinishBackfill, pgx.StrictNamedArgs{"sub": g.sub.ID})
		}
		tx.Queue("forget messages set aside", g.q.ForgetSetAside, pgx.StrictNamedArgs{"sub": g.sub.ID})
	}
	if g.byMessageGroup() {
		if expired { // a batch of an instance that read the stream (before Config.ByMessageGroup was set)
			if took, err := r.takeOver(ctx, tx); err != nil || took {
				return fetchedWork, err
			}
		}
		return r.lookOrdered(ctx, tx, p, snapshot, limit)
	}
	catchup := p.backfill != nil && !p.backfill.readingEnded
	r.noReadAhead = expired || due || catchup
	if changed { // the rows were read with the old mode's stream
		ahead = nil
	}
	if expired {
		if took, err := r.takeOver(ctx, tx); err != nil || took {
			return fetchedWork, err
		}
	}
	if due {
		if n, err := r.claimRetries(ctx, tx, limit); err != nil || n > 0 {
			return fetchedWork, err
		}
	}
	r.backfilling.Store(catchup)
	if p.backfill == nil {
		r.looks.noBackfill()
	}
	if catchup && r.catchupTurn {
		r.catchupTurn = false
		r.looks.readCatchup = true
		if n, err := r.fetchCatchup(ctx, tx, p.backfill, limit); err != nil || n > 0 {
			return fetchedWork, err
		}
	}
	r.catchupTurn = catchup
	res, err := r.fetchBatch(ctx, tx, p, snapshot, limit, ahead)
	r.idle = res == fetchedNothing && err == nil && !catchup && p.backfill == nil
	if res == fetchedNothing && catchup {
		want := max(1, r.catchupSize(p.backfill, limit))
		if r.throttle.ready(time.Now(), want) {
			return fetchedWork, err // the stream is drained: the backfill's turn at once
		}
		r.catchupWait = r.throttle.wait(time.Now(), want)
	}
	return res, err
}

// takeOver moves the messages of one batch whose lease ran out to the
// retry table (and commits), reporting whether there was one.
func (r *runner) takeOver(ctx context.Context, tx *engine.LookTx) (bool, error) {
	g := r.g
	var prev, cur, afterXID, lastXID, member string
	var afterID, lastID int64
	var catchup, gone bool
	err := tx.QueryRow(ctx, g.q.TakeExpiredBatch, pgx.StrictNamedArgs{"sub": g.sub.ID, "now": g.now()}).
		Scan(&prev, &cur, &afterXID, &afterID, &lastXID, &lastID, &member, &catchup, &gone)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("take over batch: %w", err)
	}
	stream := g.tracking().stream
	if stream.subID == nil { // the move skips the messages a handler acked in its transaction (see AckTx)
		id := g.sub.ID
		stream.subID = &id
	}
	args := sqlq.Args{"sub": g.sub.ID, "now": g.now(), "topic": g.cfg.Topic, "prev": prev, "cur": cur,
		"after_xid": afterXID, "after_id": afterID, "last_xid": lastXID, "last_id": lastID, "member": member, "catchup": catchup}
	catchupFor(g.subRow).bind(stream.bindDone(stream.bind(args)))
	var moved int64
	if err := tx.QueryRow(ctx, g.q.MoveBatchToRetries.Numbered, g.q.MoveBatchToRetries.Bind(args)...).Scan(&moved); err != nil {
		return false, fmt.Errorf("take over batch: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, err
	}
	r.loggedTakeover(moved, member, gone)
	return true, nil
}

// loggedTakeover logs that this instance took over n messages from
// another (a batch of member's, or retry deliveries) because their lease
// had expired or, when gone, because the instance holding them was found
// gone (its client's database session ended: see outbox.Client.LiveInstance):
// at most once per LogInterval and reason, the next record counting those
// left out, so a crashed instance's hundreds of batches cost one line.
func (r *runner) loggedTakeover(n int64, member string, gone bool) {
	if n == 0 {
		return
	}
	reason, key, msg := "lease_expired", "lease-takeover", "pgoutbox: took over messages whose lease had expired (the instance handling them crashed, froze or lost its database); they are retried"
	if gone {
		reason, key, msg = "owner_gone", "owner-gone-takeover", "pgoutbox: took over messages of an instance that is gone (its database session ended: the process died or lost its connection); they are retried at once, before their lease ends"
	}
	r.g.metrics.takenOver.Add(context.Background(), n, reason)
	attrs := []slog.Attr{slog.String("event", "takeover"), slog.String("reason", reason)}
	if member != "" {
		attrs = append(attrs, slog.String("member", member))
	}
	r.g.events.Sum(slog.LevelWarn, key, msg, "messages", n, attrs...)
}

// claimRetries leases due retries of the group (and commits), and hands
// them out.
func (r *runner) claimRetries(ctx context.Context, tx *engine.LookTx, limit int) (int, error) {
	g := r.g
	args := sqlq.Args{"sub": g.sub.ID, "member": g.cfg.InstanceID, "now": g.now(), "lease_us": g.topic.Lease.Microseconds(), "limit": limit}
	query := g.q.ClaimRetries
	if g.byMessageGroup() {
		query = g.q.ClaimOrderedRetries
		args["after_group"], args["dead_letter_blocks"], args["run_limit"] = r.walkAfter, g.deadLettersBlock(), pipeline.OrderedRun
	}
	rows, err := tx.Query(ctx, query.Numbered, query.Bind(args)...)
	if err != nil {
		return 0, fmt.Errorf("claim retries: %w", err)
	}
	ds, err := pgx.CollectRows(rows, func(cr pgx.CollectableRow) (*outbox.Delivery, error) {
		d := &outbox.Delivery{Topic: g.cfg.Topic, MaxAttempts: g.topic.MaxAttempts}
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
	if g.byMessageGroup() {
		r.walkAfter = groupwalk.End(r.walkAfter, ds, func(d *outbox.Delivery) string { return d.Group })
	}
	jobs := make([]*pipeline.Job, len(ds))
	ids := make([]int64, len(ds))
	for i, d := range ds {
		jobs[i], ids[i] = &pipeline.Job{D: d}, d.ID
	}
	r.held.Add(0, ids)
	r.dispatch(jobs)
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
func (r *runner) fetchBatch(ctx context.Context, tx *engine.LookTx, p position, snapshot string, limit int, ahead *rowsAhead) (fetchResult, error) {
	pr, err := r.nextRows(ctx, tx, p, snapshot, limit, ahead)
	if err != nil {
		return 0, err
	}
	if len(pr.rows) == 0 {
		return fetchedNothing, tx.Commit(ctx)
	}
	if !pr.exhausted || p.pairCur != nil { // rows are left behind this batch
		if err := r.takeAhead(ctx, tx, pr, snapshot, limit); err != nil {
			return 0, err
		}
	}
	if err := r.recordBatch(ctx, tx, pr.prev, pr.cur, pr.afterXID, pr.afterID, pr.rows, false); err != nil {
		return 0, err
	}
	return fetchedWork, nil
}

// takeAhead, in tx, takes up to limit messages of a priority above 0 from
// the rows the stream has not read once pr is read (sqlq's takeAhead): the
// next look claims them from the retry table, ahead of the backlog.
func (r *runner) takeAhead(ctx context.Context, tx *engine.LookTx, pr pairRows, snapshot string, limit int) error {
	g := r.g
	position, pairCur := pr.cur, (*string)(nil) // the read reached the end of the pair
	var resumeXID *string
	var resumeID *int64
	if !pr.exhausted {
		last := pr.rows[len(pr.rows)-1]
		position, pairCur, resumeXID, resumeID = pr.prev, &pr.cur, &last.xid, &last.d.ID
	}
	args := g.tracking().stream.bind(sqlq.Args{"sub": g.sub.ID, "topic": g.cfg.Topic, "snapshot": snapshot,
		"position": position, "pair_cur": pairCur, "resume_xid": resumeXID, "resume_id": resumeID, "now": g.now(), "limit": limit})
	tx.Queue("take prioritized messages ahead", g.q.TakeAhead.Numbered, g.q.TakeAhead.Bind(args)...)
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
func (r *runner) nextRows(ctx context.Context, tx *engine.LookTx, p position, snapshot string, limit int, ahead *rowsAhead) (pairRows, error) {
	g := r.g
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
		args := g.tracking().stream.bind(sqlq.Args{"topic": g.cfg.Topic, "prev": pr.prev, "cur": pr.cur,
			"after_xid": pr.afterXID, "after_id": pr.afterID, "limit": limit, "sub": g.sub.ID})
		var err error
		if got, err = r.readRows(ctx, tx, g.q.FetchRows.Numbered, g.q.FetchRows.Bind(args)...); err != nil {
			return pr, fmt.Errorf("fetch rows: %w", err)
		}
	}
	pr.rows, pr.exhausted = got, len(got) < limit
	switch {
	case len(got) == 0 && p.pairCur == nil && time.Since(r.idleSince) < idlePositionEvery:
		// nothing new: the position stays (no row version written)
	case pr.exhausted: // the position moves to cur
		if len(got) == 0 && p.pairCur == nil {
			r.idleSince = time.Now()
		}
		tx.Queue("advance position", g.q.AdvanceOffset,
			pgx.StrictNamedArgs{"sub": g.sub.ID, "position": pr.cur, "pair_cur": nil, "resume_xid": nil, "resume_id": nil})
	default:
		last := got[len(got)-1]
		tx.Queue("advance position", g.q.AdvanceOffset,
			pgx.StrictNamedArgs{"sub": g.sub.ID, "position": pr.prev, "pair_cur": pr.cur, "resume_xid": last.xid, "resume_id": last.d.ID})
	}
	return pr, nil
}

// readRows reads messages (the columns of sqlq's nextUnseenRows) as first
// deliveries.
func (r *runner) readRows(ctx context.Context, tx *engine.LookTx, query string, args ...any) ([]row, error) {
	rows, err := tx.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return r.collectRows(rows)
}

// collectRows collects rows read by readRows, or by sqlq's fetchRowsAhead,
// whose last column (the pair's end) goes to cur. Whether one is scheduled
// (sent to be available later than it was written, and not due yet) is the
// database's answer, or by the group's clock when it has one.
func (r *runner) collectRows(rows pgx.Rows, cur ...any) ([]row, error) {
	g := r.g
	now := g.now()
	return pgx.CollectRows(rows, func(cr pgx.CollectableRow) (row, error) {
		d := &outbox.Delivery{Topic: g.cfg.Topic, MaxAttempts: g.topic.MaxAttempts, Attempt: 1}
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
func (r *runner) readAhead(limit int) *rowsAhead {
	g := r.g
	t := g.tracking()
	if g.byMessageGroup() || r.noReadAhead || t == nil {
		return nil
	}
	return &rowsAhead{args: t.stream.bind(sqlq.Args{"sub": g.sub.ID, "topic": g.cfg.Topic, "limit": limit})}
}

// park puts rows in the group's retry table, in tx, as retries that never
// ran (sqlq's parkRows), available now, or a scheduled one from its due
// time: an ordered group's queue, and every group's scheduled messages.
func (r *runner) park(ctx context.Context, tx *engine.LookTx, rows []row) error {
	if len(rows) == 0 {
		return nil
	}
	g := r.g
	ids, groups, due := make([]int64, len(rows)), make([]string, len(rows)), make([]*time.Time, len(rows))
	for i, x := range rows {
		ids[i] = x.d.ID
		if x.scheduled {
			due[i] = &x.due
		}
		if g.byMessageGroup() { // the queue is walked by message group
			groups[i] = x.d.Group
		}
	}
	tx.Queue("park rows", g.q.ParkRows,
		pgx.StrictNamedArgs{"sub": g.sub.ID, "now": g.now(), "message_ids": ids, "message_groups": groups, "dues": due})
	r.parked(len(rows))
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
func (r *runner) recordBatch(ctx context.Context, tx *engine.LookTx, prev, cur, afterXID string, afterID int64, got []row, catchup bool) error {
	g := r.g
	if g.byMessageGroup() {
		return r.park(ctx, tx, got)
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
		if err := r.park(ctx, tx, later); err != nil {
			return err
		}
		ids, xids := make([]int64, len(later)), make([]string, len(later))
		for i, x := range later {
			ids[i], xids[i] = x.d.ID, x.xid
		}
		tx.Queue("set scheduled messages aside", g.q.SetAside, pgx.StrictNamedArgs{"sub": g.sub.ID, "message_ids": ids, "xids": xids})
		if got = due; len(got) == 0 {
			return tx.Commit(ctx)
		}
	}
	var bid int64
	var leaseUntil time.Time
	tx.Queue("record batch", g.q.InsertBatch, pgx.StrictNamedArgs{"sub": g.sub.ID, "prev": prev, "cur": cur,
		"after_xid": afterXID, "after_id": afterID, "last_xid": last.xid, "last_id": last.d.ID,
		"member": g.cfg.InstanceID, "now": g.now(), "lease_us": g.topic.Lease.Microseconds(), "catchup": catchup}).
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
	r.held.Add(bid, nil)
	r.dispatch(jobs)
	return nil
}

// dispatch hands jobs to the executor, counting them.
func (r *runner) dispatch(jobs []*pipeline.Job) {
	g := r.g
	g.metrics.delivered.Add(context.Background(), int64(len(jobs)))
	g.tracer.Received(context.Background(), g.cfg.Topic, g.cfg.Group, len(jobs), r.lastFullLook)
	r.exec.Dispatch(jobs)
}
