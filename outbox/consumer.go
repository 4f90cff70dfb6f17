package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/pgoutbox/pgoutbox/internal/backoff"
	"github.com/pgoutbox/pgoutbox/internal/cfgcheck"
	"github.com/pgoutbox/pgoutbox/internal/handlers"
	"github.com/pgoutbox/pgoutbox/internal/instance"
	"github.com/pgoutbox/pgoutbox/internal/pipeline"
	"github.com/pgoutbox/pgoutbox/internal/ratelog"
	"github.com/pgoutbox/pgoutbox/internal/startstop"
	"github.com/pgoutbox/pgoutbox/internal/tracing"
)

// Handler handles one delivery. Returning nil acks the message (it is
// deleted). Returning an error retries it after the topic's backoff, or the
// delay given with RetryAfter; Permanent dead-letters it at once; Snooze
// brings it back after a delay without spending an attempt. After the
// topic's MaxAttempts the message is dead-lettered.
//
// ctx ends shortly before the message's lease expires, and when the consumer
// is stopped past its deadline: a handler must return when ctx is done.
type Handler func(ctx context.Context, d *Delivery) error

// RetryAfter wraps err so the message is retried after delay instead of the
// topic's backoff (it still counts as an attempt).
func RetryAfter(delay time.Duration, err error) error {
	if delay < 0 {
		delay = 0
	}
	return &retryError{delay: delay, err: err}
}

// Permanent wraps err so the message is dead-lettered at once, without
// further attempts.
func Permanent(err error) error { return &permanentError{err: err} }

// Snooze makes the message come back after delay without spending an
// attempt: the handler did not try it (its destination is known to be down,
// a rate limit, a dependency not ready). err, which may be nil, is
// recorded as the message's last error.
func Snooze(delay time.Duration, err error) error {
	return &retryError{delay: max(delay, 0), err: err, snooze: true}
}

type retryError struct {
	delay  time.Duration
	err    error
	snooze bool // the attempt is not spent
}

func (e *retryError) Error() string {
	if e.snooze {
		return fmt.Sprintf("snoozed for %v: %v", e.delay, e.err)
	}
	return fmt.Sprintf("retry after %v: %v", e.delay, e.err)
}
func (e *retryError) Unwrap() error { return e.err }

type permanentError struct{ err error }

func (e *permanentError) Error() string { return fmt.Sprintf("permanent: %v", e.err) }
func (e *permanentError) Unwrap() error { return e.err }

// Consumer defaults.
const (
	DefaultConcurrency  = 10
	DefaultBatchSize    = 100
	DefaultPollInterval = time.Second
)

// ConsumerConfig configures a QUEUE consumer.
type ConsumerConfig struct {
	// Topic to consume. Required; must not be a PUB_SUB topic.
	Topic string
	// Handler is called for every delivery. Required.
	Handler Handler
	// Concurrency is the most handlers running at once. Defaults to DefaultConcurrency.
	Concurrency int
	// BatchSize is the most messages claimed in one query; up to this many
	// may wait, leased, for a free handler (their leases are renewed
	// together every third of the topic's Lease while they wait; a handler
	// then has the rest of the lease, less a margin, to finish). A claim
	// takes a full batch when there is room for one, and a smaller one
	// only when the handlers are about to run out of work. Defaults to
	// DefaultBatchSize.
	BatchSize int
	// PollInterval is the longest an idle consumer waits before looking for
	// work when no notification woke it (a message whose lease expired is
	// claimed again by the next look), and how often the consumer reloads
	// the topic's configuration.
	// Defaults to DefaultPollInterval.
	PollInterval time.Duration
	// ID names this consumer in lease_owner and logs. Defaults to
	// host-pid-random.
	ID string
}

func (cfg ConsumerConfig) withDefaults() ConsumerConfig {
	cfg.Concurrency = cmp.Or(cfg.Concurrency, DefaultConcurrency)
	cfg.BatchSize = cmp.Or(cfg.BatchSize, DefaultBatchSize)
	cfg.PollInterval = cmp.Or(cfg.PollInterval, DefaultPollInterval)
	if cfg.ID == "" {
		cfg.ID = instance.NewID()
	}
	return cfg
}

