package router

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sony/gobreaker/v2"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/pgoutbox/internal/ratelog"
	"github.com/pgoutbox/pgoutbox/internal/tracing"
)

// Result classifies a delivery attempt (see the response table in the package documentation).
type Result int

// Results.
const (
	Success         Result = iota // ack
	ErrorConfig                   // ack + dead letter: retrying cannot help
	ErrorProcess                  // nack (with the endpoint's delay, if any)
	ErrorConnection               // nack
)

// String names the result (SUCCESS, ERROR_CONFIG, ...).
func (r Result) String() string {
	return [...]string{"SUCCESS", "ERROR_CONFIG", "ERROR_PROCESS", "ERROR_CONNECTION"}[r]
}

// Outcome is what delivering a message came to.
type Outcome struct {
	Result Result
	// Delay is the endpoint's requested retry delay (0: the default).
	Delay time.Duration
	// Reason says why, for logs and dead letters.
	Reason    string
	retryable bool
	notTried  bool // the circuit was open: the host was not called
}

// mediator POSTs messages to their targets.
type mediator struct {
	cfg     Config
	warn    *warnings
	events  *ratelog.Log
	client  *http.Client
	allowed map[string]bool
	// ownTransport is the transport the mediator made (nil when the
	// configuration gave a client): Stop closes its idle connections.
	ownTransport *http.Transport
	tracer       *tracing.Tracer
	mu           sync.Mutex
	breakers     map[string]*gobreaker.CircuitBreaker[Outcome]
}

// close releases the idle connections of the mediator's own transport
// (and their goroutines).
func (m *mediator) close() {
	if m.ownTransport != nil {
		m.ownTransport.CloseIdleConnections()
	}
}

func newMediator(cfg Config, warn *warnings, events *ratelog.Log) *mediator {
	m := &mediator{cfg: cfg, warn: warn, events: events, allowed: map[string]bool{}, breakers: map[string]*gobreaker.CircuitBreaker[Outcome]{},
		tracer: tracing.New(cfg.TracerProvider)}
	for _, h := range cfg.AllowedHosts {
		m.allowed[strings.ToLower(h)] = true
	}
	m.client = cfg.HTTPClient
	if m.client == nil {
		transport := http.DefaultTransport.(*http.Transport).Clone()
		transport.DialContext = (&net.Dialer{Timeout: cfg.ConnectTimeout}).DialContext
		transport.MaxIdleConnsPerHost = 256
		m.client = &http.Client{Transport: transport, Timeout: cfg.RequestTimeout}
		m.ownTransport = transport
	}
	client := *m.client
	// Redirects are followed only within the same host; a redirect to
	// another allowed host is answered as the 3xx it is, one to a host off
	// the allow-list is a configuration error.
	client.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if !m.allows(req.URL) {
			return fmt.Errorf("%w: redirect to %s", ErrTargetNotAllowed, req.URL.Redacted())
		}
		if len(via) >= 5 || !strings.EqualFold(req.URL.Host, via[0].URL.Host) {
			return http.ErrUseLastResponse
		}
		return nil
	}
	m.client = &client
	return m
}

// checkTarget parses a target URL and checks it against the allow-list.
func (m *mediator) checkTarget(target string) (*url.URL, error) {
	u, err := validTarget(target)
	if err != nil {
		return nil, err
	}
	if !m.allows(u) {
		return nil, fmt.Errorf("%w: %q", ErrTargetNotAllowed, u.Host)
	}
	return u, nil
}

// allows reports whether u's host is on the allow-list.
func (m *mediator) allows(u *url.URL) bool {
	return m.allowed[strings.ToLower(u.Host)] || m.allowed[strings.ToLower(u.Hostname())]
}

func (m *mediator) breaker(host string) *gobreaker.CircuitBreaker[Outcome] {
	m.mu.Lock()
	defer m.mu.Unlock()
	if b, ok := m.breakers[host]; ok {
		return b
	}
	bc := m.cfg.Breaker
	b := gobreaker.NewCircuitBreaker[Outcome](gobreaker.Settings{
		Name:         host,
		MaxRequests:  bc.HalfOpenRequests,
		Timeout:      bc.OpenFor,
		Interval:     bc.Interval,
		BucketPeriod: bc.Interval / 10,
		ReadyToTrip: func(c gobreaker.Counts) bool {
			return c.Requests >= bc.MinRequests && float64(c.TotalFailures)/float64(c.Requests) >= bc.FailureRatio
		},
		OnStateChange: func(name string, from, to gobreaker.State) {
			if to == gobreaker.StateOpen {
				m.warn.record(WarnProcessing, SeverityWarn, name, fmt.Sprintf("circuit to %s opened", name))
			}
			// Opening is a warning; half-opening and closing again are
			// details of a recovery, which one Info record reports (see
			// recoveries).
			level := slog.LevelDebug
			if to == gobreaker.StateOpen {
				level = slog.LevelWarn
			}
			m.events.Log(level, "breaker|"+name+"|"+to.String(), "pgoutbox router: circuit breaker changed state", slog.String("event", "breaker"),
				slog.String("host", name), slog.String("from", from.String()), slog.String("state", to.String()))
		},
	})
	m.breakers[host] = b
	return b
}

