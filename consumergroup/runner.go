package consumergroup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bits-and-blooms/bloom/v3"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/backoff"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/pubsub"
)

// runner is a started instance's machinery. Goroutines: one fetcher, the
// handler workers, one completer, one heartbeat loop, the LISTEN connection.
type runner struct {
	g       *Group
	members atomic.Pointer[[]member]
	status  atomic.Value // State, refreshed by heartbeats

	hbPool    *pgxpool.Pool
	ownHBPool bool
	wake      <-chan struct{}
	unsub     func()
	bloomMu   sync.Mutex         // the fetcher reads the filter, the completer writes it
	bloom     *bloom.BloomFilter // counter mode: ids this instance completed

	fetchCtx    context.Context
	fetchCancel context.CancelFunc
	workCtx     context.Context
	workCancel  context.CancelFunc
	stopping    atomic.Bool
	inflight    atomic.Int64  // messages fetched and not yet settled
	jobs        chan *job     // fetcher → workers; closed by stop
	finished    chan settled  // workers → completer; closed by stop
	room        chan struct{} // completer → fetcher
	fetchWG     sync.WaitGroup
	workWG      sync.WaitGroup
	doneWG      sync.WaitGroup
	lastReap    time.Time // fetcher only
}

// batch is a fetched batch being handled. remaining is touched by workers.
type batch struct {
	id        int64
	deadline  time.Time
	size      int
	remaining atomic.Int64
	mu        sync.Mutex // guards the outcome lists
	acked     []int64
	failed    []failure
	released  bool
}

type failure struct {
	id       int64
	attempts int
	delay    time.Duration
	dead     bool
	err      string
}

type job struct {
	d        *outbox.Delivery
	batch    *batch    // nil for a retry delivery
	deadline time.Time // retry deliveries: when the handler's context ends
	done     bool      // already completed by the group (re-read batch): ack without handling
}

type settled struct {
	batch *batch    // a whole batch, or
	retry *retryOut // one retry delivery
	count int
}

type retryOut struct {
	id      int64
	ack     bool
	release bool
	f       failure
}

func (g *Group) newRunner() (*runner, error) {
	r := &runner{g: g}
	members := g.members
	r.members.Store(&members)
	r.status.Store(Active)
	r.hbPool = g.cfg.HeartbeatPool
	if r.hbPool == nil {
		pc := g.pool.Config().Copy()
		pc.MaxConns, pc.MinConns = 2, 0
		p, err := pgxpool.NewWithConfig(context.Background(), pc)
		if err != nil {
			return nil, fmt.Errorf("consumergroup: heartbeat pool: %w", err)
		}
		r.hbPool, r.ownHBPool = p, true
	}
	if g.topic.Tracking == outbox.Counter {
		r.bloom = newBloom()
	}
	capacity := g.cfg.Concurrency + g.cfg.BatchSize
	r.jobs = make(chan *job, capacity)
	r.finished = make(chan settled, capacity)
	r.room = make(chan struct{}, 1)
	r.fetchCtx, r.fetchCancel = context.WithCancel(context.Background())
	r.workCtx, r.workCancel = context.WithCancel(context.Background())
	return r, nil
}

func (r *runner) start() {
	r.wake, r.unsub = r.g.client.WakeUps(r.g.cfg.Topic)
	r.doneWG.Add(1)
	go r.complete()
	for range r.g.cfg.Concurrency {
		r.workWG.Add(1)
		go r.work()
	}
	r.fetchWG.Add(2)
	go r.fetch()
	go r.heartbeat()
}

func (r *runner) stop(ctx context.Context) error {
	r.stopping.Store(true)
	r.fetchCancel()
	r.fetchWG.Wait()
	close(r.jobs)
	workersDone := make(chan struct{})
	go func() { r.workWG.Wait(); close(workersDone) }()
	var err error
	select {
	case <-workersDone:
	case <-ctx.Done():
		err = ctx.Err()
		r.workCancel()
		<-workersDone
	}
	r.workCancel()
	close(r.finished)
	r.doneWG.Wait()
	r.unsub()
	if r.ownHBPool {
		r.hbPool.Close()
	}
	return err
}

// ---------------------------------------------------------------- fetching