func (cfg ConsumerConfig) validate() error {
	if err := ValidateTopic(cfg.Topic); err != nil {
		return err
	}
	check := cfgcheck.New("consumer of " + strconv.Quote(cfg.Topic))
	if cfg.Handler == nil {
		check.Failf("Handler", "is nil")
	}
	check.Count("Concurrency", cfg.Concurrency, 1)
	check.Count("BatchSize", cfg.BatchSize, 1)
	check.AtLeast("PollInterval", cfg.PollInterval, time.Millisecond)
	if len(cfg.ID) > MaxKeyBytes {
		check.Failf("ID", "is longer than %d bytes", MaxKeyBytes)
	}
	return check.Err()
}

// Consumer processes a QUEUE topic: competing consumers, in this and other
// processes, each claim batches with FOR UPDATE SKIP LOCKED and a lease.
// Delivery is at least once: a message whose consumer crashed or stalled is
// redelivered when its lease expires.
//
// Ordering is not promised: messages of one group may be handled
// concurrently and out of order (retries reorder too). Higher priorities are
// claimed first.
type Consumer struct {
	client *Client
	events *ratelog.Log // handler failures, rate-limited
	cfg    ConsumerConfig
	topic  atomic.Pointer[TopicConfig] // reloaded by maintain

	// life runs and stops the consumer. The fields below are set by Start
	// for one run, before its goroutines start, and left alone until the
	// run ended (a new Start waits for that).
	life       startstop.Base
	workCancel atomic.Pointer[context.CancelFunc] // the run's; read by Stop

	wake        <-chan struct{}
	unsubscribe func()

	fetchCtx context.Context // ends when Stop begins: no more claims
	workCtx  context.Context // ends when Stop's deadline passes: handlers are cancelled

	jobs     chan *job        // fetcher -> workers; closed by Stop after the fetcher ended
	results  chan result      // workers -> completer; closed by Stop after the workers ended
	window   *pipeline.Window // what the consumer holds, and when it claims next
	busy     atomic.Int64     // workers handling a job or its run
	queuedMu sync.Mutex
	queued   map[*job]struct{} // claimed, not yet picked by a worker: the lease keeper renews them
	stopping atomic.Bool       // workers release instead of handling
	fetchers startstop.Tasks   // fetcher, maintain and the lease keeper
	workers  startstop.Tasks   // handlers
	writer   startstop.Tasks   // the completer
	attrs    metric.MeasurementOption
}

type job struct {
	d        *Delivery
	deadline time.Time // local clock: shortly before the lease ends; guarded by Consumer.queuedMu while queued
	lost     bool      // its lease could not be renewed while it waited; guarded by Consumer.queuedMu
	// next is the message of the same message group right behind this
	// one in a run (ordered topics): the worker handles it next, or hands
	// it back untried if this one does not succeed.
	next *job
	prev *job // the job it is next of, if any
}

type outcome int

const (
	outcomeAck outcome = iota
	outcomeRetry
	outcomeDead
	outcomeRelease          // stop interrupted the handler: redeliver now, attempt counted
	outcomeReleaseUnstarted // never started: redeliver now, attempt given back
	outcomeSnooze           // Snooze: redeliver after delay, attempt given back
)

type result struct {
	d       *Delivery
	outcome outcome
	delay   time.Duration
	err     string
}

// NewConsumer returns a consumer of a QUEUE topic; Start runs it. It fails
// with ErrInvalidConfig for a bad cfg and ErrWrongSemantics for a PUB_SUB
// topic (read them with package consumergroup). ctx bounds the topic's
// lookup.
func (c *Client) NewConsumer(ctx context.Context, cfg ConsumerConfig) (*Consumer, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	topic, err := c.loadTopic(ctx, c.pool, cfg.Topic)
	if err != nil {
		return nil, err
	}
	if topic.Semantics != Queue {
		return nil, wrongSemantics(cfg.Topic, topic.Semantics)
	}
	return &Consumer{client: c, cfg: cfg, events: ratelog.New(c.logger, c.logInterval, time.Now), attrs: metric.WithAttributes(attribute.String("topic", cfg.Topic))}, nil
}

