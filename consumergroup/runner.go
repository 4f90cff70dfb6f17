package consumergroup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"

	"github.com/pgoutbox/pgoutbox/internal/pipeline"
	"github.com/pgoutbox/pgoutbox/internal/startstop"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// runner is a started instance's machinery. Its goroutines, one role per
// file, and what each may touch:
//
//   - fetcher (fetcher.go), one goroutine: locks the group's position,
//     runs backfill steps, takes over expired batches, claims retries and
//     fetches batches; hands jobs to the executors. Owns lastReap. Adds to
//     the window and held.
//   - executors (executor.go), Concurrency goroutines plus one per batch
//     given to a BatchHandler: run handlers. Each owns its slot.
//   - watchdog (executor.go), one goroutine: fails and replaces handler
//     calls that overran their timeout (through the slots' locks).
//   - completer (completer.go), one goroutine: writes outcomes. Removes
//     from held. (Executors remove from the window as they finish each
//     message: the next fetch does not wait for the write.)
//   - heartbeat (heartbeat.go), one goroutine: liveness, following the
//     subscription's state, resurrection.
//   - janitor (janitor.go), one goroutine: dead-group detection,
//     forgetting groups that left, expired idempotency keys.
//   - lease keeper (leases.go), one goroutine: extends the leases of what
//     held lists, while anyone works on it.
//
// Everything they share is atomic, a channel, or guarded by the mutex
// named beside it.
type runner struct {
	g *Group // read-only

	members atomic.Pointer[[]member] // written by AddConsumer/RemoveConsumer
	window  *pipeline.Window         // what the instance holds, and when it fetches next
	held    held                     // leases being worked on (own mutex)

	inflightMu sync.Mutex
	inflight   map[*outbox.Delivery]*job // handed out and not yet recorded (see Group.AckTx)

	// testBatchFinished, when set (tests), is called by the completer
	// after a batch's outcome was written and before it leaves held.
	testBatchFinished func(batchID int64)

	hbPool    *pgxpool.Pool   // heartbeats and lifecycle work
	releaseHB func()          // gives hbPool back (closes a pool of its own)
	wake      <-chan struct{} // notifications for the topic
	unsub     func()
	// unregisterLive forgets the instance as one its client proves alive
	// (outbox.Client.LiveInstance).
	unregisterLive func()

	jobs     chan *job           // fetcher → executors; closed by shutdown
	finished chan settled        // executors, watchdog → completer; closed by shutdown
	gauges   metric.Registration // the blocked-group gauges of the run, if any

	slotsMu sync.Mutex
	slots   map[*slot]struct{} // executors running a handler loop

	fetchCtx    context.Context // the run's (Group.life): fetcher, heartbeat, janitor; its cause says why it ended
	workCtx     context.Context // handler calls
	workCancel  context.CancelFunc
	cancelledAt atomic.Int64    // unix nanos when workCtx was cancelled
	keepCtx     context.Context // lease keeper and watchdog
	keepCancel  context.CancelFunc

	fetchers  startstop.Tasks // fetcher, heartbeat, janitor
	workWG    sync.WaitGroup  // executors (not abandoned ones), batch goroutines: the watchdog moves executors to abandoned
	writer    startstop.Tasks // completer
	keepers   startstop.Tasks // lease keeper, watchdog
	abandoned sync.WaitGroup  // handler calls given up on, still running

	stopping atomic.Bool
	stopped  <-chan struct{} // closed when the run ended
	looks    lookRecord      // the looks' outcomes, for Status (own mutex)
	lastBeat atomic.Int64    // unix nanos of the last heartbeat that went through (the start, at first)

	// The fetcher's own: it takes turns between the stream and a pending
	// backfill, whose reads the throttle paces.
	catchupTurn        bool
	throttle           *throttle
	catchupWait        time.Duration // until the throttle allows the next catch-up read (0: none waits)
	backfilling        atomic.Bool   // a backfill is pending: the load sampler probes
	idleSince          time.Time     // when an empty look last moved the position (see idlePositionEvery)
	idle               bool          // the last full look found nothing to do (see look)
	silent             bool          // it stopped fetching for want of heartbeats (see canFetch)
	lastReap           time.Time     // when a look last reaped retries
	lastFullLook       time.Time     // when the fetcher last looked in full (see idleFullLookEvery)
	lastTurn           chan struct{} // closed once the last batch handed to the batch handler had its turn (see InTurn)
	walkAfter          string        // an ordered group's next claim walks the message groups from after this one
	noReadAhead        bool          // the last look took over, claimed retries or had a backfill pending (see readAhead)
	parkedSinceAnalyze int           // rows queued in the retry table since lastAnalyze (see analyze.go)
	lastAnalyze        time.Time     // when the fetcher last analyzed the retry table
}

