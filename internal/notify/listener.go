// Package notify keeps one dedicated connection LISTENing on a channel and
// fans notifications out to subscribers by payload (a topic name).
//
// LISTEN needs a session of its own (it does not survive PgBouncer's
// transaction pooling), so the listener opens a connection outside the pool.
// It reconnects with backoff when the connection drops (the backoff starts
// afresh after every connection that got as far as LISTEN), and wakes every
// subscriber after each (re)connect because notifications sent meanwhile are
// lost. Consumers must keep polling: a wake-up is a hint, never the only path.
package notify

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/backoff"
	"github.com/pgoutbox/pgoutbox/internal/ident"
	"github.com/pgoutbox/pgoutbox/internal/startstop"
)

// Listener LISTENs on one channel between Start and Stop; Stop waits for
// its goroutines.
type Listener struct {
	connConfig *pgx.ConnConfig
	channel    string
	logger     *slog.Logger
	probe      Probe

	mu   sync.Mutex
	subs map[string]map[chan struct{}]struct{} // topic -> wake channels

	probes chan string // payloads of probes that came back

	life      startstop.Base
	ready     chan struct{} // closed after the first successful LISTEN
	readyOnce sync.Once

	listening atomic.Bool            // a connection LISTENs now
	deaf      atomic.Bool            // the last probe did not come back
	lastErr   atomic.Pointer[string] // why the last connection ended
}

// State is where a listener stands.
type State struct {
	// Listening: a connection LISTENs now.
	Listening bool
	// Deaf: the last probe sent through the producers' path did not come
	// back (a transaction pooler between them?).
	Deaf bool
	// LastError is why the last connection ended, if one did.
	LastError string
}

// State returns where the listener stands now.
func (l *Listener) State() State {
	s := State{Listening: l.listening.Load(), Deaf: l.deaf.Load()}
	if e := l.lastErr.Load(); e != nil {
		s.LastError = *e
	}
	return s
}

// Probe checks that the LISTEN connection receives what producers send:
// Send notifies the channel with payload the way producers do (through
// their pool), every Interval.
type Probe struct {
	Interval time.Duration // 0: no probing
	Send     func(ctx context.Context, channel, payload string) error
}

// probePrefix starts a probe's payload; no topic name can contain '#'.
const probePrefix = "#probe:"

// New returns a listener that will connect with connConfig.
func New(connConfig *pgx.ConnConfig, channel string, logger *slog.Logger, probe Probe) *Listener {
	return &Listener{
		connConfig: connConfig.Copy(),
		channel:    channel,
		logger:     logger,
		probe:      probe,
		subs:       map[string]map[chan struct{}]struct{}{},
		probes:     make(chan string, 8),
		ready:      make(chan struct{}),
	}
}

// Subscribe returns a channel that receives a value (coalesced, never
// blocking the listener) when topic is notified, and a function to stop.
func (l *Listener) Subscribe(topic string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	l.mu.Lock()
	if l.subs[topic] == nil {
		l.subs[topic] = map[chan struct{}]struct{}{}
	}
	l.subs[topic][ch] = struct{}{}
	l.mu.Unlock()
	return ch, func() {
		l.mu.Lock()
		delete(l.subs[topic], ch)
		if len(l.subs[topic]) == 0 {
			delete(l.subs, topic)
		}
		l.mu.Unlock()
	}
}

// Ready is closed once the listener has LISTENed successfully for the first time.
func (l *Listener) Ready() <-chan struct{} { return l.ready }

// Start runs the listener (and its probe) until Stop; a running listener
// refuses a second Start (ErrAlreadyStarted), a stopped one starts again.
func (l *Listener) Start(ctx context.Context) error {
	run, done, err := l.life.StartInit(ctx, "LISTEN connection")
	if err != nil {
		return err
	}
	var tasks startstop.Tasks
	tasks.Go(func() { l.run(run) })
	if l.probe.Interval > 0 && l.probe.Send != nil {
		tasks.Go(func() { l.probeLoop(run) })
	}
	go func() { tasks.Wait(); done() }()
	return nil
}