// errOnLog refuses to read QUEUE topic's queue table: its messages live
// on the log.
func errOnLog(topic string) error {
	return fmt.Errorf("%w: QUEUE topic %q lives on the log: consume it with pgoutbox.Client.NewConsumer or a router.QueueSource",
		ErrWrongSemantics, topic)
}

func wrongSemantics(topic string, s Semantics) error {
	return fmt.Errorf("%w: %q is a %s topic; consume it with package consumergroup", ErrWrongSemantics, topic, s)
}

// ID is the consumer's lease owner name.
func (k *Consumer) ID() string { return k.cfg.ID }

// Start loads the topic's configuration and starts claiming in the
// background; it returns at once. ctx bounds only the start-up queries.
// Start on a running consumer fails with ErrAlreadyStarted; a stopped
// consumer can be started again (a Start during a Stop waits for it).
func (k *Consumer) Start(ctx context.Context) error {
	run, done, err := k.life.StartInit(ctx, fmt.Sprintf("consumer %s of %q", k.cfg.ID, k.cfg.Topic))
	if err != nil {
		return err
	}
	topic, err := k.client.loadTopic(ctx, k.client.pool, k.cfg.Topic)
	if err == nil && topic.Semantics != Queue {
		err = wrongSemantics(k.cfg.Topic, topic.Semantics)
	}
	if err == nil && topic.Tracking != "" {
		err = errOnLog(k.cfg.Topic)
	}
	if err != nil {
		done()
		return err
	}
	if topic.Ordered {
		// A send that raced the topic's first configuration may have left
		// a message unmarked, which no ordered claim reads.
		if err = k.client.markOrdered(ctx, topic.Name, false); err != nil {
			done()
			return err
		}
	}
	k.topic.Store(&topic)
	k.wake, k.unsubscribe = k.client.WakeUps(k.cfg.Topic)
	k.fetchCtx = run
	var workCancel context.CancelFunc
	k.workCtx, workCancel = context.WithCancel(context.Background())
	k.workCancel.Store(&workCancel)
	capacity := pipeline.Capacity(k.cfg.BatchSize, k.cfg.Concurrency, topic.Ordered)
	k.jobs = make(chan *job, capacity)
	k.results = make(chan result, capacity)
	k.window = pipeline.NewWindow(capacity, k.cfg.BatchSize)
	k.queued = map[*job]struct{}{}
	k.stopping.Store(false)

	k.writer.Go(k.complete)
	for range k.cfg.Concurrency {
		k.workers.Go(k.work)
	}
	k.fetchers.Go(k.fetch)
	k.fetchers.Go(k.maintain)
	k.fetchers.Go(k.keepLeases)
	unwatch := func() {}
	if topic.Ordered {
		unwatch = k.client.watchOrdered(topic)
	}
	go func() {
		<-run.Done()
		k.shutdown(workCancel)
		unwatch()
		done()
	}()
	k.client.logger.Info("pgoutbox: consumer started", slog.String("topic", k.cfg.Topic), slog.String("consumer", k.cfg.ID))
	return nil
}

// Stop stops claiming, releases claimed messages no handler has started
// (they are redelivered at once), and waits for running handlers. When ctx
// ends first, it cancels the handlers' contexts and returns ctx's error;
// handlers that return then have their messages released too, and a
// handler that ignores its context is left to finish on its own (its
// message is redelivered when its lease expires). Stop is safe to call
// more than once and on a consumer never started.
func (k *Consumer) Stop(ctx context.Context) error { return k.stop(ctx, false) }

// StopAndCancel is Stop that cancels the running handlers' contexts at once.
func (k *Consumer) StopAndCancel(ctx context.Context) error { return k.stop(ctx, true) }

// Stopped returns a channel closed once the consumer's current run
// stopped (between runs, the last run's; before Start, the first run's).
func (k *Consumer) Stopped() <-chan struct{} { return k.life.Stopped() }

