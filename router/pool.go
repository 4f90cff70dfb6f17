package router

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// pool delivers messages with at most concurrency in flight and an
// optional rate limit. Up to concurrency worker goroutines take work from
// a list of ready queues: a message group's queue is ready while it has
// messages and none of them is being delivered, so a group's messages go
// one at a time, in order; the lane of messages without a group (no order
// to keep) is ready while it has messages. A message group costs nothing
// once its messages are done.
type pool struct {
	r    *Router
	code string

	mu          sync.Mutex // guards everything below
	cond        *sync.Cond // idle workers wait on it for a ready queue (or the drain)
	concurrency int
	rateLimit   int
	limiter     *rate.Limiter // nil: no limit
	inFlight    int           // messages a worker took: permits held
	groups      map[string]*groupQueue
	ready       []*groupQueue // queues a worker may take a message from, oldest first
	queued      int           // messages taken and not yet with a worker
	running     bool
	live        int             // worker goroutines running
	idle        int             // workers waiting on cond and not yet signalled
	failed      map[string]bool // batchID|group whose delivery failed
	remaining   map[string]int  // batchID|group → messages not yet done
	permits     *permitState    // the shared permits and tokens it holds (Config.Shared); nil: its limits are its own
	workers     sync.WaitGroup
}

type groupQueue struct {
	name          string
	high, regular []*Message
	held          int  // the group's part of the pool's queued
	busy          bool // a worker delivers one of its messages (groups only)
	isReady       bool // in the pool's ready list
	ungrouped     bool // the lane of messages without a group
}

func (g *groupQueue) empty() bool { return len(g.high)+len(g.regular) == 0 }

func newPool(r *Router, c PoolConfig) *pool {
	p := &pool{r: r, code: c.Code, concurrency: c.Concurrency, groups: map[string]*groupQueue{},
		running: true, failed: map[string]bool{}, remaining: map[string]int{}}
	p.cond = sync.NewCond(&p.mu)
	p.setRate(c.RateLimitPerMinute)
	if r.shared != nil {
		p.permits = &permitState{}
	}
	return p
}

// limit is how many deliveries the pool may run at once: its concurrency,
// or, with shared limits, the permits it holds under a lease that may not
// have ended (callers hold mu).
func (p *pool) limit() int {
	if p.permits == nil {
		return p.concurrency
	}
	return min(p.concurrency, p.permits.permits(time.Now()))
}

// setPermits records the shared permits the pool holds, until when, and
// wakes workers for them.
func (p *pool) setPermits(held, wanted int, until time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.permits == nil {
		return
	}
	p.permits.held, p.permits.wanted, p.permits.validUntil = held, wanted, until
	for range len(p.ready) {
		p.wakeLocked()
	}
}

// setRate replaces the limiter (callers hold mu, or own p exclusively).
func (p *pool) setRate(perMinute int) {
	p.rateLimit = perMinute
	if perMinute <= 0 {
		p.limiter = nil
		return
	}
	// A smooth rate of perMinute per minute (a burst of one): any minute
	// sees at most perMinute+1 deliveries.
	p.limiter = rate.NewLimiter(rate.Limit(float64(perMinute)/60), 1)
}

// update applies a changed concurrency or rate limit live. A lower
// concurrency takes effect as running deliveries finish.
func (p *pool) update(c PoolConfig) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c.Concurrency != p.concurrency {
		if c.Concurrency < p.inFlight {
			p.r.warn.add(WarnConcurrencyReduction, SeverityWarn, p.code, fmt.Sprintf("pool %q: concurrency %d → %d applies as %d running deliveries finish",
				p.code, p.concurrency, c.Concurrency, p.inFlight))
		}
		p.concurrency = c.Concurrency
		for range len(p.ready) {
			p.wakeLocked()
		}
	}
	if c.RateLimitPerMinute != p.rateLimit {
		p.setRate(c.RateLimitPerMinute)
	}
}

func (p *pool) capacity() int { return max(p.concurrency*QueueCapacityMultiplier, MinQueueCapacity) }