func (r *runner) fetch() {
	defer r.fetchWG.Done()
	g := r.g
	capacity := int64(g.cfg.Concurrency + g.cfg.BatchSize)
	threshold := int64(max(1, g.cfg.BatchSize/2))
	poll := time.NewTimer(g.cfg.PollInterval)
	defer poll.Stop()
	failures, quiet := 0, 30
	for r.fetchCtx.Err() == nil {
		if r.status.Load().(State) != Active {
			r.sleep(poll, g.cfg.PollInterval) // PAUSED (or DEAD until resurrected)
			continue
		}
		free := capacity - r.inflight.Load()
		if free < threshold {
			select {
			case <-r.fetchCtx.Done():
			case <-r.room:
			}
			continue
		}
		n, busy, err := r.fetchOnce(int(min(free, int64(g.cfg.BatchSize))))
		if err != nil {
			failures++
			delay := min(backoff.Exponential(failures, 10*time.Millisecond, g.cfg.PollInterval), g.cfg.PollInterval)
			g.logger.Error("pgoutbox: fetch failed", slog.Any("error", err), slog.Duration("retry_in", delay))
			r.sleep(poll, delay)
			continue
		}
		failures = 0
		if n > 0 {
			quiet = 0
			continue
		}
		if busy {
			// Another instance holds the position: look again soon.
			r.sleep(poll, min(g.cfg.PollInterval, 5*time.Millisecond))
			continue
		}
		if quiet < 30 {
			quiet++
		}
		r.sleep(poll, min(g.cfg.PollInterval, time.Millisecond<<quiet))
	}
}

// sleep waits for d, a notification, freed room or stop.
func (r *runner) sleep(t *time.Timer, d time.Duration) {
	t.Reset(d)
	select {
	case <-r.fetchCtx.Done():
	case <-r.wake:
	case <-r.room:
	case <-t.C:
	}
}

// fetchOnce claims due retries and then a batch; busy reports that another
// instance of the group was fetching.
func (r *runner) fetchOnce(limit int) (n int, busy bool, err error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.fetchCtx), 30*time.Second)
	defer cancel()
	if n, err = r.claimRetries(ctx, limit); err != nil || n > 0 {
		return n, false, err
	}
	return r.fetchBatch(ctx, limit)
}

type row struct {
	d   *outbox.Delivery
	xid string
}

func (r *runner) scanRows(rows pgx.Rows, attempt int) ([]row, error) {
	g := r.g
	return pgx.CollectRows(rows, func(cr pgx.CollectableRow) (row, error) {
		d := &outbox.Delivery{Topic: g.cfg.Topic, MaxAttempts: g.topic.MaxAttempts, Attempt: attempt}
		var x row
		var prio int16
		err := cr.Scan(&d.ID, &x.xid, &d.Payload, &d.Headers, &d.CorrelationID, &d.Group, &prio, &d.CreatedAt)
		d.Priority = int(prio)
		x.d = d
		return x, err
	})
}

