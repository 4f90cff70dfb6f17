package pipeline

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/handlers"
	"github.com/pgoutbox/pgoutbox/internal/ratelog"
	"github.com/pgoutbox/pgoutbox/internal/startstop"
	"github.com/pgoutbox/pgoutbox/internal/tracing"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// ErrHandlerTimeout is the failure recorded for a handler call the
// executor gave up on.
var ErrHandlerTimeout = errors.New("handler did not return within its timeout")

// BatchHandler handles a whole claim at once and returns one result per
// delivery (see consumergroup.BatchHandler).
type BatchHandler func(ctx context.Context, batch []*outbox.Delivery) []error

// ExecutorConfig is what an Executor runs handlers with. Its fields are
// set before NewExecutor and not changed after.
type ExecutorConfig struct {
	// Workers is how many handler calls run at once (without a
	// BatchHandler).
	Workers int
	// Capacity is how many claimed jobs the executor holds at most (see
	// Capacity): dispatched jobs wait for a worker in a channel this
	// large, and outcomes for the complete step in another.
	Capacity int
	// Window is told of every job dispatched and every job handled, and
	// how long each handler call took.
	Window *Window
	// Timeout bounds each handler call.
	Timeout time.Duration
	// Handler returns the handler a delivery goes to, or nil when no
	// member takes it: it is acked unhandled.
	Handler func(d *outbox.Delivery) outbox.Handler
	// BatchHandler, when set, takes every dispatched claim whole instead.
	BatchHandler BatchHandler
	// Judge decides what a failure leads to (outbox.TopicConfig.Judge).
	Judge func(err error, attempt int) outbox.Verdict
	// ByMessageGroup: a claim's deliveries of one message group are
	// handled one after another, in id order, and those behind one that
	// did not succeed are handed back untried.
	ByMessageGroup bool
	// Topic and Group name the consumer, in traces and logs.
	Topic, Group string
	// Tracer traces handler calls.
	Tracer *tracing.Tracer
	// HandlerTime, if set, receives each handler call's duration.
	HandlerTime func(ctx context.Context, d time.Duration)
	// Failures logs handler failures, rate-limited.
	Failures *ratelog.Log
	// Logger logs handler calls given up on.
	Logger *slog.Logger
}

// Executor is a pipeline's execute step. Workers goroutines take
// dispatched jobs, each handling one job, or one run of a message group
// in order, at a time; a claim given to a BatchHandler runs in a
// goroutine of its own. A watchdog gives up on a handler call that
// overran its timeout and did not return shortly after its context
// ended: its message fails like any other, a new worker takes the old
// one's place, and the old one exits when the call finally returns. A
// hung handler so costs one retry, never its batch or the rest of the
// consumer.
//
// Every outcome, a batch's once its last message is done, goes to
// Settled in the order it came.
type Executor struct {
	cfg     ExecutorConfig
	jobs    chan *Job    // Dispatch → workers; closed by Close
	urgent  chan *Job    // ... those of a priority above 0, taken first
	settled chan Settled // workers, watchdog → complete step; closed by Close

	inflightMu sync.Mutex
	inflight   map[*outbox.Delivery]*Job // dispatched and not yet settled (see HandedOut)

	slotsMu sync.Mutex
	slots   map[*slot]struct{} // workers running a handler loop

	ctx         context.Context // handler calls
	cancel      context.CancelFunc
	cancelledAt atomic.Int64 // unix nanos when ctx was cancelled
	stopping    atomic.Bool

	turns     turns          // Dispatch's own
	working   sync.WaitGroup // workers (not abandoned ones) and batch goroutines: the watchdog moves workers to abandoned
	abandoned sync.WaitGroup // handler calls given up on, still running
	watchdog  startstop.Tasks
	stopWatch chan struct{}
}

// NewExecutor returns an executor; Start starts it.
func NewExecutor(cfg ExecutorConfig) *Executor {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	e := &Executor{
		cfg:       cfg,
		jobs:      make(chan *Job, cfg.Capacity),
		urgent:    make(chan *Job, cfg.Capacity),
		settled:   make(chan Settled, cfg.Capacity),
		inflight:  map[*outbox.Delivery]*Job{},
		slots:     map[*slot]struct{}{},
		stopWatch: make(chan struct{}),
	}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	return e
}

// Start starts the workers and the watchdog.
func (e *Executor) Start() {
	for range e.cfg.Workers {
		e.startWorker()
	}
	e.watchdog.Go(e.watch)
}

// Settled delivers the outcomes to write; it is closed by Close.
func (e *Executor) Settled() <-chan Settled { return e.settled }

