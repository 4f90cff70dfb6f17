package router

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/startstop"
)

// runningSource is a source and its current Run. The router's mu guards
// every field but removed.
type runningSource struct {
	src        Source
	cancel     context.CancelFunc // ends the current Run
	done       chan struct{}      // closed when the current Run returned
	keeping    bool               // a lease keeper runs for src
	restarting bool               // a restart waits for the current Run to return
	removed    atomic.Bool        // RemoveSource took it out
	current    *sourceRun         // the current Run
}

// sourceRun is one Run of a source.
type sourceRun struct {
	name  string
	ready chan struct{} // closed once it subscribed (a ReadySource), or as it starts
	done  chan struct{} // closed when it returned
	err   error         // what it returned; read once done is closed
}

// AddSource registers a source; sources added after Start start at once.
func (r *Router) AddSource(s Source) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rs := &runningSource{src: s}
	r.sources = append(r.sources, rs)
	if r.live {
		r.runSource(rs, false)
	}
}

// RemoveSource stops s claiming and waits until its Run returned (or ctx
// ended: then it returns ctx.Err() and Stop waits for the rest). The
// messages s already handed over are still delivered and settled, their
// leases kept alive; a QueueSource's or GroupSource's Run returns once
// they are (its batch ends then). It returns ErrUnknownSource for a source that was
// not added (or already removed).
func (r *Router) RemoveSource(ctx context.Context, s Source) error {
	if s == nil || !reflect.TypeOf(s).Comparable() {
		return ErrUnknownSource
	}
	r.mu.Lock()
	i := slices.IndexFunc(r.sources, func(rs *runningSource) bool { return rs.src == s })
	if i < 0 {
		r.mu.Unlock()
		return ErrUnknownSource
	}
	rs := r.sources[i]
	r.sources = slices.Delete(r.sources, i, i+1)
	rs.removed.Store(true)
	cancel, done := rs.cancel, rs.done
	r.mu.Unlock()
	if done == nil {
		return nil // never started
	}
	cancel()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// runSource starts a Run of rs (callers hold mu); restart says whether it
// replaces one that stalled or exited.
func (r *Router) runSource(rs *runningSource, restart bool) {
	ctx, cancel := context.WithCancel(r.bg)
	run := &sourceRun{name: rs.src.Name(), ready: make(chan struct{}), done: make(chan struct{})}
	rs.cancel, rs.done, rs.current = cancel, run.done, run
	if k, ok := rs.src.(LeaseKeeper); ok && !rs.keeping {
		rs.keeping = true
		keepStop := r.keepStop
		r.keepers.Go(func() { r.keepLeases(rs, k, keepStop) })
	}
	r.runs.Go(func() {
		var err error
		defer func() { run.err = err; close(run.done) }()
		err = r.run(ctx, rs.src, sync.OnceFunc(func() { close(run.ready) }))
		if err == nil || ctx.Err() != nil {
			return
		}
		name := rs.src.Name()
		r.logger.Error("pgoutbox router: source stopped", slog.String("source", name), slog.Any("error", err))
		if restart {
			r.warn.add(WarnConsumerRestartFailed, SeverityCritical, name, fmt.Sprintf("source %s failed after its restart: %v", name, err))
		}
	})
}

// run is src.Run (or RunReady) with a panic turned into an error. ready
// is called once src is subscribed: by a ReadySource when it says so, at
// once for other sources.
func (r *Router) run(ctx context.Context, src Source, ready func()) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("panic: %v", v)
			r.logger.Error("pgoutbox router: source panicked", slog.String("source", src.Name()), slog.Any("panic", v),
				slog.String("stack", string(debug.Stack())))
		}
	}()
	if rs, ok := src.(ReadySource); ok {
		return rs.RunReady(ctx, r.Route, ready)
	}
	ready()
	return src.Run(ctx, r.Route)
}

// waitReady waits until each of runs is subscribed. It fails with the
// error of a Run that returned first, ctx's, or that of the router's run
// (stopped meanwhile).
func waitReady(ctx, routerRun context.Context, runs []*sourceRun) error {
	for _, run := range runs {
		select {
		case <-run.ready:
			continue
		case <-run.done:
		case <-ctx.Done():
			return fmt.Errorf("router: waiting for source %s to subscribe: %w", run.name, ctx.Err())
		case <-routerRun.Done():
			return fmt.Errorf("router: stopped while source %s subscribed: %w", run.name, context.Cause(routerRun))
		}
		if startstop.Closed(run.ready) {
			continue // subscribed, then returned: the health check restarts it
		}
		if run.err == nil {
			return fmt.Errorf("router: source %s returned before it subscribed", run.name)
		}
		return fmt.Errorf("router: source %s: %w", run.name, run.err)
	}
	return nil
}

