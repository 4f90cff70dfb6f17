package consumergroup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/handlers"
	"github.com/pgoutbox/pgoutbox/internal/tracing"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// The executors run handlers: Concurrency goroutines reading jobs, each
// owning a slot, and one goroutine per batch given to a BatchHandler. The
// watchdog (one goroutine) fails a handler call that overran its timeout
// and did not return shortly after its context ended: its message is
// retried like any failure, a new executor takes the slot's place, and the
// old one exits when the call finally returns. A hung handler so costs
// one retry, never its batch or the rest of the group.

// errHandlerTimeout is the failure recorded for an abandoned handler call.
var errHandlerTimeout = errors.New("handler did not return within its timeout")

// slot is an executor's current handler call, shared with the watchdog.
type slot struct {
	mu        sync.Mutex
	j         *job
	deadline  time.Time // the call's context ends then
	abandoned bool
}

func (s *slot) begin(j *job, deadline time.Time) {
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
// abandon runs under the slot's lock, before the executor can see it.
func (s *slot) overdue(now time.Time, grace time.Duration, cancelled time.Time, abandon func()) *job {
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

func (r *runner) startExecutor() {
	s := &slot{}
	r.slotsMu.Lock()
	r.slots[s] = struct{}{}
	r.slotsMu.Unlock()
	r.workWG.Add(1)
	go r.work(s)
}

func (r *runner) work(s *slot) {
	defer func() {
		r.slotsMu.Lock()
		delete(r.slots, s)
		r.slotsMu.Unlock()
	}()
	for j := range r.jobs {
		for j != nil { // a run of one message group, in order
			o, f, inTime := r.handle(s, j)
			if !inTime {
				r.abandoned.Done() // the watchdog counted this goroutine as abandoned
				return
			}
			j = r.finishJob(j, o, f)
		}
	}
	r.workWG.Done()
}

// handle runs the chosen member's handler (or none: every filter rejected
// the message) and classifies the result; inTime is false when the
// watchdog gave up on the call.
func (r *runner) handle(s *slot, j *job) (o outcome, f failure, inTime bool) {
	g := r.g
	if r.stopping.Load() {
		return release, untried(j), true
	}
	m := pick(*r.members.Load(), j.d)
	if m == nil {
		return ack, failure{id: j.d.ID, attempts: j.d.Attempt}, true // every member's filter rejected it: processed for this group
	}
	timeout := g.handlerTimeout()
	ctx, cancel := context.WithTimeout(r.workCtx, timeout)
	defer cancel()
	s.begin(j, time.Now().Add(timeout))
	ctx, span := g.tracer.Process(ctx, g.cfg.Topic, g.cfg.Group, j.d.ID, j.d.Attempt, j.d.Headers)
	start := time.Now()
	err := handlers.Call(ctx, m.handler, j.d)
	tracing.End(span, err)
	if !s.end() {
		return 0, failure{}, false
	}
	g.metrics.handlerTime.Record(ctx, time.Since(start).Seconds())
	o, f = r.classify(j, err)
	return o, f, true
}

// classify turns a handler's result into an outcome: ack, release (the
// instance is stopping and cancelled the call), or a failure to retry or
// dead-letter.
func (r *runner) classify(j *job, err error) (outcome, failure) {
	g := r.g
	f := failure{id: j.d.ID, attempts: j.d.Attempt}
	if err == nil {
		return ack, f
	}
	if r.workCtx.Err() != nil {
		f.attempts--
		return release, f
	}
	f.err = err.Error()
	v := g.topic.Judge(err, j.d.Attempt)
	if v.Snooze {
		f.attempts--
		f.delay, f.at, f.snoozed = v.Delay, v.At, true
		return fail, f
	}
	f.dead, f.delay, f.at = v.DeadLetter, v.Delay, v.At
	handlers.LogFailure(g.events, g.cfg.Topic+"|"+g.cfg.Group, err, f.dead,
		slog.Int64("id", j.d.ID), slog.Int("attempt", j.d.Attempt), slog.Duration("retry_in", f.delay))
	return fail, f
}

// finishJob records a job's outcome and returns the next message of its
// run to handle, if it succeeded; if it did not, the rest of the run is
// handed back untried (its message group waits for this one).
func (r *runner) finishJob(j *job, o outcome, f failure) *job {
	r.record(j, o, f)
	if o == ack {
		return j.next
	}
	for n := j.next; n != nil; n = n.next {
		r.record(n, release, untried(n))
	}
	return nil
}

// untried is the outcome of a job handed back without being handled: its
// attempt is given back.
func untried(j *job) failure {
	return failure{id: j.d.ID, attempts: j.d.Attempt - 1}
}

// record records a job's outcome; a batch goes to the completer when its
// last message is done.
func (r *runner) record(j *job, o outcome, f failure) {
	defer r.window.Handled()
	r.settled(j)
	if j.batch == nil {
		r.finished <- settled{retry: &retryOut{outcome: o, f: f}}
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
		b.released = append(b.released, f)
	}
	b.mu.Unlock()
	if b.remaining.Add(-1) == 0 {
		r.finished <- settled{batch: b}
	}
}

// timedOut is the outcome of a call the watchdog gave up on.
func (r *runner) timedOut(j *job) (outcome, failure) {
	err := fmt.Errorf("%w (%v)", errHandlerTimeout, r.g.handlerTimeout())
	return r.classify(j, err)
}

// watch is the watchdog.
func (r *runner) watch() {
	timeout := r.g.handlerTimeout()
	grace := abandonGrace(timeout)
	t := time.NewTicker(min(max(grace/2, 5*time.Millisecond), 100*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-r.keepCtx.Done():
			return
		case <-t.C:
		}
		var cancelled time.Time
		if ns := r.cancelledAt.Load(); ns != 0 {
			cancelled = time.Unix(0, ns)
		}
		r.slotsMu.Lock()
		slots := make([]*slot, 0, len(r.slots))
		for s := range r.slots {
			slots = append(slots, s)
		}
		r.slotsMu.Unlock()
		now := time.Now()
		for _, s := range slots {
			j := s.overdue(now, grace, cancelled, func() { r.abandoned.Add(1) })
			if j == nil {
				continue
			}
			r.g.logger.Warn("pgoutbox: handler did not return within its timeout; its message is retried and the group goes on",
				slog.Int64("id", j.d.ID), slog.Int("attempt", j.d.Attempt), slog.Duration("timeout", timeout))
			o, f := r.timedOut(j)
			r.finishJob(j, o, f)
			r.startExecutor() // before Done: the executors' count never touches zero here
			r.workWG.Done()   // the abandoned goroutine no longer counts as an executor
		}
	}
}

// handleBatch gives a whole batch (or the retry deliveries claimed
// together), in commit order, to the batch handler.
func (r *runner) handleBatch(bh BatchHandler, jobs []*job, t *turn) {
	defer r.workWG.Done()
	defer t.finish() // the next batch's turn comes, whatever this one did
	if r.stopping.Load() {
		for _, j := range jobs {
			r.record(j, release, untried(j))
		}
		return
	}
	ds := make([]*outbox.Delivery, len(jobs))
	headers := make([]map[string]string, len(jobs))
	for i, j := range jobs {
		ds[i], headers[i] = j.d, j.d.Headers
	}
	timeout := r.g.handlerTimeout()
	ctx, cancel := context.WithTimeout(context.WithValue(r.workCtx, turnKey{}, t), timeout)
	defer cancel()
	ctx, span := r.g.tracer.ProcessBatch(ctx, r.g.cfg.Topic, r.g.cfg.Group, headers)
	defer span.End()
	type result struct {
		errs []error
		err  error
	}
	done := make(chan result, 1)
	r.abandoned.Add(1) // until the call returns, whether or not we wait for it
	go func() {
		defer r.abandoned.Done()
		errs, err := runBatchHandler(ctx, bh, ds)
		done <- result{errs, err}
	}()
	var res result
	select {
	case res = <-done:
	case <-ctx.Done():
		select {
		case res = <-done:
		case <-time.After(abandonGrace(timeout)):
			r.g.logger.Warn("pgoutbox: batch handler did not return within its timeout; its messages are retried",
				slog.Int("messages", len(jobs)), slog.Duration("timeout", timeout))
			res.err = fmt.Errorf("%w (%v)", errHandlerTimeout, timeout)
		}
	}
	failing := map[string]bool{} // an ordered group's message groups with a message that did not succeed
	for i, j := range jobs {
		err := res.err
		if err == nil {
			err = res.errs[i]
		}
		o, f := r.classify(j, err)
		if r.g.byMessageGroup() && j.d.Group != "" {
			// A message after one of its group that did not succeed is
			// handed back whatever its result: it must not finish first.
			if failing[j.d.Group] {
				o, f = release, untried(j)
			} else if o != ack {
				failing[j.d.Group] = true
			}
		}
		r.record(j, o, f)
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