// fetchBatch: lock the position (or find it locked), take over an expired
// batch if there is one, else read the next rows of the snapshot pair and
// record them as a batch, advancing the position, in one short transaction.
func (r *runner) fetchBatch(ctx context.Context, limit int) (int, bool, error) {
	g := r.g
	tx, err := g.pool.Begin(ctx)
	if err != nil {
		return 0, false, err
	}
	defer tx.Rollback(ctx)
	var (
		position           string
		pairCur, resumeXID *string
		resumeID           *int64
	)
	err = tx.QueryRow(ctx, g.q.LockOffset, g.sub.ID).Scan(&position, &pairCur, &resumeXID, &resumeID)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, true, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("lock position: %w", err)
	}
	lease := g.topic.Lease.Microseconds()

	// A batch whose member's lease expired: re-read it exactly.
	var (
		bid                          int64
		prev, cur, afterXID, lastXID string
		afterID, lastID              int64
		leaseUntil                   time.Time
	)
	err = tx.QueryRow(ctx, g.q.TakeExpiredBatch, g.sub.ID, g.cfg.InstanceID, g.now(), lease).
		Scan(&bid, &prev, &cur, &afterXID, &afterID, &lastXID, &lastID, &leaseUntil)
	if err == nil {
		args := append([]any{g.cfg.Topic, prev, cur, afterXID, afterID, lastID}, g.stream.binds()...)
		args = append(args, lastXID)
		rows, err := tx.Query(ctx, g.q.ReadBatchRows, args...)
		if err != nil {
			return 0, false, fmt.Errorf("re-read batch: %w", err)
		}
		got, err := r.scanRows(rows, 2)
		if err != nil {
			return 0, false, fmt.Errorf("re-read batch: %w", err)
		}
		if err := tx.Commit(ctx); err != nil {
			return 0, false, err
		}
		g.logger.Warn("pgoutbox: took over a batch whose lease expired", slog.Int64("batch", bid), slog.Int("messages", len(got)))
		return r.dispatch(ctx, bid, leaseUntil, got, true)
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return 0, false, fmt.Errorf("take expired batch: %w", err)
	}

	// The next rows of the current pair, or of a new pair ending now.
	prev, afterXID, afterID = position, "0", 0
	if pairCur != nil {
		cur = *pairCur
		afterXID, afterID = *resumeXID, *resumeID
	} else if err := tx.QueryRow(ctx, g.q.CurrentSnapshot).Scan(&cur); err != nil {
		return 0, false, fmt.Errorf("snapshot: %w", err)
	}
	args := append([]any{g.cfg.Topic, prev, cur, afterXID, afterID, limit}, g.stream.binds()...)
	rows, err := tx.Query(ctx, g.q.FetchRows, args...)
	if err != nil {
		return 0, false, fmt.Errorf("fetch rows: %w", err)
	}
	got, err := r.scanRows(rows, 1)
	if err != nil {
		return 0, false, fmt.Errorf("fetch rows: %w", err)
	}
	if len(got) < limit { // pair exhausted: the position moves to cur
		_, err = tx.Exec(ctx, g.q.AdvanceOffset, g.sub.ID, cur, nil, nil, nil)
	} else {
		last := got[len(got)-1]
		_, err = tx.Exec(ctx, g.q.AdvanceOffset, g.sub.ID, position, cur, last.xid, last.d.ID)
	}
	if err != nil {
		return 0, false, fmt.Errorf("advance position: %w", err)
	}
	if len(got) == 0 {
		return 0, false, tx.Commit(ctx)
	}
	last := got[len(got)-1]
	if err := tx.QueryRow(ctx, g.q.InsertBatch, g.sub.ID, prev, cur, afterXID, afterID, last.xid, last.d.ID,
		g.cfg.InstanceID, g.now(), lease).Scan(&bid, &leaseUntil); err != nil {
		return 0, false, fmt.Errorf("record batch: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, false, err
	}
	return r.dispatch(ctx, bid, leaseUntil, got, false)
}

// dispatch queues a batch's messages for the workers. Messages the group
// already completed (possible only in a re-read batch) are acked unhandled.
func (r *runner) dispatch(ctx context.Context, id int64, leaseUntil time.Time, rows []row, reread bool) (int, bool, error) {
	g := r.g
	done, err := r.alreadyCompleted(ctx, rows, reread)
	if err != nil {
		return 0, false, err
	}
	b := &batch{id: id, size: len(rows), deadline: time.Now().Add(leaseLeft(leaseUntil, g.now(), g.topic.Lease))}
	b.remaining.Store(int64(len(rows)))
	r.inflight.Add(int64(len(rows)))
	jobs := make([]*job, len(rows))
	for i, x := range rows {
		x.d.LeaseUntil = leaseUntil
		jobs[i] = &job{d: x.d, batch: b, done: done[x.d.ID]}
	}
	g.metrics.delivered.Add(ctx, int64(len(rows)))
	if bh := g.batchHandler; bh != nil {
		r.workWG.Add(1) // Stop waits for it with the workers
		go r.handleBatch(bh, b, jobs)
		return len(rows), false, nil
	}
	for _, j := range jobs {
		r.jobs <- j
	}
	return len(rows), false, nil
}

// handleBatch gives a whole batch, in commit order, to the batch handler.
func (r *runner) handleBatch(bh BatchHandler, b *batch, jobs []*job) {
	defer r.workWG.Done()
	var todo []*job
	var ds []*outbox.Delivery
	for _, j := range jobs {
		if j.done {
			r.finishJob(j, ack, failure{id: j.d.ID, attempts: j.d.Attempt})
			continue
		}
		todo = append(todo, j)
		ds = append(ds, j.d)
	}
	if len(ds) == 0 {
		return
	}
	ctx, cancel := context.WithDeadline(r.workCtx, b.deadline)
	defer cancel()
	errs, err := runBatchHandler(ctx, bh, ds)
	for i, j := range todo {
		e := err
		if e == nil && i < len(errs) {
			e = errs[i]
		}
		o, f := r.classify(j, e)
		r.finishJob(j, o, f)
	}
}