// Waiting is how many dispatched jobs wait for a worker.
func (e *Executor) Waiting() int { return len(e.jobs) + len(e.urgent) }

// Dispatch hands claimed jobs to the workers, or all of them at once to
// the batch handler, and counts them in the window. Call it from one
// goroutine only (the fetch step), and not after Close. With
// ByMessageGroup, jobs go in id order, which is commit order within each
// message group (see Runs). Without, a job of a priority above 0 goes
// ahead of the jobs of priority 0 that wait for a worker.
func (e *Executor) Dispatch(jobs []*Job) {
	e.cfg.Window.Claimed(len(jobs))
	e.inflightMu.Lock()
	for _, j := range jobs {
		e.inflight[j.D] = j
	}
	e.inflightMu.Unlock()
	if e.cfg.ByMessageGroup {
		slices.SortFunc(jobs, func(a, b *Job) int { return cmp.Compare(a.D.ID, b.D.ID) })
	}
	if bh := e.cfg.BatchHandler; bh != nil {
		e.working.Add(1) // Close waits for it with the workers
		go e.handleBatch(bh, jobs, e.turns.next())
		return
	}
	if e.cfg.ByMessageGroup {
		jobs = Runs(jobs, func(j *Job) (string, int64) { return j.D.Group, j.D.ID },
			func(prev, next *Job) { prev.Next = next })
	}
	for _, j := range jobs {
		if j.D.Priority > 0 && !e.cfg.ByMessageGroup {
			e.urgent <- j
		} else {
			e.jobs <- j
		}
	}
}

// next is a worker's next job, one of a priority above 0 first; ok is
// false once Close was called and no job is left.
func (e *Executor) next() (j *Job, ok bool) {
	select {
	case j, ok = <-e.urgent:
	default:
		select {
		case j, ok = <-e.urgent:
		case j, ok = <-e.jobs:
			if !ok { // closed: what is left is urgent, if anything
				j, ok = <-e.urgent
			}
			return j, ok
		}
	}
	if !ok { // closed: what is left waits in jobs, if anything
		j, ok = <-e.jobs
	}
	return j, ok
}

// HandedOut returns the job of a delivery being handled, or nil.
func (e *Executor) HandedOut(d *outbox.Delivery) *Job {
	e.inflightMu.Lock()
	defer e.inflightMu.Unlock()
	return e.inflight[d]
}

// BeginStop makes every job not yet started go back untried.
func (e *Executor) BeginStop() { e.stopping.Store(true) }

// Stopping reports whether BeginStop was called.
func (e *Executor) Stopping() bool { return e.stopping.Load() }

// CancelHandlers cancels the context of every handler call; a call that
// ends for it is handed back, not failed.
func (e *Executor) CancelHandlers() {
	e.cancelledAt.CompareAndSwap(0, time.Now().UnixNano())
	e.cancel()
}

// Close waits for the workers to finish what was dispatched (after
// BeginStop, handing back what they had not started), stops the
// watchdog, and closes Settled. Dispatch must not be called again.
func (e *Executor) Close() {
	close(e.urgent)
	close(e.jobs)
	e.working.Wait()
	close(e.stopWatch)
	e.watchdog.Wait()
	close(e.settled)
}

// WaitAbandoned waits, until ctx ends, for the handler calls given up on
// to return.
func (e *Executor) WaitAbandoned(ctx context.Context) error {
	return startstop.WaitGroup(ctx, &e.abandoned)
}

// slot is a worker's current handler call, shared with the watchdog.
type slot struct {
	mu        sync.Mutex
	j         *Job
	deadline  time.Time // the call's context ends then
	abandoned bool
}

func (s *slot) begin(j *Job, deadline time.Time) {
	s.mu.Lock()
	s.j, s.deadline = j, deadline
	s.mu.Unlock()
}

// end reports whether the call returned in time; false: the watchdog gave
// up on it and settled its job.
func (s *slot) end() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.j = nil
	return !s.abandoned
}

// overdue gives up on the slot's call if it ran past deadline+grace, or
// past cancelled+grace when handlers were cancelled, returning its job.
// abandon runs under the slot's lock, before the worker can see it.
func (s *slot) overdue(now time.Time, grace time.Duration, cancelled time.Time, abandon func()) *Job {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.j == nil || s.abandoned {
		return nil
	}
	late := now.After(s.deadline.Add(grace)) || (!cancelled.IsZero() && now.After(cancelled.Add(grace)))
	if !late {
		return nil
	}
	s.abandoned = true
	abandon()
	return s.j
}

// abandonGrace is how long a call may run on after its context ended.
func abandonGrace(timeout time.Duration) time.Duration {
	return min(max(timeout/4, 10*time.Millisecond), time.Second)
}