// probeLoop notifies the channel through the producers' path every
// interval and expects the notification back within the next interval. A
// LISTEN connection that receives nothing (through a transaction pooler,
// notifications reach a server connection nobody listens on any more) is
// reported once, and its recovery once.
func (l *Listener) probeLoop(ctx context.Context) {
	select { // probe only a connection that is listening
	case <-ctx.Done():
		return
	case <-l.ready:
	}
	t := time.NewTicker(l.probe.Interval)
	defer t.Stop()
	dead := false
	for n := 1; ; n++ {
		select { // the first probe after one interval: nothing to check at start
		case <-ctx.Done():
			return
		case <-t.C:
		}
		payload := probePrefix + strconv.Itoa(n)
		sendCtx, cancel := context.WithTimeout(ctx, l.probe.Interval)
		err := l.probe.Send(sendCtx, l.channel, payload)
		cancel()
		got := false
		if err == nil {
			timeout := time.After(l.probe.Interval)
		wait:
			for {
				select {
				case <-ctx.Done():
					return
				case p := <-l.probes:
					if p == payload {
						got = true
						break wait
					}
				case <-timeout:
					break wait
				}
			}
		}
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			l.logger.Warn("pgoutbox: could not send the LISTEN probe", slog.String("channel", l.channel), slog.Any("error", err))
		case !got && !dead:
			dead = true
			l.deaf.Store(true)
			l.logger.Error("pgoutbox: the LISTEN connection receives no notifications: consumers fall back to polling (within their PollInterval). "+
				"Is it going through a transaction pooler such as PgBouncer? Give it a direct connection (ListenDSN) or disable it (PollOnly)",
				slog.String("channel", l.channel), slog.Duration("waited", l.probe.Interval))
		case got && dead:
			dead = false
			l.deaf.Store(false)
			l.logger.Info("pgoutbox: the LISTEN connection receives notifications again", slog.String("channel", l.channel))
		}
	}
}

// Stop ends the listener and waits for it until ctx ends. Safe to call
// when not started.
func (l *Listener) Stop(ctx context.Context) error {
	stopped, ok := l.life.StopInit()
	if !ok {
		return nil
	}
	return startstop.Wait(ctx, stopped)
}

func (l *Listener) run(ctx context.Context) {
	for failures := 0; ctx.Err() == nil; {
		listened := false
		err := l.session(ctx, func() {
			listened = true
			l.listening.Store(true)
			l.readyOnce.Do(func() { close(l.ready) })
		})
		l.listening.Store(false)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			msg := err.Error()
			l.lastErr.Store(&msg)
		}
		if listened {
			failures = 0 // the connection worked: a new outage starts the backoff afresh
		}
		failures++
		delay := backoff.Exponential(failures, 100*time.Millisecond, 10*time.Second)
		l.logger.Warn("pgoutbox: LISTEN connection lost; consumers keep polling",
			slog.String("channel", l.channel), slog.Any("error", err), slog.Duration("retry_in", delay))
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
	}
}

// session holds one connection until it fails or ctx ends.
func (l *Listener) session(ctx context.Context, listening func()) error {
	conn, err := pgx.ConnectConfig(ctx, l.connConfig)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "LISTEN "+ident.Quote(l.channel)); err != nil {
		return err
	}
	listening()
	l.wakeAll() // anything sent while we were not listening
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		l.wake(n.Payload)
	}
}

func (l *Listener) wake(topic string) {
	if strings.HasPrefix(topic, probePrefix) {
		select {
		case l.probes <- topic:
		default:
		}
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for ch := range l.subs[topic] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

func (l *Listener) wakeAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, subs := range l.subs {
		for ch := range subs {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}
}
