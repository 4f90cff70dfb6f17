package consumergroup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"

	"github.com/pgoutbox/pgoutbox/internal/engine"
	"github.com/pgoutbox/pgoutbox/internal/pipeline"
	"github.com/pgoutbox/pgoutbox/internal/startstop"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// runner is a started instance's machinery. Its goroutines, one role per
// file, and what each may touch:
//
//   - fetcher (engine.Fetcher), one goroutine: locks the group's
//     position, runs backfill steps, takes over expired batches, claims
//     retries and fetches batches; dispatches jobs to the executor. Adds
//     to held. It reads the group's tracking and sets it (setTracking),
//     and ends the run when the subscription is gone (end).
//   - executor (pipeline.Executor): Concurrency workers plus one
//     goroutine per batch given to a BatchHandler run handlers; its
//     watchdog fails and replaces handler calls that overran their
//     timeout. It removes each job from the window as it is handled: the
//     next fetch does not wait for the write.
//   - completer (complete, writing through engine.Instance), one
//     goroutine: writes the executor's outcomes. Removes from held.
//   - heartbeat (heartbeat.go), one goroutine: liveness, following the
//     subscription's state, resurrection.
//   - janitor (janitor.go), one goroutine: dead-group detection,
//     forgetting groups that left, expired idempotency keys.
//   - lease keeper (engine.Instance.KeepLeases), one goroutine: extends
//     the leases of what held lists, while anyone works on it.
//
// Everything they share is atomic, a channel, or guarded by the mutex
// named beside it.
type runner struct {
	g *Group // read-only

	members atomic.Pointer[[]member] // written by AddConsumer/RemoveConsumer
	window  *pipeline.Window         // what the instance holds, and when it fetches next
	exec    *pipeline.Executor       // runs the handlers
	held    *pipeline.Held           // leases being worked on
	eng     *engine.Instance         // the completer's writes and the lease keeper
	fetcher *engine.Fetcher          // set by start

	hbPool    *pgxpool.Pool // heartbeats and lifecycle work
	releaseHB func()        // gives hbPool back (closes a pool of its own)
	unsub     func()        // ends the topic's notifications
	// unregisterLive forgets the instance as one its client proves alive
	// (outbox.Client.LiveInstance).
	unregisterLive func()

	gauges metric.Registration // the blocked-group gauges of the run, if any

	fetchCtx   context.Context // the run's (Group.life): fetcher, heartbeat, janitor; its cause says why it ended
	keepCtx    context.Context // lease keeper
	keepCancel context.CancelFunc

	fetchers startstop.Tasks // fetcher, heartbeat, janitor
	writer   startstop.Tasks // completer
	keepers  startstop.Tasks // lease keeper

	stopped  <-chan struct{} // closed when the run ended
	looks    lookRecord      // the looks' outcomes, for Status (own mutex)
	lastBeat atomic.Int64    // unix nanos of the last heartbeat that went through (the start, at first)
}

func (g *Group) newRunner() (*runner, error) {
	r := &runner{g: g, held: pipeline.NewHeld()}
	r.eng = &engine.Instance{
		Pool: g.pool, Statements: g.q, Subscription: g.sub.ID, ID: g.cfg.InstanceID,
		Now: g.now, Logger: g.logger, Events: g.events, Held: r.held,
		Mask:          func() int64 { return g.tracking().Sub.Mask() },
		Acked:         g.metrics.acked.Add,
		Retried:       g.metrics.retried.Add,
		BatchFinished: g.testBatchFinished,
	}
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
	switch {
	case g.batchHandler == nil: // members: it holds what they finish soon (see pipeline.Window)
		r.window = pipeline.NewPacedWindow(capacity, g.cfg.BatchSize, g.cfg.Concurrency)
	case g.cfg.ConcurrentBatches > 0:
		capacity = g.cfg.BatchSize * g.cfg.ConcurrentBatches
		fallthrough
	default: // a batch handler gets whole batches
		r.window = pipeline.NewWindow(capacity, g.cfg.BatchSize)
	}
	r.exec = pipeline.NewExecutor(pipeline.ExecutorConfig{
		Workers:        g.cfg.Concurrency,
		Capacity:       capacity,
		Window:         r.window,
		Timeout:        g.handlerTimeout(),
		Handler:        r.handlerOf,
		BatchHandler:   pipeline.BatchHandler(g.batchHandler),
		Judge:          g.topic.Judge,
		ByMessageGroup: g.byMessageGroup(),
		Topic:          g.cfg.Topic,
		Group:          g.cfg.Group,
		Tracer:         g.tracer,
		HandlerTime:    func(ctx context.Context, d time.Duration) { g.metrics.handlerTime.Record(ctx, d.Seconds()) },
		Failures:       g.events,
		Logger:         g.logger,
	})
	r.keepCtx, r.keepCancel = context.WithCancel(context.Background())
	return r, nil
}