func (e *Executor) startWorker() {
	s := &slot{}
	e.slotsMu.Lock()
	e.slots[s] = struct{}{}
	e.slotsMu.Unlock()
	e.working.Add(1)
	go e.work(s)
}

func (e *Executor) work(s *slot) {
	defer func() {
		e.slotsMu.Lock()
		delete(e.slots, s)
		e.slotsMu.Unlock()
	}()
	for j, ok := e.next(); ok; j, ok = e.next() {
		for j != nil { // a run of one message group, in order
			o, f, inTime := e.handle(s, j)
			if !inTime {
				e.abandoned.Done() // the watchdog counted this goroutine as abandoned
				return
			}
			j = e.finish(j, o, f)
		}
	}
	e.working.Done()
}

// handle runs the handler j's delivery goes to (or none) and classifies
// the result; inTime is false when the watchdog gave up on the call.
func (e *Executor) handle(s *slot, j *Job) (o Outcome, f Failure, inTime bool) {
	if e.stopping.Load() {
		return Release, Untried(j), true
	}
	h := e.cfg.Handler(j.D)
	if h == nil { // no member takes it: processed, at no cost to the workers
		e.cfg.Window.HandlerTook(0)
		return Ack, Failure{ID: j.D.ID, Attempts: j.D.Attempt}, true
	}
	ctx, cancel := context.WithTimeout(e.ctx, e.cfg.Timeout)
	defer cancel()
	s.begin(j, time.Now().Add(e.cfg.Timeout))
	ctx, span := e.cfg.Tracer.Process(ctx, e.cfg.Topic, e.cfg.Group, j.D.ID, j.D.Attempt, j.D.Headers)
	start := time.Now()
	err := handlers.Call(ctx, h, j.D)
	tracing.End(span, err)
	if !s.end() {
		return 0, Failure{}, false
	}
	took := time.Since(start)
	e.cfg.Window.HandlerTook(took)
	if e.cfg.HandlerTime != nil {
		e.cfg.HandlerTime(ctx, took)
	}
	o, f = e.classify(j, err)
	return o, f, true
}

// classify turns a handler's result into an outcome: an ack, a release
// (the handlers were cancelled: the consumer is stopping), or a failure
// to retry or dead-letter as Judge says.
func (e *Executor) classify(j *Job, err error) (Outcome, Failure) {
	if err == nil {
		return Ack, Failure{ID: j.D.ID, Attempts: j.D.Attempt}
	}
	if e.ctx.Err() != nil {
		return Release, Untried(j)
	}
	return e.judge(j, err)
}

// gaveUp is the outcome of a handler call the executor gave up on: a
// failure (ErrHandlerTimeout), even when the consumer is stopping. The
// call may still finish its work, so its attempt is spent, and the
// message's next delivery says it is a later attempt.
func (e *Executor) gaveUp(j *Job) (Outcome, Failure) {
	return e.judge(j, fmt.Errorf("%w (%v)", ErrHandlerTimeout, e.cfg.Timeout))
}

// judge is the failure err makes of j, as Judge says: a retry, a snooze
// or a dead letter.
func (e *Executor) judge(j *Job, err error) (Outcome, Failure) {
	f := Failure{ID: j.D.ID, Attempts: j.D.Attempt}
	f.Err = err.Error()
	v := e.cfg.Judge(err, j.D.Attempt)
	if v.Snooze {
		f.Attempts--
		f.Delay, f.At, f.Snoozed = v.Delay, v.At, true
		return Fail, f
	}
	f.Dead, f.Delay, f.At = v.DeadLetter, v.Delay, v.At
	handlers.LogFailure(e.cfg.Failures, e.cfg.Topic+"|"+e.cfg.Group, err, f.Dead,
		slog.Int64("id", j.D.ID), slog.Int("attempt", j.D.Attempt), slog.Duration("retry_in", f.Delay))
	return Fail, f
}

// finish records a job's outcome and returns the next message of its run
// to handle, if it succeeded; if it did not, the rest of the run is
// handed back untried (its message group waits for this one).
func (e *Executor) finish(j *Job, o Outcome, f Failure) *Job {
	e.record(j, o, f)
	if o == Ack {
		return j.Next
	}
	for n := j.Next; n != nil; n = n.Next {
		e.record(n, Release, Untried(n))
	}
	return nil
}

// record records a job's outcome; a batch's goes to Settled when its
// last message is done.
func (e *Executor) record(j *Job, o Outcome, f Failure) {
	defer e.cfg.Window.Handled()
	e.inflightMu.Lock()
	delete(e.inflight, j.D)
	e.inflightMu.Unlock()
	if j.Batch == nil {
		e.settled <- Settled{Outcome: o, Failure: f}
		return
	}
	if j.Batch.add(o, f) {
		e.settled <- Settled{Batch: j.Batch}
	}
}

