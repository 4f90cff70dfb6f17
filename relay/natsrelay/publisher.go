package natsrelay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/pgoutbox/internal/pipeline"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/relay"
)

// Defaults of JetStreamConfig.
const (
	// DefaultAckTimeout is how long a publish waits for JetStream's
	// confirmation before it counts as failed (and is tried again, under
	// the same Nats-Msg-Id).
	DefaultAckTimeout = 5 * time.Second
	// DefaultMaxPending is the most publishes awaiting confirmation on
	// one publisher.
	DefaultMaxPending = 4096
	// DefaultDuplicateWindow is the duplicate window EnsureStream sets on
	// a stream that has none set: how long JetStream remembers a message
	// id, so a republish within it stores nothing. See the package
	// documentation for how long it must be.
	DefaultDuplicateWindow = 15 * time.Minute
)

// JetStreamConfig configures a JetStreamPublisher.
type JetStreamConfig struct {
	// Conn is the NATS connection (see Connect). Required. The
	// publisher does not close it.
	Conn *nats.Conn
	// Stream, when set, is the stream every message must be stored in
	// (each publish expects it): a subject another stream captures is a
	// configuration fault instead of a silent write elsewhere.
	Stream string
	// AckTimeout bounds the wait for each publish's confirmation.
	// Defaults to DefaultAckTimeout.
	AckTimeout time.Duration
	// MaxPending is the most publishes awaiting confirmation at once;
	// Publish waits for room. Defaults to DefaultMaxPending.
	MaxPending int
}

// JetStreamPublisher publishes to NATS JetStream asynchronously: a
// Publish call sends its messages without waiting for each confirmation,
// except that a message group's next message goes only once JetStream
// confirmed the one before it (one publish in flight per message group),
// so retries and reconnects never reorder a message group. Each message
// carries its DedupID as Nats-Msg-Id: JetStream drops a republish within
// the stream's duplicate window.
type JetStreamPublisher struct {
	cfg JetStreamConfig
	js  jetstream.JetStream

	mu      sync.Mutex
	waiting map[*nats.Msg]pendingPublish // publishes awaiting confirmation

	stored, duplicates atomic.Int64
}

// pendingPublish is where a publish's outcome goes.
type pendingPublish struct {
	to  chan<- outcome
	idx int
}

type outcome struct {
	idx       int
	err       error
	duplicate bool
}

// NewJetStreamPublisher returns a publisher on cfg.Conn.
func NewJetStreamPublisher(cfg JetStreamConfig) (*JetStreamPublisher, error) {
	if cfg.Conn == nil {
		return nil, fmt.Errorf("%w: JetStreamConfig.Conn is required", outbox.ErrInvalidConfig)
	}
	if cfg.AckTimeout < 0 || cfg.MaxPending < 0 {
		return nil, fmt.Errorf("%w: negative AckTimeout or MaxPending", outbox.ErrInvalidConfig)
	}
	if cfg.AckTimeout == 0 {
		cfg.AckTimeout = DefaultAckTimeout
	}
	if cfg.MaxPending == 0 {
		cfg.MaxPending = DefaultMaxPending
	}
	p := &JetStreamPublisher{cfg: cfg, waiting: map[*nats.Msg]pendingPublish{}}
	js, err := jetstream.New(cfg.Conn,
		jetstream.WithPublishAsyncMaxPending(cfg.MaxPending),
		jetstream.WithPublishAsyncTimeout(cfg.AckTimeout),
		jetstream.WithPublishAsyncAckHandler(func(_ jetstream.JetStream, m *nats.Msg, ack *jetstream.PubAck) {
			p.settle(m, nil, ack.Duplicate)
		}),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, m *nats.Msg, err error) {
			p.settle(m, err, false)
		}))
	if err != nil {
		return nil, err
	}
	p.js = js
	return p, nil
}

// JetStreamStats counts what a JetStreamPublisher's publishes came to.
type JetStreamStats struct {
	// Stored counts messages JetStream confirmed, Duplicates those of
	// them it had already stored (a republish within the duplicate
	// window: it stored nothing new).
	Stored, Duplicates int64
}

// Stats returns the publisher's counts so far.
func (p *JetStreamPublisher) Stats() JetStreamStats {
	return JetStreamStats{Stored: p.stored.Load(), Duplicates: p.duplicates.Load()}
}

// settle hands a publish's outcome to the Publish call waiting for it, if
// it still waits.
func (p *JetStreamPublisher) settle(m *nats.Msg, err error, duplicate bool) {
	p.mu.Lock()
	w, ok := p.waiting[m]
	delete(p.waiting, m)
	p.mu.Unlock()
	if ok {
		w.to <- outcome{idx: w.idx, err: err, duplicate: duplicate}
	}
}