// newFetcher returns the instance's fetcher, woken by wake.
func (r *runner) newFetcher(wake <-chan struct{}) *engine.Fetcher {
	g := r.g
	return engine.NewFetcher(r.eng, engine.FetchConfig{
		Topic: g.cfg.Topic, Group: g.cfg.Group,
		PollInterval: g.cfg.PollInterval, Lease: g.topic.Lease, MaxAttempts: g.topic.MaxAttempts,
		ByMessageGroup: g.byMessageGroup(), DeadLettersBlock: g.deadLettersBlock(),
		Catchup: catchupFor(g.subRow),
		Backfill: engine.BackfillPace{
			Rate: g.opts.BackfillRate, BatchSize: g.opts.BackfillBatchSize,
			// The bucket holds at least a default batch: a small backfill
			// is over before any rule matters.
			Burst:         max(g.opts.BackfillBatchSize, DefaultBackfillBatchSize),
			TargetLatency: g.opts.BackfillTargetLatency, MaxSlowdown: g.opts.BackfillMaxSlowdown,
		},
		Tracking: g.tracking, SetTracking: g.setTracking,
		CanFetch: r.canFetch, End: r.end, Looks: &r.looks,
		Window: r.window, Wake: wake, Exec: r.exec, ProbePool: r.hbPool, Tracer: g.tracer,
		FetchTime:      func(ctx context.Context, d time.Duration) { g.metrics.fetchTime.Record(ctx, d.Seconds()) },
		Delivered:      g.metrics.delivered.Add,
		Backfilled:     g.metrics.backfilled.Add,
		BackfillPauses: g.metrics.backfillPauses.Add,
		TakenOver:      g.metrics.takenOver.Add,
	})
}

// start starts the run's roles; run is the run's context (Group.life),
// done ends the run once shutdown finished.
func (r *runner) start(run context.Context, done func()) {
	r.fetchCtx, r.stopped = run, r.g.life.Stopped()
	r.looks.started = time.Now()
	r.lastBeat.Store(time.Now().UnixNano()) // registering was as good as a beat
	r.gauges = r.g.observeBlockedGroups()
	wake, unsub := r.g.client.WakeUps(r.g.cfg.Topic)
	r.fetcher, r.unsub = r.newFetcher(wake), unsub
	r.unregisterLive = r.g.client.LiveInstance(run, r.g.cfg.InstanceID)
	r.writer.Go(r.complete)
	r.keepers.Go(func() { r.eng.KeepLeases(r.keepCtx, r.hbPool, r.g.topic.Lease) })
	r.exec.Start()
	r.fetchers.Go(func() {
		r.g.client.WaitRecorded(run) // leases nothing unrecorded (see outbox.Client.LiveInstance)
		r.fetcher.Run(run)
	})
	r.fetchers.Go(r.heartbeat)
	r.fetchers.Go(r.janitor)
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
		r.exec.CancelHandlers()
	}
	select {
	case <-r.stopped:
	case <-ctx.Done():
		r.exec.CancelHandlers()
		<-r.stopped
		return ctx.Err()
	}
	return r.exec.WaitAbandoned(ctx)
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

// handlerOf is the handler of the member d goes to, or nil: every
// member's filter rejected it.
func (r *runner) handlerOf(d *outbox.Delivery) outbox.Handler {
	if m := pick(*r.members.Load(), d); m != nil {
		return m.handler
	}
	return nil
}

// shutdown stops the roles in dependency order: fetching and heartbeats,
// then the executor (queued jobs are handed back unhandled), then the
// completer once every outcome is in, then the lease keeper.
func (r *runner) shutdown() {
	r.exec.BeginStop()
	r.fetchers.Wait()
	r.exec.Close()
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

// complete is the completer: one goroutine per instance, writing outcomes
// in the order they come (see engine.Instance.Write), several at once
// when they arrive while a write runs.
func (r *runner) complete() {
	pipeline.Complete(r.exec.Settled(), r.window, engine.MaxOutcomesPerWrite, r.eng.Write)
}