// watch is the watchdog.
func (e *Executor) watch() {
	grace := abandonGrace(e.cfg.Timeout)
	t := time.NewTicker(min(max(grace/2, 5*time.Millisecond), 100*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-e.stopWatch:
			return
		case <-t.C:
		}
		var cancelled time.Time
		if ns := e.cancelledAt.Load(); ns != 0 {
			cancelled = time.Unix(0, ns)
		}
		e.slotsMu.Lock()
		slots := make([]*slot, 0, len(e.slots))
		for s := range e.slots {
			slots = append(slots, s)
		}
		e.slotsMu.Unlock()
		now := time.Now()
		for _, s := range slots {
			j := s.overdue(now, grace, cancelled, func() { e.abandoned.Add(1) })
			if j == nil {
				continue
			}
			if cancelled.IsZero() {
				e.cfg.Logger.Warn("pgoutbox: handler did not return within its timeout; its message is retried and the group goes on",
					slog.Int64("id", j.D.ID), slog.Int("attempt", j.D.Attempt), slog.Duration("timeout", e.cfg.Timeout))
			} else {
				e.cfg.Logger.Warn("pgoutbox: handler did not return when the instance stopped it; its message is retried, and this attempt counts (the handler may still finish it)",
					slog.Int64("id", j.D.ID), slog.Int("attempt", j.D.Attempt))
			}
			e.cfg.Window.HandlerTook(e.cfg.Timeout) // at least
			o, f := e.gaveUp(j)
			e.finish(j, o, f)
			e.startWorker()  // before Done: the workers' count never touches zero here
			e.working.Done() // the abandoned goroutine no longer counts as a worker
		}
	}
}

// handleBatch gives a whole claim, in the order dispatched, to the batch
// handler.
func (e *Executor) handleBatch(bh BatchHandler, jobs []*Job, t *turn) {
	defer e.working.Done()
	defer t.finish() // the next batch's turn comes, whatever this one did
	if e.stopping.Load() {
		for _, j := range jobs {
			e.record(j, Release, Untried(j))
		}
		return
	}
	ds := make([]*outbox.Delivery, len(jobs))
	headers := make([]map[string]string, len(jobs))
	for i, j := range jobs {
		ds[i], headers[i] = j.D, j.D.Headers
	}
	timeout := e.cfg.Timeout
	ctx, cancel := context.WithTimeout(context.WithValue(e.ctx, turnKey{}, t), timeout)
	defer cancel()
	ctx, span := e.cfg.Tracer.ProcessBatch(ctx, e.cfg.Topic, e.cfg.Group, headers)
	defer span.End()
	type result struct {
		errs []error
		err  error
	}
	done := make(chan result, 1)
	e.abandoned.Add(1) // until the call returns, whether or not we wait for it
	go func() {
		defer e.abandoned.Done()
		errs, err := runBatchHandler(ctx, bh, ds)
		done <- result{errs, err}
	}()
	var res result
	gaveUp := false
	select {
	case res = <-done:
	case <-ctx.Done():
		select {
		case res = <-done:
		case <-time.After(abandonGrace(timeout)):
			e.cfg.Logger.Warn("pgoutbox: batch handler did not return within its timeout; its messages are retried",
				slog.Int("messages", len(jobs)), slog.Duration("timeout", timeout))
			gaveUp = true
		}
	}
	failing := map[string]bool{} // message groups with a message that did not succeed
	for i, j := range jobs {
		var o Outcome
		var f Failure
		switch {
		case gaveUp:
			o, f = e.gaveUp(j)
		case res.err != nil:
			o, f = e.classify(j, res.err)
		default:
			o, f = e.classify(j, res.errs[i])
		}
		if e.cfg.ByMessageGroup && j.D.Group != "" {
			// A message after one of its group that did not succeed is
			// handed back whatever its result: it must not finish first.
			if failing[j.D.Group] {
				o, f = Release, Untried(j)
			} else if o != Ack {
				failing[j.D.Group] = true
			}
		}
		e.record(j, o, f)
	}
}

func runBatchHandler(ctx context.Context, bh BatchHandler, ds []*outbox.Delivery) (errs []error, err error) {
	if err := handlers.Call(ctx, func(ctx context.Context, ds []*outbox.Delivery) error { errs = bh(ctx, ds); return nil }, ds); err != nil {
		return nil, err
	}
	if len(errs) != len(ds) {
		return nil, fmt.Errorf("batch handler returned %d results for %d messages", len(errs), len(ds))
	}
	return errs, nil
}