func (k *Consumer) stop(ctx context.Context, cancelHandlers bool) error {
	stopped, ok := k.life.StopInit()
	if !ok {
		return nil
	}
	if cancelHandlers {
		k.cancelWork()
	}
	select {
	case <-stopped:
		return nil
	case <-ctx.Done():
		k.cancelWork()
		select {
		case <-stopped:
		case <-time.After(stopGrace):
		}
		return ctx.Err()
	}
}

// cancelWork cancels the handlers of the current run, if it got as far as
// starting them.
func (k *Consumer) cancelWork() {
	if cancel := k.workCancel.Load(); cancel != nil {
		(*cancel)()
	}
}

// stopGrace is how long a Stop whose context ended waits for cancelled
// handlers to return before it gives up on them.
const stopGrace = 100 * time.Millisecond

// shutdown runs once the run's context ended: the fetcher stopped
// claiming; the workers release what is queued and finish what runs; then
// every outcome is written and the consumer leaves LISTEN.
func (k *Consumer) shutdown(workCancel context.CancelFunc) {
	k.stopping.Store(true)
	k.fetchers.Wait()
	close(k.jobs) // workers release what is still queued, then exit
	k.workers.Wait()
	workCancel()
	close(k.results)
	k.writer.Wait()
	k.unsubscribe()
	k.client.logger.Info("pgoutbox: consumer stopped", slog.String("topic", k.cfg.Topic), slog.String("consumer", k.cfg.ID))
}

// fetch claims batches while there is room and work (see pipeline.Loop).
func (k *Consumer) fetch() {
	loop := pipeline.Loop{
		Window:       k.window,
		Wake:         k.wake,
		PollInterval: k.cfg.PollInterval,
		Waiting:      func() int { return len(k.jobs) },
		Idle:         func() int { return k.cfg.Concurrency - int(k.busy.Load()) },
		Look: func(limit int, _ bool) (pipeline.Found, error) {
			n, err := k.claim(limit)
			return pipeline.Found{Claimed: n, More: n == limit}, err
		},
		Logger: k.client.logger.With(slog.String("topic", k.cfg.Topic), slog.String("consumer", k.cfg.ID)),
	}
	loop.Run(k.fetchCtx)
}

// claim leases up to limit messages and queues them for the workers.
func (k *Consumer) claim(limit int) (int, error) {
	topic := k.topic.Load()
	// Not cancelled by Stop: a claim cut off after the database committed
	// it would leave its messages leased until the lease expires.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(k.fetchCtx), 30*time.Second)
	defer cancel()
	start := time.Now()
	batch, err := k.client.claim(ctx, *topic, k.cfg.ID, limit, pipeline.OrderedRun)
	if err != nil {
		return 0, err
	}
	claimedAt := time.Now()
	k.client.tracer.Received(ctx, k.cfg.Topic, "", len(batch), start)
	sort.Slice(batch, func(i, j int) bool {
		a, b := batch[i], batch[j]
		if a.d.Priority != b.d.Priority {
			return a.d.Priority > b.d.Priority
		}
		if !a.availableAt.Equal(b.availableAt) {
			return a.availableAt.Before(b.availableAt)
		}
		return a.d.ID < b.d.ID
	})
	deadline := claimedAt.Add(handlerWindow(topic.Lease))
	k.window.Claimed(len(batch))
	jobs := make([]*job, len(batch))
	for i, c := range batch {
		jobs[i] = &job{d: c.d, deadline: deadline}
	}
	first := jobs
	if topic.Ordered {
		first = runs(jobs) // linked before the lease keeper sees them
	}
	k.queuedMu.Lock()
	for _, j := range jobs {
		k.queued[j] = struct{}{}
	}
	k.queuedMu.Unlock()
	for _, j := range first {
		k.jobs <- j // never blocks: the window holds at most its capacity
	}
	if len(batch) > 0 {
		k.client.metrics.delivered.Add(ctx, int64(len(batch)), k.attrs)
	}
	return len(batch), nil
}

// runs links the runs of a claim on an ordered topic (see pipeline.Runs)
// and returns the first job of each, and the jobs without a group.
func runs(jobs []*job) []*job {
	return pipeline.Runs(jobs, func(j *job) (string, int64) { return j.d.Group, j.d.ID },
		func(prev, next *job) { prev.next, next.prev = next, prev })
}

