package router

import (
	"container/list"
	"log/slog"
	"sync"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/ratelog"
)

// Severity of a warning.
type Severity string

// Severities of warnings, from least to most urgent.
const (
	SeverityWarn     Severity = "WARN"
	SeverityError    Severity = "ERROR"
	SeverityCritical Severity = "CRITICAL"
)

// Warning codes.
const (
	WarnConfigSyncFailed = "CONFIG_SYNC_FAILED"
	WarnRouting          = "ROUTING"
	// WarnQueueFull is no longer raised: a pool too full for a batch is
	// back-pressure (the batch goes back to its source and comes again),
	// logged at Info and counted by pgoutbox.router.pool.refused.
	//
	// Deprecated: nothing raises it.
	WarnQueueFull             = "QUEUE_FULL"
	WarnPoolLimit             = "POOL_LIMIT"
	WarnPipelineMapLeak       = "PIPELINE_MAP_LEAK"
	WarnConsumerRestart       = "CONSUMER_RESTART"
	WarnConsumerRestartFailed = "CONSUMER_RESTART_FAILED"
	WarnShutdownCleanup       = "SHUTDOWN_CLEANUP_ERRORS"
	WarnGroupThreadRestart    = "GROUP_THREAD_RESTART"
	WarnConfiguration         = "CONFIGURATION"
	WarnResponseParse         = "RESPONSE_PARSE"
	WarnTargetNotAllowed      = "TARGET_NOT_ALLOWED"
	WarnProcessing            = "PROCESSING"
	WarnConcurrencyReduction  = "CONCURRENCY_REDUCTION"
)

// Warning defaults.
const (
	// DefaultWarningTTL is how long a warning is kept after it was last raised.
	DefaultWarningTTL = 8 * time.Hour
	// DefaultMaxWarnings is how many distinct warnings are kept.
	DefaultMaxWarnings = 1000
)

// Warning is an operational problem worth a person's attention. A warning
// raised again with the same code and subject is the same warning: its
// count goes up and its message and time are the latest ones.
type Warning struct {
	Code     string   `json:"code"`
	Severity Severity `json:"severity"`
	// Subject is what the warning is about: a pool, a host, a source.
	Subject string `json:"subject"`
	// Message describes the latest occurrence.
	Message string `json:"message"`
	// Count is how often the warning was raised; First and At are when it
	// was raised first and last.
	Count int       `json:"count"`
	First time.Time `json:"first"`
	At    time.Time `json:"at"`
}

type warningKey struct{ code, subject string }

// warnings keeps recent warnings in memory, one per code and subject, at
// most max of them (the least recently raised go first); they expire ttl
// after they were last raised. Each is also logged (rate-limited).
type warnings struct {
	mu    sync.Mutex
	ttl   time.Duration
	max   int
	now   func() time.Time
	log   *ratelog.Log
	byKey map[warningKey]*list.Element // of *Warning
	order *list.List                   // least recently raised first
}

func newWarnings(ttl time.Duration, max int, now func() time.Time, log *ratelog.Log) *warnings {
	return &warnings{ttl: ttl, max: max, now: now, log: log, byKey: map[warningKey]*list.Element{}, order: list.New()}
}

// add raises a warning about subject, and logs it.
func (w *warnings) add(code string, sev Severity, subject, msg string) {
	w.record(code, sev, subject, msg)
	w.log.Log(levelOf(sev), "warning:"+code+"|"+subject, "pgoutbox router: "+msg,
		slog.String("code", code), slog.String("subject", subject), slog.String("severity", string(sev)))
}

func (w *warnings) record(code string, sev Severity, subject, msg string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := w.now()
	w.prune(now)
	k := warningKey{code, subject}
	if e, ok := w.byKey[k]; ok {
		wn := e.Value.(*Warning)
		wn.Severity, wn.Message, wn.At = sev, msg, now
		wn.Count++
		w.order.MoveToBack(e)
		return
	}
	if w.order.Len() >= w.max {
		w.remove(w.order.Front())
	}
	w.byKey[k] = w.order.PushBack(&Warning{Code: code, Severity: sev, Subject: subject, Message: msg, Count: 1, First: now, At: now})
}

// prune drops the warnings not raised within the ttl.
func (w *warnings) prune(now time.Time) {
	cut := now.Add(-w.ttl)
	for e := w.order.Front(); e != nil && !e.Value.(*Warning).At.After(cut); e = w.order.Front() {
		w.remove(e)
	}
}

func (w *warnings) remove(e *list.Element) {
	wn := w.order.Remove(e).(*Warning)
	delete(w.byKey, warningKey{wn.Code, wn.Subject})
}

// list returns the warnings, least recently raised first.
func (w *warnings) list() []Warning {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.prune(w.now())
	out := make([]Warning, 0, w.order.Len())
	for e := w.order.Front(); e != nil; e = e.Next() {
		out = append(out, *e.Value.(*Warning))
	}
	return out
}