// job is one delivery to handle.
type job struct {
	d     *outbox.Delivery
	batch *batch // nil for a retry delivery
	next  *job   // an ordered group's next message of the same message group in one claim, handled after this one succeeds
}

// batch is a fetched batch being handled; its outcome is written whole.
type batch struct {
	id        int64
	size      int
	remaining atomic.Int64
	mu        sync.Mutex // guards the outcome lists
	acked     []int64
	ackedInTx []int64   // acked in handlers' transactions (see Group.AckTx)
	failed    []failure // to retry or dead-letter
	released  []failure // never handled (stopping): handed back
}

type failure struct {
	id       int64
	attempts int // attempts spent
	delay    time.Duration
	at       time.Time // when set, the instant it is due again (delay approximates it)
	dead     bool
	snoozed  bool // the handler did not try it: the attempt is given back
	err      string
}

type outcome int

const (
	ack     outcome = iota
	fail            // retry later or dead-letter
	release         // not handled (the instance is stopping): hand back
)

// settled is what the completer writes: a whole batch or one retry delivery.
type settled struct {
	batch *batch
	retry *retryOut
}

type retryOut struct {
	outcome outcome
	f       failure
}

// held lists the batches and retry deliveries of this instance that
// somebody still works on: the lease keeper extends their leases.
type held struct {
	mu      sync.Mutex
	batches map[int64]bool // true once the completer began to finish it
	retries map[int64]struct{}
	lost    map[int64]bool // batches whose takeover was reported (see reportLost)
}

func (h *held) add(batchID int64, retryIDs []int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if batchID != 0 {
		h.batches[batchID] = false
	}
	for _, id := range retryIDs {
		h.retries[id] = struct{}{}
	}
}

func (h *held) remove(batchID, retryID int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.batches, batchID)
	delete(h.retries, retryID)
	delete(h.lost, batchID)
}

// reportLost records that batchID was taken over, reporting whether that
// is news.
func (h *held) reportLost(batchID int64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lost[batchID] {
		return false
	}
	h.lost[batchID] = true
	return true
}

// finishing records that the completer is about to delete batchID's row:
// from then on its absence is no sign of a takeover.
func (h *held) finishing(batchID int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.batches[batchID]; ok {
		h.batches[batchID] = true
	}
}

// workingOn reports whether batchID is held and not being finished.
func (h *held) workingOn(batchID int64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	finishing, ok := h.batches[batchID]
	return ok && !finishing
}

func (h *held) snapshot() (batches, retries []int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for id := range h.batches {
		batches = append(batches, id)
	}
	for id := range h.retries {
		retries = append(retries, id)
	}
	return batches, retries
}

func (g *Group) newRunner() (*runner, error) {
	r := &runner{g: g, slots: map[*slot]struct{}{}, inflight: map[*outbox.Delivery]*job{}, testBatchFinished: g.testBatchFinished, throttle: newThrottle(g.opts)}
	r.held.batches, r.held.retries, r.held.lost = map[int64]bool{}, map[int64]struct{}{}, map[int64]bool{}
	members := g.members
	r.members.Store(&members)
	r.hbPool, r.releaseHB = g.cfg.HeartbeatPool, func() {}
	switch {
	case r.hbPool != nil:
	case g.pool == g.client.Pool(): // the client's instances share one
		p, release, err := g.client.HeartbeatPool()
		if err != nil {
			return nil, err
		}
		r.hbPool, r.releaseHB = p, release
	default: // a pool of its own, from its own pool's settings, so it ends with that pool's process
		pc := g.pool.Config().Copy()
		pc.MaxConns, pc.MinConns = 2, 0
		p, err := pgxpool.NewWithConfig(context.Background(), pc)
		if err != nil {
			return nil, fmt.Errorf("consumergroup: heartbeat pool: %w", err)
		}
		r.hbPool, r.releaseHB = p, p.Close
	}
	capacity := pipeline.Capacity(g.cfg.BatchSize, g.cfg.Concurrency, g.byMessageGroup())
	if g.batchHandler != nil && g.cfg.ConcurrentBatches > 0 {
		capacity = g.cfg.BatchSize * g.cfg.ConcurrentBatches
	}
	r.jobs = make(chan *job, capacity)
	r.finished = make(chan settled, capacity)
	r.window = pipeline.NewWindow(capacity, g.cfg.BatchSize)
	r.workCtx, r.workCancel = context.WithCancel(context.Background())
	r.keepCtx, r.keepCancel = context.WithCancel(context.Background())
	return r, nil
}