// groupLimit is how many messages one group may hold: its share of the capacity.
func (p *pool) groupLimit() int { return max(1, int(float64(p.capacity())*p.r.cfg.GroupShare)) }

// fits reports whether the pool has room for every message of msgs it
// would take: those beyond their group's share are sent back by submit and
// need no room.
func (p *pool) fits(msgs []*Message) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.running {
		return false
	}
	perGroup := map[string]int{}
	for _, m := range msgs {
		perGroup[m.lane()]++
	}
	limit, need := p.groupLimit(), 0
	for name, n := range perGroup {
		held := 0
		if g := p.groups[name]; g != nil {
			held = g.held
		}
		need += min(n, max(limit-held, 0))
	}
	return need <= p.capacity()-p.queued
}

// finished reports whether the pool drained and its goroutines ended.
func (p *pool) finished() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.running && p.live == 0
}

func (p *pool) stats() PoolStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := PoolStats{Code: p.code, Concurrency: p.concurrency, RateLimitPerMinute: p.rateLimit,
		Capacity: p.capacity(), Queued: p.queued, InFlight: p.inFlight, ActiveGroups: len(p.groups)}
	if p.permits != nil {
		st.Shared, st.Permits = true, p.limit()
	}
	return st
}

// submit queues m behind the earlier messages of its group; false when the
// pool is full or draining, or the group holds its share of the capacity.
func (p *pool) submit(m *Message) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.running || p.queued >= p.capacity() {
		return false
	}
	name := m.lane()
	g := p.groups[name]
	if g == nil {
		g = &groupQueue{name: name, ungrouped: !m.grouped()}
		p.groups[name] = g
	}
	if g.held >= p.groupLimit() {
		return false
	}
	if m.HighPriority {
		g.high = append(g.high, m)
	} else {
		g.regular = append(g.regular, m)
	}
	p.queued++
	g.held++
	p.remaining[m.batchGroup()]++
	if !g.busy && !g.isReady {
		p.markReady(g)
		p.wakeLocked()
	}
	return true
}

// markReady appends g to the ready list (callers hold mu).
func (p *pool) markReady(g *groupQueue) {
	g.isReady = true
	p.ready = append(p.ready, g)
}

// wakeLocked gets a worker for a queue that became ready: an idle one, or
// a new one while the pool has fewer than concurrency (callers hold mu).
func (p *pool) wakeLocked() {
	switch {
	case p.idle > 0:
		p.idle--
		p.cond.Signal()
	case p.live < p.limit():
		p.live++
		p.workers.Add(1)
		go p.work()
	case p.permits != nil && p.live < p.concurrency:
		p.r.shared.want() // more permits would start it
	}
}

// work is a worker goroutine: it delivers messages from ready queues until
// the pool drains or has more workers than its concurrency.
func (p *pool) work() {
	defer p.workers.Done()
	for {
		g, m := p.take()
		if m == nil {
			return
		}
		p.process(m)
		p.finish(g)
	}
}

// take waits for a ready queue and takes its next message, high priority
// first, with a concurrency permit; nil when the worker is to end.
func (p *pool) take() (*groupQueue, *Message) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		if !p.running {
			p.live--
			return nil, nil
		}
		if p.live > p.limit() { // the concurrency was lowered, or shared permits given up
			p.live--
			if len(p.ready) > 0 {
				p.wakeLocked() // an idle worker takes what this one leaves
			}
			return nil, nil
		}
		if len(p.ready) > 0 {
			break
		}
		p.idle++
		p.cond.Wait()
	}
	g := p.ready[0]
	p.ready[0] = nil
	p.ready = p.ready[1:]
	g.isReady = false
	var m *Message
	if len(g.high) > 0 {
		m, g.high = g.high[0], g.high[1:]
	} else {
		m, g.regular = g.regular[0], g.regular[1:]
	}
	p.queued--
	g.held--
	p.inFlight++
	if g.ungrouped {
		if !g.empty() { // no order to keep: another worker may take the next one
			p.markReady(g)
			p.wakeLocked()
		}
	} else {
		g.busy = true
	}
	return g, m
}