// checkSources restarts sources that stopped polling or whose Run
// returned. A stalled Run is cancelled first; the new one starts once it
// returned, so two Runs of a source never overlap.
func (r *Router) checkSources() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.live {
		return
	}
	for _, rs := range r.sources {
		if rs.restarting || rs.done == nil {
			continue
		}
		last := rs.src.LastPoll()
		exited := startstop.Closed(rs.done)
		if stalled := !last.IsZero() && time.Since(last) > r.cfg.StallTimeout; !stalled && !exited {
			continue
		}
		name, why := rs.src.Name(), fmt.Sprintf("stalled (last poll %v)", last)
		if exited {
			why = "stopped"
		}
		r.warn.add(WarnConsumerRestart, SeverityWarn, name, fmt.Sprintf("source %s %s; restarting", name, why))
		if exited {
			r.runSource(rs, true)
			continue
		}
		rs.cancel()
		rs.restarting = true
		done := rs.done
		r.loops.Go(func() { r.restartAfter(rs, done) })
	}
}

// restartAfter starts rs again once its cancelled Run (done) returned.
func (r *Router) restartAfter(rs *runningSource, done <-chan struct{}) {
	late := time.NewTimer(r.cfg.StallTimeout)
	defer late.Stop()
	for waiting := true; waiting; {
		select {
		case <-r.bg.Done():
			r.mu.Lock()
			rs.restarting = false // the router stops: a new run starts it afresh
			r.mu.Unlock()
			return
		case <-late.C:
			name := rs.src.Name()
			r.warn.add(WarnConsumerRestartFailed, SeverityCritical, name,
				fmt.Sprintf("source %s did not stop within %v of its cancellation; it restarts once it does", name, r.cfg.StallTimeout))
		case <-done:
			waiting = false
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	rs.restarting = false
	if r.live && !rs.removed.Load() {
		r.runSource(rs, true)
	}
}

// keepLeases renews the leases of rs's source every RenewEvery until Stop
// has settled everything, or until the source was removed and holds
// nothing any more.
func (r *Router) keepLeases(rs *runningSource, k LeaseKeeper, keepStop <-chan struct{}) {
	name := rs.src.Name()
	t := time.NewTimer(k.RenewEvery())
	defer t.Stop()
	for {
		select {
		case <-keepStop:
			return
		case <-t.C:
		}
		every := k.RenewEvery()
		ctx, cancel := context.WithTimeout(context.Background(), every)
		held, lost, err := k.KeepLeases(ctx)
		cancel()
		if err != nil {
			r.events.Log(slog.LevelWarn, "lease-renewal|"+name, "pgoutbox router: renewing leases failed", slog.String("event", "lease-renewal"),
				slog.String("source", name), slog.Int("held", held), slog.Any("error", err))
		}
		if lost > 0 {
			r.events.Log(slog.LevelWarn, "lease-lost|"+name, "pgoutbox router: leases lost; those messages may be delivered twice",
				slog.String("event", "lease-lost"), slog.String("source", name), slog.Int("lost", lost))
		}
		if held == 0 && rs.removed.Load() {
			return
		}
		t.Reset(every)
	}
}

// SourceStatus is where a source of a router stands, from memory.
type SourceStatus struct {
	// Name is the source's name.
	Name string `json:"name"`
	// Running: a Run of the source is in progress. The router restarts a
	// Run that returned or stalled (see Warnings).
	Running bool `json:"running"`
	// LastPoll is the source's own LastPoll.
	LastPoll time.Time `json:"last_poll"`
	// LastError is what the last Run that ended returned, if anything.
	LastError string `json:"last_error,omitempty"`
	// Instance is the status of the consumer group instance behind an
	// InstanceSource (nil for other sources, or before its first Run).
	Instance *consumergroup.Status `json:"instance,omitempty"`
}

// Sources returns where each source stands, in the order they were added.
func (r *Router) Sources() []SourceStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]SourceStatus, 0, len(r.sources))
	for _, rs := range r.sources {
		st := SourceStatus{Name: rs.src.Name(), LastPoll: rs.src.LastPoll()}
		if run := rs.current; run != nil {
			if startstop.Closed(run.done) {
				if run.err != nil {
					st.LastError = run.err.Error()
				}
			} else {
				st.Running = true
			}
		}
		if is, ok := rs.src.(InstanceSource); ok {
			if s, ok := is.Instance(); ok {
				st.Instance = &s
			}
		}
		out = append(out, st)
	}
	return out
}

// Running reports whether the router runs (between Start and Stop).
func (r *Router) Running() bool { return r.life.Running() }