// start starts the run's roles; run is the run's context (Group.life),
// done ends the run once shutdown finished.
func (r *runner) start(run context.Context, done func()) {
	r.fetchCtx, r.stopped = run, r.g.life.Stopped()
	r.looks.started = time.Now()
	r.lastBeat.Store(time.Now().UnixNano()) // registering was as good as a beat
	r.gauges = r.g.observeBlockedGroups()
	r.wake, r.unsub = r.g.client.WakeUps(r.g.cfg.Topic)
	r.unregisterLive = r.g.client.LiveInstance(run, r.g.cfg.InstanceID)
	r.writer.Go(r.complete)
	r.keepers.Go(r.keepLeases)
	r.keepers.Go(r.watch)
	for range r.g.cfg.Concurrency {
		r.startExecutor()
	}
	r.fetchers.Go(r.fetch)
	r.fetchers.Go(r.heartbeat)
	r.fetchers.Go(r.janitor)
	if r.throttle.slowdown > 0 {
		r.fetchers.Go(r.sampleLoad)
	}
	go func() {
		<-run.Done()
		r.shutdown()
		done()
	}()
}

// stop stops the instance (cause, when not nil, records why the instance
// stops itself) and waits for it until ctx ends: then it cancels the
// handlers still running and returns ctx's error once the instance
// stopped (handlers that ignore their context are left running). It then
// waits for such abandoned handlers until ctx ends.
func (r *runner) stop(ctx context.Context, cancelHandlers bool, cause error) error {
	if cause != nil {
		r.g.life.EndRun(cause)
	} else {
		r.g.life.StopInit()
	}
	if cancelHandlers {
		r.cancelWork()
	}
	select {
	case <-r.stopped:
	case <-ctx.Done():
		r.cancelWork()
		<-r.stopped
		return ctx.Err()
	}
	return startstop.WaitGroup(ctx, &r.abandoned)
}

// end stops the instance from one of its own goroutines, which must
// return right after.
func (r *runner) end(cause error) {
	if errors.Is(cause, ErrCancelled) {
		r.g.logger.Warn("pgoutbox: the group's subscription was cancelled; this instance stops", slog.Any("error", cause))
	} else {
		r.g.logger.Error("pgoutbox: the group's subscription is gone; this instance stops", slog.Any("error", cause))
	}
	r.g.life.EndRun(cause)
}

// cause is why the run ended on its own, or nil (it runs, or was stopped).
func (r *runner) cause() error {
	if r.fetchCtx.Err() == nil {
		return nil
	}
	if c := context.Cause(r.fetchCtx); !errors.Is(c, startstop.ErrStop) {
		return c
	}
	return nil
}

func (r *runner) isStopping() bool { return r.stopping.Load() }

func (r *runner) cancelWork() {
	r.cancelledAt.CompareAndSwap(0, time.Now().UnixNano())
	r.workCancel()
}

// shutdown stops the roles in dependency order: fetching and heartbeats,
// then the executors (queued jobs are handed back unhandled), then the
// completer once every outcome is in, then the lease keeper and watchdog.
func (r *runner) shutdown() {
	r.stopping.Store(true)
	r.fetchers.Wait()
	close(r.jobs)
	r.workWG.Wait()
	close(r.finished)
	r.writer.Wait()
	r.keepCancel()
	r.keepers.Wait()
	r.unregisterLive()
	r.unsub()
	if r.gauges != nil {
		_ = r.gauges.Unregister()
	}
	r.releaseHB()
	r.g.logger.Info("pgoutbox: consumer group instance stopped")
}