// Publish implements Publisher (see JetStreamPublisher).
func (p *JetStreamPublisher) Publish(ctx context.Context, msgs []relay.Message) []error {
	errs := make([]error, len(msgs))
	settled := make([]bool, len(msgs))
	results := make(chan outcome, len(msgs)) // each message settles once
	sent := make(map[*nats.Msg]struct{}, len(msgs))
	defer func() { // forget what is still unconfirmed
		p.mu.Lock()
		for m := range sent {
			delete(p.waiting, m)
		}
		p.mu.Unlock()
	}()

	// next[i] is the message after msgs[i] with its key (-1: none);
	// the first of each key, and every message without one, go at once.
	next := make([]int, len(msgs))
	order := make([]int, len(msgs))
	for i := range msgs {
		next[i], order[i] = -1, i
	}
	first := pipeline.Runs(order, func(i int) (string, int64) { return msgs[i].Key, int64(i) },
		func(prev, n int) { next[prev] = n })

	inFlight := 0
	finish := func(i int, err error) {
		errs[i], settled[i] = err, true
		if err == nil {
			return
		}
		for n := next[i]; n >= 0; n = next[n] {
			errs[n], settled[n] = fmt.Errorf("%w: %v", relay.ErrHeldBack, err), true
		}
	}
	send := func(i int) {
		nm := p.natsMsg(msgs[i])
		p.mu.Lock()
		p.waiting[nm] = pendingPublish{to: results, idx: i}
		p.mu.Unlock()
		// A full window of pending publishes waits at most stallWait
		// for room, then fails (and is retried): Publish must return
		// soon after ctx ends.
		opts := []jetstream.PublishOpt{jetstream.WithMsgID(msgs[i].DedupID), jetstream.WithStallWait(stallWait)}
		if p.cfg.Stream != "" {
			opts = append(opts, jetstream.WithExpectStream(p.cfg.Stream))
		}
		if _, err := p.js.PublishMsgAsync(nm, opts...); err != nil {
			p.mu.Lock()
			_, stillWaiting := p.waiting[nm]
			delete(p.waiting, nm)
			p.mu.Unlock()
			if stillWaiting {
				finish(i, p.classify(msgs[i], err))
			} else {
				inFlight++ // the error handler reported it too: its outcome is on its way
			}
			return
		}
		sent[nm] = struct{}{}
		inFlight++
	}
	for _, i := range first {
		if ctx.Err() != nil {
			break
		}
		send(i)
	}
	for inFlight > 0 {
		select {
		case o := <-results:
			inFlight--
			if o.err != nil {
				finish(o.idx, p.classify(msgs[o.idx], o.err))
				continue
			}
			p.stored.Add(1)
			if o.duplicate {
				p.duplicates.Add(1)
			}
			finish(o.idx, nil)
			if n := next[o.idx]; n >= 0 && ctx.Err() == nil {
				send(n)
			}
		case <-ctx.Done():
			inFlight = 0
		}
	}
	for i := range msgs { // not confirmed (or not sent) before ctx ended
		if !settled[i] {
			errs[i] = fmt.Errorf("relay: not confirmed: %w", context.Cause(ctx))
		}
	}
	return errs
}

// natsMsg is m as a NATS message.
func (p *JetStreamPublisher) natsMsg(m relay.Message) *nats.Msg {
	nm := nats.NewMsg(m.Subject)
	nm.Data = m.Payload
	for k, v := range m.Headers {
		nm.Header[k] = []string{v}
	}
	return nm
}

// classify wraps a publish's error with relay.ErrRejected or relay.ErrMisconfigured
// where it is one of those.
func (p *JetStreamPublisher) classify(m relay.Message, err error) error {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, nats.ErrMaxPayload):
		return fmt.Errorf("%w: %d bytes: %v", relay.ErrRejected, len(m.Payload), err)
	case errors.As(err, &apiErr):
		switch apiErr.ErrorCode {
		case jetstream.JSErrCodeStreamMessageExceedsMaximum:
			return fmt.Errorf("%w: %d bytes: %v", relay.ErrRejected, len(m.Payload), err)
		case jetstream.JSErrCodeStreamNotFound, jetstream.JSErrCodeJetStreamNotEnabled,
			jetstream.JSErrCodeJetStreamNotEnabledForAccount, jsErrCodeStreamNotMatch:
			return fmt.Errorf("%w: subject %q: %v", relay.ErrMisconfigured, m.Subject, err)
		}
	case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, nats.ErrNoResponders):
		return fmt.Errorf("%w: no stream captures subject %q: %v", relay.ErrMisconfigured, m.Subject, err)
	case p.cfg.Conn.IsClosed():
		// A closed connection never reconnects (the server refused it
		// for good: authorization expired, a protocol violation).
		return fmt.Errorf("%w: the NATS connection is closed; make a new one: %v", relay.ErrMisconfigured, err)
	case errors.Is(err, jetstream.ErrAsyncPublishTimeout):
		// A publish the server refused for permissions gets no reply;
		// the connection reports the violation on its own.
		if last := p.cfg.Conn.LastError(); last != nil && errors.Is(last, nats.ErrPermissionViolation) &&
			strings.Contains(last.Error(), `"`+m.Subject+`"`) {
			return fmt.Errorf("%w: %v", relay.ErrMisconfigured, last)
		}
	}
	return err
}

// stallWait bounds a publish's wait for room under MaxPending.
const stallWait = 100 * time.Millisecond

// jsErrCodeStreamNotMatch is JetStream's "expected stream does not match".
const jsErrCodeStreamNotMatch jetstream.ErrorCode = 10060