// work runs handlers until the job channel is closed: each job, and the
// run behind it, in order. A handled message makes room for the next
// claim at once: its outcome is written by the completer, together with
// others, while the fetcher claims again (the claim does not wait for the
// write).
func (k *Consumer) work() {
	for j := range k.jobs {
		k.busy.Add(1)
		k.runChain(j)
		k.busy.Add(-1)
		k.window.Signal() // an idle worker may want a claim
	}
}

// runChain handles j and the run behind it, in order.
func (k *Consumer) runChain(j *job) {
	for ; j != nil; j = j.next {
		r, deadline := k.run(j)
		k.done(r)
		if r.outcome != outcomeAck || !time.Now().Before(deadline) {
			// The rest of the run waits for this message: hand it back
			// untried (its group's order holds it until this one is done).
			// So it does after a success that came too late: the message
			// may be out to another consumer again.
			for n := j.next; n != nil; n = n.next {
				k.unqueue(n)
				k.done(result{d: n.d, outcome: outcomeReleaseUnstarted})
			}
			return
		}
	}
}

// run handles j, or hands it back untried when the consumer is stopping
// or j's lease ran out while it waited (another consumer may hold it now).
// It returns j's outcome and the deadline its handler had.
func (k *Consumer) run(j *job) (result, time.Time) {
	deadline, lost := k.unqueue(j)
	if k.stopping.Load() || lost || !time.Now().Before(deadline) {
		return result{d: j.d, outcome: outcomeReleaseUnstarted}, deadline
	}
	return k.handle(j, deadline), deadline
}

// done passes a job's outcome to the completer and makes room for the
// next claim.
func (k *Consumer) done(r result) {
	k.results <- r
	k.window.Handled()
}

// unqueue takes j off the renewed set as a worker picks it: its handler
// must finish within the lease it holds now.
func (k *Consumer) unqueue(j *job) (deadline time.Time, lost bool) {
	k.queuedMu.Lock()
	defer k.queuedMu.Unlock()
	delete(k.queued, j)
	return j.deadline, j.lost
}

// handlerWindow is how long a handler may run within a lease: it ends
// shortly before the lease does.
func handlerWindow(lease time.Duration) time.Duration {
	return lease - min(lease/10, 5*time.Second)
}

// keepLeases renews, every third of the lease and in one statement, the
// leases of the claimed messages still waiting for a worker, so a message
// waits in the queue as long as it must without being claimed again (a
// running handler ends with its lease, see ConsumerConfig).
func (k *Consumer) keepLeases() {
	for {
		lease := k.topic.Load().Lease
		select {
		case <-k.fetchCtx.Done():
			return
		case <-time.After(lease / 3):
		}
		k.renewQueued(lease)
	}
}

func (k *Consumer) renewQueued(lease time.Duration) {
	k.queuedMu.Lock()
	jobs := make([]*job, 0, len(k.queued))
	copies := make([]*Delivery, 0, len(k.queued))
	now := time.Now()
	var stalled []*Delivery
	for j := range k.queued {
		if j.lost {
			continue // handed back already, or its lease could not be renewed
		}
		if k.stalled(j, now) {
			// Handed back untried (the attempt the claim counted given
			// back): the group's next claim takes it again, after the
			// stuck handler's message, whose lease runs out.
			j.lost = true
			d := *j.d
			stalled = append(stalled, &d)
			continue
		}
		d := *j.d // ExtendLeases writes LeaseUntil: not on a delivery a worker may hold
		jobs, copies = append(jobs, j), append(copies, &d)
	}
	k.queuedMu.Unlock()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(k.fetchCtx), lease/3)
	defer cancel()
	for _, d := range stalled {
		if err := k.client.Release(ctx, d, false); err != nil && !errors.Is(err, ErrLeaseLost) {
			k.client.logger.Error("pgoutbox: handing back a run behind a stuck handler failed; it is taken again when its lease ends",
				slog.String("topic", k.cfg.Topic), slog.Int64("id", d.ID), slog.Any("error", err))
		}
	}
	if len(jobs) == 0 {
		return
	}
	renewedAt := time.Now()
	lost, err := k.client.ExtendLeases(ctx, copies, lease)
	if err != nil {
		if k.fetchCtx.Err() == nil {
			k.client.logger.Error("pgoutbox: renewing the leases of queued messages failed", slog.String("topic", k.cfg.Topic),
				slog.Any("error", err))
		}
		return
	}
	gone := make(map[*Delivery]bool, len(lost))
	for _, d := range lost {
		gone[d] = true
	}
	k.queuedMu.Lock()
	defer k.queuedMu.Unlock()
	for i, j := range jobs {
		if _, ok := k.queued[j]; !ok {
			continue // a worker took it meanwhile: it keeps the lease it had
		}
		if gone[copies[i]] {
			j.lost = true
		} else {
			j.deadline = renewedAt.Add(handlerWindow(lease))
		}
	}
}

