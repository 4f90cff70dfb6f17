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
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
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
	checks chan string // payloads of session checks that came back
	nonce  string      // in this listener's session checks: another's never match
	hooks  SessionHooks

	life      startstop.Base
	ready     chan struct{} // closed after the first successful LISTEN
	readyOnce sync.Once
}

// Probe checks that the LISTEN connection receives what producers send:
// Send notifies the channel with payload the way producers do (through
// their pool), every Interval.
type Probe struct {
	Interval time.Duration // 0: no probing
	Send     func(ctx context.Context, channel, payload string) error
}

// probePrefix starts a probe's payload, checkPrefix a session check's; no
// topic name can contain '#'.
const (
	probePrefix = "#probe:"
	checkPrefix = "#session:"
)

// SessionHooks let the owner of a listener use its connection's session.
type SessionHooks struct {
	// Connected runs on the connection right after LISTEN, before any
	// notification is handled. An error ends the connection (and a new
	// one is tried, with backoff).
	Connected func(ctx context.Context, conn *pgx.Conn) error
	// Checked runs once per connection, when a notification sent through
	// the producers' path (Probe.Send) came back on it: the connection is
	// a session of its own on the server, not one a transaction pooler
	// lends between statements. Until Ended, the session Connected set up
	// lasts.
	Checked func()
	// Ended runs when a connection on which Connected succeeded ends.
	Ended func()
}

// SetSessionHooks sets h; call it before Start.
func (l *Listener) SetSessionHooks(h SessionHooks) { l.hooks = h }

// New returns a listener that will connect with connConfig.
func New(connConfig *pgx.ConnConfig, channel string, logger *slog.Logger, probe Probe) *Listener {
	return &Listener{
		connConfig: connConfig.Copy(),
		channel:    channel,
		logger:     logger,
		probe:      probe,
		subs:       map[string]map[chan struct{}]struct{}{},
		probes:     make(chan string, 8),
		checks:     make(chan string, 8),
		nonce:      strconv.FormatUint(rand.Uint64(), 36),
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
			l.logger.Error("pgoutbox: the LISTEN connection receives no notifications: consumers fall back to polling (within their PollInterval). "+
				"Is it going through a transaction pooler such as PgBouncer? Give it a direct connection (ListenDSN) or disable it (PollOnly)",
				slog.String("channel", l.channel), slog.Duration("waited", l.probe.Interval))
		case got && dead:
			dead = false
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
			l.readyOnce.Do(func() { close(l.ready) })
		})
		if ctx.Err() != nil {
			return
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
	if l.hooks.Connected != nil {
		if err := l.hooks.Connected(ctx, conn); err != nil {
			return err
		}
		if l.hooks.Ended != nil {
			defer l.hooks.Ended()
		}
	}
	listening()
	l.wakeAll() // anything sent while we were not listening
	if l.hooks.Checked != nil && l.probe.Send != nil {
		checkCtx, cancel := context.WithCancel(ctx)
		var check startstop.Tasks
		check.Go(func() { l.checkSession(checkCtx) })
		defer check.Wait()
		defer cancel()
	}
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		l.wake(n.Payload)
	}
}

// checkSession sends a notification through the producers' path every
// checkEvery until one comes back on this connection, then runs
// hooks.Checked. Through a transaction pooler none ever does.
func (l *Listener) checkSession(ctx context.Context) {
	for n := 1; ; n++ {
		payload := checkPrefix + l.nonce + ":" + strconv.Itoa(n)
		sendCtx, cancel := context.WithTimeout(ctx, checkEvery)
		err := l.probe.Send(sendCtx, l.channel, payload)
		cancel()
		timeout := time.After(checkEvery)
		for err == nil {
			select {
			case <-ctx.Done():
				return
			case p := <-l.checks:
				if p == payload {
					l.hooks.Checked()
					return
				}
				continue
			case <-timeout:
			}
			break
		}
		if n == checkWarnAfter {
			l.logger.Warn("pgoutbox: the LISTEN connection has not received its own notification: it is not a session of its own (a transaction pooler such as PgBouncer?), so work held by a crashed process comes back only when its lease ends. Give it a direct connection (ListenDSN)",
				slog.String("channel", l.channel), slog.Any("error", err))
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(checkEvery):
		}
	}
}

// checkEvery is how often a session check is sent (and how long one is
// waited for); checkWarnAfter checks in vain are logged.
const (
	checkEvery     = time.Second
	checkWarnAfter = 5
)

func (l *Listener) wake(topic string) {
	if strings.HasPrefix(topic, probePrefix) {
		select {
		case l.probes <- topic:
		default:
		}
		return
	}
	if strings.HasPrefix(topic, checkPrefix) {
		select {
		case l.checks <- topic:
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
