package router

import (
	"sort"
	"sync"
	"time"
)

// Severity of a warning.
type Severity string

// Severities, as the seed's warning table uses them.
const (
	SeverityWarn     Severity = "WARN"
	SeverityError    Severity = "ERROR"
	SeverityCritical Severity = "CRITICAL"
)

// Warning codes.
const (
	WarnConfigSyncFailed     = "CONFIG_SYNC_FAILED"
	WarnRouting              = "ROUTING"
	WarnQueueFull            = "QUEUE_FULL"
	WarnPoolLimit            = "POOL_LIMIT"
	WarnPipelineMapLeak      = "PIPELINE_MAP_LEAK"
	WarnConsumerRestart      = "CONSUMER_RESTART"
	WarnShutdownCleanup      = "SHUTDOWN_CLEANUP_ERRORS"
	WarnGroupThreadRestart   = "GROUP_THREAD_RESTART"
	WarnConfiguration        = "CONFIGURATION"
	WarnResponseParse        = "RESPONSE_PARSE"
	WarnTargetNotAllowed     = "TARGET_NOT_ALLOWED"
	WarnProcessing           = "PROCESSING"
	WarnConcurrencyReduction = "CONCURRENCY_REDUCTION"
)

// DefaultWarningTTL is how long a warning is kept.
const DefaultWarningTTL = 8 * time.Hour

// Warning is an operational problem worth a person's attention.
type Warning struct {
	Code     string
	Severity Severity
	Message  string
	At       time.Time
}

// warnings keeps recent warnings in memory; they expire after ttl.
type warnings struct {
	mu    sync.Mutex
	ttl   time.Duration
	now   func() time.Time
	items []Warning
}

func (w *warnings) add(code string, sev Severity, msg string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.prune()
	w.items = append(w.items, Warning{Code: code, Severity: sev, Message: msg, At: w.now()})
}

func (w *warnings) prune() {
	cut := w.now().Add(-w.ttl)
	i := sort.Search(len(w.items), func(i int) bool { return w.items[i].At.After(cut) })
	w.items = w.items[i:]
}

func (w *warnings) list() []Warning {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.prune()
	return append([]Warning(nil), w.items...)
}