// stalled reports whether queued job j waits, in a run, behind a handler
// that overran its lease (one that ignores its context can run for ever):
// j could not start before that message is redelivered, so it is handed
// back instead of renewed (callers hold queuedMu).
func (k *Consumer) stalled(j *job, now time.Time) bool {
	for p := j.prev; p != nil; p = p.prev {
		if _, queued := k.queued[p]; !queued { // running (or just done)
			return !now.Before(p.deadline)
		}
	}
	return false
}

func (k *Consumer) handle(j *job, deadline time.Time) result {
	ctx, cancel := context.WithDeadline(k.workCtx, deadline)
	defer cancel()
	ctx, span := k.client.tracer.Process(ctx, k.cfg.Topic, "", j.d.ID, j.d.Attempt, j.d.Headers)
	start := time.Now()
	err := handlers.Call(ctx, k.cfg.Handler, j.d)
	k.client.metrics.handlerTime.Record(ctx, time.Since(start).Seconds(), k.attrs)
	tracing.End(span, err)
	if err == nil {
		return result{d: j.d, outcome: outcomeAck}
	}
	if k.workCtx.Err() != nil {
		return result{d: j.d, outcome: outcomeRelease, err: "consumer stopped: " + err.Error()}
	}
	r := result{d: j.d, err: err.Error()}
	v := k.topic.Load().Judge(err, j.d.Attempt)
	switch {
	case v.Snooze:
		r.outcome, r.delay = outcomeSnooze, v.Delay
	case v.DeadLetter:
		r.outcome = outcomeDead
	default:
		r.outcome, r.delay = outcomeRetry, v.Delay
	}
	handlers.LogFailure(k.events, k.cfg.Topic, err, r.outcome == outcomeDead, slog.String("topic", k.cfg.Topic),
		slog.Int64("id", j.d.ID), slog.Int("attempt", j.d.Attempt), slog.Duration("retry_in", r.delay))
	return r
}

// complete writes outcomes to the database in batches (see
// pipeline.Complete).
func (k *Consumer) complete() {
	pipeline.Complete(k.results, k.window, maxCompleteBatch, k.flush)
}

// maxCompleteBatch is the most outcomes one completion writes.
const maxCompleteBatch = 1000

func (k *Consumer) flush(batch []result) {
	var ackIDs []int64
	var ackAttempts []int32
	var s struct {
		ids      []int64
		attempts []int32
		delays   []int64
		dead     []bool
		errs     []*string
		uncount  []int32
	}
	var retried, dead int64
	for i := range batch {
		r := &batch[i]
		if r.outcome == outcomeAck {
			ackIDs = append(ackIDs, r.d.ID)
			ackAttempts = append(ackAttempts, int32(r.d.Attempt))
			continue
		}
		s.ids = append(s.ids, r.d.ID)
		s.attempts = append(s.attempts, int32(r.d.Attempt))
		s.delays = append(s.delays, r.delay.Microseconds())
		s.dead = append(s.dead, r.outcome == outcomeDead)
		var e *string
		if r.err != "" {
			msg := r.err
			e = &msg
		}
		s.errs = append(s.errs, e)
		var uncount int32
		if r.outcome == outcomeReleaseUnstarted || r.outcome == outcomeSnooze {
			uncount = 1
		}
		s.uncount = append(s.uncount, uncount)
		switch r.outcome {
		case outcomeDead:
			dead++
		case outcomeRetry:
			retried++
		}
	}
	ctx := context.Background()
	if len(ackIDs) > 0 {
		k.exec("ack", k.client.sql.Ack, ackIDs, ackAttempts)
		k.client.metrics.acked.Add(ctx, int64(len(ackIDs)), k.attrs)
	}
	if len(s.ids) > 0 {
		k.exec("settle", k.client.sql.Settle, s.ids, s.attempts, s.delays, s.dead, s.errs, s.uncount, k.client.now())
		k.client.metrics.retried.Add(ctx, retried, k.attrs)
		k.client.metrics.deadLettered.Add(ctx, dead, k.attrs)
	}
}