// finish returns the permit of a message of g that was settled: g's next
// message becomes ready, or g, empty, is forgotten.
func (p *pool) finish(g *groupQueue) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inFlight--
	g.busy = false
	switch {
	case !p.running:
	case !g.empty():
		if !g.isReady {
			p.markReady(g) // this worker takes it next, or another one
		}
	case p.groups[g.name] == g:
		delete(p.groups, g.name)
	}
}

// process delivers m, or sends it back when it must wait or the pool
// drains, and settles it. A panic in delivery code is recovered: m is
// nacked and the group goes on with its next message.
func (p *pool) process(m *Message) {
	ctx := context.Background()
	key := m.batchGroup()
	delivering := false
	defer func() {
		if v := recover(); v != nil {
			p.recovered(ctx, m, v, delivering)
		}
		p.done(key)
	}()
	p.mu.Lock()
	failed := p.failed[key]
	p.mu.Unlock()
	// An earlier message of this batch+group failed, or one of an earlier
	// batch of the group awaits its retry: keep the order.
	if resume, held := p.r.holds.heldBack(m, p.r.cfg.Clock.Now()); failed || held {
		s := nackWith(p.r.cfg.FastFailDelay)
		if held {
			s = settlement{kind: 1, until: resume}
		}
		p.r.settle(ctx, m, s, true)
		return
	}
	if !p.waitRate() {
		p.r.settle(ctx, m, nackWith(MinDelay), true) // draining: not delivered
		return
	}
	delivering = true
	start := time.Now()
	out := p.r.mediator.deliver(ctx, m)
	delivering = false
	p.r.metrics.delivery.Record(ctx, time.Since(start).Seconds(), settleAttrs(m, resultOf(out)))
	p.handle(ctx, m, out)
}

// recovered handles a panic while m was processed: a warning, an error
// log with the stack, and m retried like a failed delivery (a failed
// attempt if the panic came from delivering it).
func (p *pool) recovered(ctx context.Context, m *Message, v any, delivering bool) {
	p.r.reportPanic(p.code, fmt.Sprintf("pool %q: delivering message %s panicked: %v; the group goes on", p.code, m.ID, v), debug.Stack())
	if !delivering {
		p.r.settle(ctx, m, nackWith(MinDelay), true)
		return
	}
	p.handle(ctx, m, Outcome{Result: ErrorProcess, Reason: fmt.Sprintf("panic: %v", v)})
}

// waitRate blocks until the pool's rate limiter grants a permit (read
// afresh each try, so a new limit applies at once); false if draining.
func (p *pool) waitRate() bool {
	for {
		p.mu.Lock()
		running, lim, perMinute := p.running, p.limiter, p.rateLimit
		p.mu.Unlock()
		if !running {
			return false
		}
		switch {
		case lim == nil:
			return true
		case p.permits != nil:
			if p.sharedToken(perMinute) {
				return true
			}
		case lim.AllowN(p.r.cfg.Clock.Now(), 1):
			return true
		}
		p.r.metrics.rateLimited.Add(context.Background(), 1)
		time.Sleep(p.r.cfg.RateLimitPollEvery)
	}
}