func runBatchHandler(ctx context.Context, bh BatchHandler, ds []*outbox.Delivery) (errs []error, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("batch handler panic: %v\n%s", p, debug.Stack())
		}
	}()
	errs = bh(ctx, ds)
	if len(errs) != len(ds) {
		return nil, fmt.Errorf("batch handler returned %d results for %d messages", len(errs), len(ds))
	}
	return errs, nil
}

// alreadyCompleted asks the tracker which rows the group completed. Batch
// completions are written atomically with the batch's end, so a fresh
// batch holds none; a re-read one normally none either. In counter mode the
// Bloom filter of this instance's completions rules most ids out without a
// query; the rest (and every id in other modes) are checked in SQL.
func (r *runner) alreadyCompleted(ctx context.Context, rows []row, reread bool) (map[int64]bool, error) {
	g := r.g
	var ids []int64
	for _, x := range rows {
		if r.bloom != nil {
			if r.bloomTest(x.d.ID) {
				ids = append(ids, x.d.ID)
			}
		} else if reread {
			ids = append(ids, x.d.ID)
		}
	}
	if len(ids) == 0 {
		return nil, nil
	}
	return g.tracker.Completed(ctx, g.pool, g.sub, ids)
}

func (r *runner) bloomTest(id int64) bool {
	r.bloomMu.Lock()
	defer r.bloomMu.Unlock()
	return r.bloom.Test(idKey(id))
}

func (r *runner) bloomAdd(ids []int64) {
	r.bloomMu.Lock()
	defer r.bloomMu.Unlock()
	for _, id := range ids {
		r.bloom.Add(idKey(id))
	}
}

func idKey(id int64) []byte { return strconv.AppendInt(nil, id, 10) }

// leaseLeft is how long a handler may run: the lease minus a margin for
// writing the outcome.
func leaseLeft(until time.Time, now *time.Time, lease time.Duration) time.Duration {
	base := time.Now()
	if now != nil {
		base = *now
	}
	left := until.Sub(base)
	if left <= 0 || left > lease {
		left = lease
	}
	return left - min(left/10, 5*time.Second)
}

// claimRetries leases due retries of the group (after returning expired
// retry leases to the queue, at most once per poll interval).
func (r *runner) claimRetries(ctx context.Context, limit int) (int, error) {
	g := r.g
	if time.Since(r.lastReap) >= g.cfg.PollInterval {
		r.lastReap = time.Now()
		if _, err := g.pool.Exec(ctx, g.q.ReapRetries, g.sub.ID, g.now(), g.topic.MaxAttempts); err != nil {
			return 0, fmt.Errorf("reap retries: %w", err)
		}
	}
	rows, err := g.pool.Query(ctx, g.q.ClaimRetries, g.sub.ID, g.cfg.InstanceID, g.now(), g.topic.Lease.Microseconds(), limit)
	if err != nil {
		return 0, fmt.Errorf("claim retries: %w", err)
	}
	type claimed struct {
		d     *outbox.Delivery
		until time.Time
	}
	got, err := pgx.CollectRows(rows, func(cr pgx.CollectableRow) (claimed, error) {
		d := &outbox.Delivery{Topic: g.cfg.Topic, MaxAttempts: g.topic.MaxAttempts}
		var c claimed
		var xid string
		var prio int16
		err := cr.Scan(&d.ID, &xid, &d.Payload, &d.Headers, &d.CorrelationID, &d.Group, &prio, &d.CreatedAt, &d.Attempt, &c.until)
		d.Priority, d.LeaseUntil, c.d = int(prio), c.until, d
		return c, err
	})
	if err != nil {
		return 0, fmt.Errorf("claim retries: %w", err)
	}
	r.inflight.Add(int64(len(got)))
	for _, c := range got {
		r.jobs <- &job{d: c.d, deadline: time.Now().Add(leaseLeft(c.until, g.now(), g.topic.Lease))}
	}
	return len(got), nil
}

// ---------------------------------------------------------------- handling

func (r *runner) work() {
	defer r.workWG.Done()
	for j := range r.jobs {
		o, f := r.handle(j)
		r.finishJob(j, o, f)
	}
}

type outcome int

const (
	ack outcome = iota
	fail
	release
)

// handle runs the chosen member's handler (or none: filtered, or already
// completed) and classifies the result.
func (r *runner) handle(j *job) (outcome, failure) {
	g := r.g
	f := failure{id: j.d.ID, attempts: j.d.Attempt}
	if r.stopping.Load() {
		return release, f
	}
	if j.done {
		return ack, f
	}
	m := pick(*r.members.Load(), j.d)
	if m == nil {
		return ack, f // every member's filter rejected it: processed for this group
	}
	deadline := j.deadline
	if j.batch != nil {
		deadline = j.batch.deadline
	}
	ctx, cancel := context.WithDeadline(r.workCtx, deadline)
	defer cancel()
	start := time.Now()
	err := runHandler(ctx, m.handler, j.d)
	g.metrics.handlerTime.Record(ctx, time.Since(start).Seconds())
	return r.classify(j, err)
}