// exec runs a completion statement, retrying briefly. If it still fails the
// leases expire and the messages are redelivered: at least once holds.
func (k *Consumer) exec(what, sql string, args ...any) {
	err := backoff.Retry(context.Background(), 3, 50*time.Millisecond, time.Second, nil, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := k.client.pool.Exec(ctx, sql, args...)
		return err
	})
	if err == nil {
		return
	}
	k.client.logger.Error("pgoutbox: completion write failed; messages will be redelivered after their lease",
		slog.String("topic", k.cfg.Topic), slog.String("op", what), slog.Any("error", err))
}

// maintain periodically reloads the topic's configuration. (Expired leases
// need no sweeper: the next claim takes them back; expired idempotency keys
// are the maintenance service's.)
func (k *Consumer) maintain() {
	tick := time.NewTicker(k.cfg.PollInterval)
	defer tick.Stop()
	for {
		k.maintainOnce()
		select {
		case <-k.fetchCtx.Done():
			return
		case <-tick.C:
		}
	}
}

func (k *Consumer) maintainOnce() {
	ctx, cancel := context.WithTimeout(k.fetchCtx, 30*time.Second)
	defer cancel()
	if topic, err := k.client.loadTopic(ctx, k.client.pool, k.cfg.Topic); err == nil && topic.Semantics == Queue {
		k.topic.Store(&topic)
	}
}

// IsSnooze reports whether err was made with Snooze, and its delay.
func IsSnooze(err error) (time.Duration, bool) {
	var r *retryError
	if errors.As(err, &r) && r.snooze {
		return r.delay, true
	}
	return 0, false
}

// RetryDelay reports the delay err carries from RetryAfter (or Snooze), if any.
func RetryDelay(err error) (time.Duration, bool) {
	var r *retryError
	if errors.As(err, &r) {
		return r.delay, true
	}
	return 0, false
}

// IsPermanent reports whether err was wrapped with Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// Verdict is what becomes of a delivery whose handler failed, under its
// topic's rules (see TopicConfig.Judge).
type Verdict struct {
	// DeadLetter: the message is dead-lettered now (Permanent, or its
	// last attempt).
	DeadLetter bool
	// Snooze: the attempt is given back (Snooze).
	Snooze bool
	// Delay is how long until the message is delivered again, when it
	// is not dead-lettered: the error's RetryAfter or Snooze delay, else
	// the topic's backoff for the attempt.
	Delay time.Duration
}

// Judge returns what becomes of a delivery on attempt (1 for the first)
// whose handler returned err, which is not nil. Both consumers of this
// module follow it; a program that claims with Client.Claim can too, to
// choose between Client.Retry, Client.Postpone and Client.DeadLetter.
func (t TopicConfig) Judge(err error, attempt int) Verdict {
	var r *retryError
	isRetry := errors.As(err, &r)
	switch {
	case isRetry && r.snooze:
		return Verdict{Snooze: true, Delay: r.delay}
	case IsPermanent(err), attempt >= t.MaxAttempts:
		return Verdict{DeadLetter: true}
	case isRetry:
		return Verdict{Delay: r.delay}
	default:
		return Verdict{Delay: backoff.Exponential(attempt, t.BackoffInitial, t.BackoffMax)}
	}
}