// handle turns a delivery outcome into ack, dead letter or nack.
func (p *pool) handle(ctx context.Context, m *Message, o Outcome) {
	switch o.Result {
	case Success:
		p.r.recovery.succeeded(m.target.Host)
		p.r.settle(ctx, m, ackIt, true)
	case ErrorConfig:
		s := deadLetterWith(o.Reason)
		s.result = resultOf(o)
		p.r.settle(ctx, m, s, true)
	default: // ErrorProcess, ErrorConnection: retry later, and hold back the rest of the batch+group
		delay := p.r.retryDelay(m, o)
		if m.grouped() {
			p.mu.Lock()
			p.failed[m.batchGroup()] = true
			p.mu.Unlock()
			// Hold the group's later batches back until this one returns; the
			// hold lapses if it never does (dead-lettered by its source).
			p.r.holds.hold(m, p.r.cfg.Clock.Now().Add(clampDelay(delay)), p.r.cfg.FastFailDelay)
		}
		p.r.recovery.failed(m.target.Host)
		p.r.events.Log(slog.LevelWarn, "retry|"+m.target.Host, "pgoutbox router: delivery failed; retrying later", slog.String("event", "retry"),
			slog.String("host", m.target.Host), slog.String("pool", p.code), slog.String("id", m.ID), slog.String("result", o.Result.String()),
			slog.Bool("attempted", !o.notTried), slog.Duration("delay", delay), slog.String("reason", o.Reason))
		p.r.settle(ctx, m, settlement{kind: 1, result: resultOf(o), delay: delay, attempted: !o.notTried, reason: o.Reason}, true)
	}
}

// retryDelay is how long a failed delivery waits for its retry: the open
// interval of the breaker that refused the call; else the delay the
// receiver named; else the source's (QueueSource: the topic's backoff);
// else DefaultRetryDelay.
func (r *Router) retryDelay(m *Message, o Outcome) time.Duration {
	switch {
	case o.notTried:
		return r.cfg.Breaker.OpenFor
	case o.Delay > 0:
		return o.Delay
	case m.RetryDelay > 0:
		return m.RetryDelay
	}
	return r.cfg.DefaultRetryDelay
}

// routing counts each batch+group of msgs as having one more message not
// done while the router queues them (see routeToPool), and returns them;
// the router calls done for each once it queued them all.
func (p *pool) routing(msgs []*Message) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var keys []string
	seen := map[string]bool{}
	for _, m := range msgs {
		if k := m.batchGroup(); m.grouped() && !seen[k] {
			seen[k] = true
			keys = append(keys, k)
			p.remaining[k]++
		}
	}
	return keys
}

// done counts a batch+group message finished and drops the tracking at zero.
func (p *pool) done(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.remaining[key]--
	if p.remaining[key] <= 0 {
		delete(p.remaining, key)
		delete(p.failed, key)
	}
}

// drain stops accepting, nacks everything queued (never delivered), and
// lets deliveries in progress finish.
func (p *pool) drain() {
	p.mu.Lock()
	if !p.running {
		p.mu.Unlock()
		return
	}
	p.running = false
	var queued []*Message
	for _, g := range p.groups {
		queued = append(queued, g.high...)
		queued = append(queued, g.regular...)
		g.high, g.regular = nil, nil
		g.held = 0
	}
	p.groups, p.ready = map[string]*groupQueue{}, nil
	p.queued, p.idle = 0, 0
	p.cond.Broadcast()
	p.mu.Unlock()
	for _, m := range queued {
		p.r.settle(context.Background(), m, nackWith(MinDelay), true)
	}
}

// sharedToken takes a rate token shared with the other routers: one of
// those taken before and not yet dropped, or a batch of them for the
// messages waiting, one round trip for the batch.
func (p *pool) sharedToken(perMinute int) bool {
	ps := p.permits
	ps.fetching.Lock()
	defer ps.fetching.Unlock()
	p.mu.Lock()
	now := time.Now()
	if ps.tokens > 0 && now.Before(ps.tokensEnd) {
		ps.tokens--
		p.mu.Unlock()
		return true
	}
	want := p.queued + 1
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	got, err := p.r.shared.tokens(ctx, p.code, perMinute, want)
	if err != nil {
		p.r.events.Log(slog.LevelWarn, "tokens|"+p.code, "pgoutbox router: taking shared rate tokens failed; the pool waits",
			slog.String("pool", p.code), slog.Any("error", err))
		return false
	}
	if got == 0 {
		return false
	}
	p.mu.Lock()
	ps.tokens, ps.tokensEnd = got-1, now.Add(time.Second) // unused ones are dropped: never more than the bucket gave
	p.mu.Unlock()
	return true
}