// classify turns a handler's result into an outcome: ack, release (the
// instance is stopping), or a failure to retry or dead-letter.
func (r *runner) classify(j *job, err error) (outcome, failure) {
	g := r.g
	f := failure{id: j.d.ID, attempts: j.d.Attempt}
	if err == nil {
		return ack, f
	}
	if r.workCtx.Err() != nil {
		return release, f
	}
	f.err = err.Error()
	switch {
	case outbox.IsPermanent(err):
		f.dead = true
	case j.d.Attempt >= g.topic.MaxAttempts:
		f.dead = true
	default:
		f.delay = retryDelay(err, j.d.Attempt, g.topic)
	}
	g.logger.Warn("pgoutbox: handler failed", slog.Int64("id", j.d.ID), slog.Int("attempt", j.d.Attempt),
		slog.Bool("dead_lettered", f.dead), slog.Duration("retry_in", f.delay), slog.Any("error", err))
	return fail, f
}

func runHandler(ctx context.Context, h outbox.Handler, d *outbox.Delivery) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("handler panic: %v\n%s", p, debug.Stack())
		}
	}()
	return h(ctx, d)
}

// finishJob records a job's outcome; a batch goes to the completer when its
// last message is done.
func (r *runner) finishJob(j *job, o outcome, f failure) {
	if j.batch == nil {
		r.finished <- settled{retry: &retryOut{id: j.d.ID, ack: o == ack, release: o == release, f: f}, count: 1}
		return
	}
	b := j.batch
	b.mu.Lock()
	switch o {
	case ack:
		b.acked = append(b.acked, j.d.ID)
	case fail:
		b.failed = append(b.failed, f)
	case release:
		b.released = true
	}
	b.mu.Unlock()
	if b.remaining.Add(-1) == 0 {
		r.finished <- settled{batch: b, count: b.size}
	}
}

// ---------------------------------------------------------------- completing

// complete writes finished batches and retry outcomes.
func (r *runner) complete() {
	defer r.doneWG.Done()
	for s := range r.finished {
		if s.batch != nil {
			r.completeBatch(s.batch)
		} else {
			r.completeRetry(s.retry)
		}
		r.inflight.Add(-int64(s.count))
		select {
		case r.room <- struct{}{}:
		default:
		}
	}
}

// completeBatch ends a batch in one transaction: delete the batch row (if
// this member still owns it), record completions, park failures as retries.
// A batch with released messages (stop) is handed back whole instead.
func (r *runner) completeBatch(b *batch) {
	g := r.g
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if b.released {
		if _, err := g.pool.Exec(ctx, g.q.ReleaseBatch, b.id, g.cfg.InstanceID); err != nil {
			g.logger.Error("pgoutbox: release batch failed; it is re-read when its lease expires", slog.Int64("batch", b.id), slog.Any("error", err))
		}
		return
	}
	err := withRetry(ctx, func() error {
		return pgx.BeginFunc(ctx, g.pool, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, g.q.FinishBatch, b.id, g.cfg.InstanceID)
			if err != nil {
				return err
			}
			if tag.RowsAffected() == 0 {
				return errBatchLost
			}
			if len(b.acked) > 0 {
				// Every group locks message rows in ascending id order, so
				// groups completing the same rows never deadlock.
				slices.Sort(b.acked)
				if err := g.tracker.Complete(ctx, tx, g.sub, b.acked); err != nil {
					return err
				}
			}
			if len(b.failed) > 0 {
				return r.insertRetries(ctx, tx, b.failed)
			}
			return nil
		})
	})
	switch {
	case errors.Is(err, errBatchLost):
		g.logger.Warn("pgoutbox: batch lease expired before it finished; another member re-reads it", slog.Int64("batch", b.id))
	case err != nil:
		g.logger.Error("pgoutbox: completing batch failed; it is re-read when its lease expires", slog.Int64("batch", b.id), slog.Any("error", err))
	default:
		if r.bloom != nil {
			r.bloomAdd(b.acked)
		}
		g.metrics.acked.Add(ctx, int64(len(b.acked)))
		g.metrics.retried.Add(ctx, int64(len(b.failed)))
	}
}