// breakerStates reads every target host's breaker state.
func (m *mediator) breakerStates() map[string]gobreaker.State {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]gobreaker.State, len(m.breakers))
	for host, b := range m.breakers {
		out[host] = b.State()
	}
	return out
}

// jsonContent is the Content-Type and Accept of every request (never
// modified: the transport only reads request headers).
var jsonContent = []string{"application/json"}

// plainAck is the usual acknowledgement, recognised without decoding it.
var plainAck = []byte(`{"ack":true}`)

// errAttemptFailed marks an attempt the breaker counts as a failure.
var errAttemptFailed = errors.New("attempt failed")

// deliver runs up to MaxAttempts attempts for retryable failures.
func (m *mediator) deliver(ctx context.Context, msg *Message) Outcome {
	u := msg.target // parsed and allow-listed by Route, the only way into a pool
	b := m.breaker(u.Host)
	var out Outcome
	for attempt := 1; attempt <= m.cfg.MaxAttempts; attempt++ {
		o, err := b.Execute(func() (Outcome, error) {
			o := m.attempt(ctx, msg, u)
			if o.retryable {
				return o, errAttemptFailed
			}
			return o, nil
		})
		if errors.Is(err, gobreaker.ErrOpenState) || errors.Is(err, gobreaker.ErrTooManyRequests) {
			if attempt > 1 {
				return out // the host was called: that failure stands
			}
			return Outcome{Result: ErrorConnection, Reason: "circuit open for " + u.Host, notTried: true}
		}
		out = o
		if !out.retryable || attempt == m.cfg.MaxAttempts {
			return out
		}
		select {
		case <-ctx.Done():
			return out
		case <-time.After(m.cfg.RetryBackoff(attempt)):
		}
	}
	return out
}

// attempt is one HTTP POST and its response read against the response table.
func (m *mediator) attempt(ctx context.Context, msg *Message, u *url.URL) Outcome {
	body := msg.Payload
	if m.cfg.PointerBody {
		body, _ = json.Marshal(map[string]string{"messageId": msg.ID})
	}
	// The request is made on the URL Route parsed (not parsed again), with
	// its headers set under their canonical names.
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "", bytes.NewReader(body))
	if err != nil {
		return Outcome{Result: ErrorConfig, Reason: err.Error()}
	}
	req.URL = u
	h := req.Header
	h["Content-Type"] = jsonContent
	h["Accept"] = jsonContent
	h["X-Message-Id"] = []string{msg.ID}
	h["X-Message-Topic"] = []string{msg.Topic}
	h["X-Message-Group"] = []string{msg.group()}
	if msg.OutboxID != 0 {
		h["X-Outbox-Message-Id"] = []string{strconv.FormatInt(msg.OutboxID, 10)}
	}
	h["Idempotency-Key"] = []string{cmp.Or(msg.IdempotencyKey, msg.ID)}
	token, err := m.token(ctx, u)
	if err != nil {
		return Outcome{Result: ErrorProcess, Reason: "token: " + err.Error(), retryable: false}
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if msg.TraceContext != nil {
		var span trace.Span
		ctx, span = m.tracer.Deliver(ctx, msg.Topic, msg.ID, msg.TraceContext, h)
		resp, err := m.client.Do(req.WithContext(ctx))
		if err == nil {
			tracing.HTTPStatus(span, resp.StatusCode)
		}
		o := m.result(msg, resp, err)
		tracing.End(span, err)
		return o
	}
	resp, err := m.client.Do(req)
	return m.result(msg, resp, err)
}

// result reads a response (or the error that came instead) against the
// response table.
func (m *mediator) result(msg *Message, resp *http.Response, err error) Outcome {
	if err != nil {
		return m.classifyError(msg, err)
	}
	defer resp.Body.Close()
	buf := responseBuffers.Get().(*bytes.Buffer)
	defer putResponseBuffer(buf)
	_, _ = buf.ReadFrom(io.LimitReader(resp.Body, maxResponseBody))
	return m.classify(msg, resp, buf.Bytes())
}

// maxResponseBody bounds how much of a response body is read.
const maxResponseBody = 1 << 20

// responseBuffers hold response bodies while they are classified (which
// keeps no reference to them).
var responseBuffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// putResponseBuffer returns buf to responseBuffers, unless a large body
// made it grow: those are left to the garbage collector.
func putResponseBuffer(buf *bytes.Buffer) {
	if buf.Cap() > 64<<10 {
		return
	}
	buf.Reset()
	responseBuffers.Put(buf)
}

func (m *mediator) token(ctx context.Context, u *url.URL) (string, error) {
	if m.cfg.TokenFunc != nil {
		return m.cfg.TokenFunc(ctx, u)
	}
	if t, ok := m.cfg.Tokens[u.Host]; ok {
		return t, nil
	}
	return m.cfg.Tokens[u.Hostname()], nil
}

// classifyError classifies a request that got no response.
func (m *mediator) classifyError(msg *Message, err error) Outcome {
	var netErr net.Error
	var urlErr *url.Error
	switch {
	case errors.Is(err, ErrTargetNotAllowed) && errors.As(err, &urlErr):
		m.warn.add(WarnTargetNotAllowed, SeverityError, msg.target.Host, fmt.Sprintf("message %s: %v", msg.ID, urlErr.Err))
		return Outcome{Result: ErrorConfig, Reason: urlErr.Err.Error()}
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &netErr) && netErr.Timeout():
		var opErr *net.OpError
		if errors.As(err, &opErr) && opErr.Op == "dial" {
			return Outcome{Result: ErrorConnection, Reason: "connect timeout: " + err.Error(), retryable: true}
		}
		return Outcome{Result: ErrorProcess, Reason: "timeout: " + err.Error(), retryable: true}
	default:
		return Outcome{Result: ErrorConnection, Reason: "connection error: " + err.Error(), retryable: true}
	}
}

// statusReason names a response status and where it came from.
func statusReason(code int, u *url.URL) string {
	return fmt.Sprintf("HTTP %d %s from %s", code, http.StatusText(code), u.Redacted())
}

func (m *mediator) classify(msg *Message, resp *http.Response, body []byte) Outcome {
	code := resp.StatusCode
	switch {
	case code == http.StatusOK || code/100 == 2 && m.cfg.Success == Any2xx:
		return m.classifyAck(msg, code, body)
	case code == http.StatusTooManyRequests:
		return Outcome{Result: ErrorProcess, Delay: m.retryAfter(resp.Header.Get("Retry-After")), Reason: statusReason(code, msg.target)}
	case code == http.StatusNotImplemented:
		m.warn.add(WarnConfiguration, SeverityCritical, msg.target.Host+" 501", fmt.Sprintf("message %s: 501 from %s", msg.ID, msg.Target))
		return Outcome{Result: ErrorConfig, Reason: statusReason(code, msg.target)}
	case code >= 400 && code < 500:
		m.warn.add(WarnConfiguration, SeverityError, fmt.Sprintf("%s %d", msg.target.Host, code), fmt.Sprintf("message %s: %d from %s", msg.ID, code, msg.Target))
		return Outcome{Result: ErrorConfig, Reason: statusReason(code, msg.target)}
	case code >= 500:
		return Outcome{Result: ErrorProcess, Reason: statusReason(code, msg.target), retryable: true}
	default:
		return Outcome{Result: ErrorProcess, Reason: "unexpected " + statusReason(code, msg.target)}
	}
}

// classifyAck reads a successful status's body: {"ack":false} (with an
// optional "delaySeconds") asks for a retry; anything else acks. An empty
// body acks quietly; a 200 whose body is something other than an ack
// object is still a success (the original table's compatibility rule),
// with a warning.
func (m *mediator) classifyAck(msg *Message, code int, body []byte) Outcome {
	body = bytes.TrimSpace(body)
	if len(body) == 0 || bytes.Equal(body, plainAck) {
		return Outcome{Result: Success}
	}
	var r struct {
		Ack          *bool `json:"ack"`
		DelaySeconds *int  `json:"delaySeconds"`
	}
	if err := json.Unmarshal(body, &r); err != nil || r.Ack == nil {
		if code == http.StatusOK {
			m.warn.add(WarnResponseParse, SeverityWarn, msg.target.Host, fmt.Sprintf("message %s: 200 from %s with a body that is not {\"ack\":…}; treated as success", msg.ID, msg.Target))
		}
		return Outcome{Result: Success}
	}
	if *r.Ack {
		return Outcome{Result: Success}
	}
	o := Outcome{Result: ErrorProcess, Reason: statusReason(code, msg.target) + " with ack=false"}
	if r.DelaySeconds != nil && *r.DelaySeconds > 0 {
		o.Delay = clampDelay(time.Duration(*r.DelaySeconds) * time.Second)
	}
	return o
}

// retryAfter reads Retry-After as delta-seconds or an HTTP-date, clamped
// to [1s, 12h]; 0 without a valid one (the usual retry delay applies).
func (m *mediator) retryAfter(h string) time.Duration {
	h = strings.TrimSpace(h)
	if secs, err := strconv.Atoi(h); err == nil {
		return clampDelay(time.Duration(secs) * time.Second)
	}
	if t, err := http.ParseTime(h); err == nil {
		return clampDelay(t.Sub(m.cfg.Clock.Now()))
	}
	return 0
}