var errBatchLost = errors.New("batch taken over")

func (r *runner) insertRetries(ctx context.Context, tx pgx.Tx, fs []failure) error {
	n := len(fs)
	ids, attempts, delays, dead, errs := make([]int64, n), make([]int32, n), make([]int64, n), make([]bool, n), make([]string, n)
	for i, f := range fs {
		ids[i], attempts[i], delays[i], dead[i], errs[i] = f.id, int32(f.attempts), f.delay.Microseconds(), f.dead, f.err
	}
	_, err := tx.Exec(ctx, r.g.q.InsertRetries, r.g.sub.ID, ids, attempts, delays, dead, r.g.now(), errs)
	return err
}

func (r *runner) completeRetry(o *retryOut) {
	g := r.g
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := withRetry(ctx, func() error {
		if !o.ack {
			delay := o.f.delay
			if o.release {
				delay = 0
			}
			_, err := g.pool.Exec(ctx, g.q.SettleRetry, g.sub.ID, o.id, g.cfg.InstanceID, delay.Microseconds(), o.f.dead && !o.release, o.f.err, g.now())
			return err
		}
		return pgx.BeginFunc(ctx, g.pool, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, g.q.DeleteRetry, g.sub.ID, o.id, g.cfg.InstanceID)
			if err != nil || tag.RowsAffected() == 0 {
				return err // lease lost: the retry is redelivered
			}
			return g.tracker.Complete(ctx, tx, g.sub, []int64{o.id})
		})
	})
	if err != nil {
		g.logger.Error("pgoutbox: settling retry failed; it is redelivered after its lease", slog.Int64("id", o.id), slog.Any("error", err))
	}
}

// withRetry retries a completion write briefly; a batch taken over by
// another member is final.
func withRetry(ctx context.Context, f func() error) error {
	return backoff.Retry(ctx, 3, 50*time.Millisecond, time.Second,
		func(err error) bool { return errors.Is(err, errBatchLost) }, f)
}

// ---------------------------------------------------------------- heartbeats

// heartbeat records this instance's liveness (database time, jittered
// ±10% so instances do not beat in step), follows the subscription's state,
// resurrects a DEAD group, marks other dead groups of the topic, and deletes
// expired idempotency keys.
func (r *runner) heartbeat() {
	defer r.fetchWG.Done()
	g := r.g
	for {
		r.beat()
		g.detectDead(r.fetchCtx, r.hbPool)
		r.expireIdempotencyKeys()
		jitter := time.Duration(rand.Int64N(int64(g.cfg.HeartbeatInterval)/5+1)) - g.cfg.HeartbeatInterval/10
		select {
		case <-r.fetchCtx.Done():
			return
		case <-time.After(g.cfg.HeartbeatInterval + jitter):
		}
	}
}

func (r *runner) expireIdempotencyKeys() {
	ctx, cancel := context.WithTimeout(r.fetchCtx, 10*time.Second)
	defer cancel()
	if _, err := r.g.client.ExpireIdempotencyKeys(ctx); err != nil && r.fetchCtx.Err() == nil {
		r.g.logger.Error("pgoutbox: deleting expired idempotency keys failed", slog.Any("error", err))
	}
}

func (r *runner) beat() {
	g := r.g
	ctx, cancel := context.WithTimeout(r.fetchCtx, 10*time.Second)
	defer cancel()
	var status string
	if err := r.hbPool.QueryRow(ctx, g.q.Heartbeat, g.sub.ID, g.cfg.HeartbeatTimeout.Microseconds()).Scan(&status); err != nil {
		if r.fetchCtx.Err() == nil {
			g.logger.Error("pgoutbox: heartbeat failed", slog.Any("error", err))
		}
		return
	}
	if State(status) == Dead {
		if err := g.transition(ctx, Active); err != nil {
			g.logger.Error("pgoutbox: resurrection failed", slog.Any("error", err))
			return
		}
		pos, err := g.committedPosition(ctx, g.pool, g.sub.ID)
		if err == nil {
			err = g.backfill(ctx, pubsub.Range{Position: pos, All: true}, SubscriptionOptions{}.withDefaults())
		}
		if err != nil {
			g.logger.Error("pgoutbox: resurrection backfill failed", slog.Any("error", err))
		}
		status = string(Active)
	}
	if State(status) == Cancelled {
		g.logger.Warn("pgoutbox: subscription was cancelled; this instance stops fetching")
	}
	r.status.Store(State(status))
}
