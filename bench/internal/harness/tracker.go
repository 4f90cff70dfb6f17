package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Body pads every payload to about 90 bytes of JSON.
const Body = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// Payload is message seq's payload: {"seq":N,"body":"<64 characters>"}.
func Payload(seq int) []byte {
	return []byte(fmt.Sprintf(`{"seq":%d,"body":"%s"}`, seq, Body))
}

// Seq reads the sequence number out of a payload.
func Seq(payload []byte) (int, error) {
	var m struct {
		Seq *int `json:"seq"`
	}
	if err := json.Unmarshal(payload, &m); err != nil {
		return 0, err
	}
	if m.Seq == nil {
		return 0, fmt.Errorf("payload %.40q has no seq", payload)
	}
	return *m.Seq, nil
}

// Tracker records per message how often it was handled, when a handler
// first started on it, and when its producer's commit returned.
type Tracker struct {
	base      time.Time
	counts    []atomic.Int32
	started   []atomic.Int64 // ns since base, +1; 0 = never
	commits   []atomic.Int64 // ns since base, +1; 0 = never
	bad       atomic.Int64
	nDistinct atomic.Int64
	last      atomic.Int64
}

// NewTracker returns a tracker of messages 0..n-1.
func NewTracker(n int) *Tracker {
	return &Tracker{base: time.Now(), counts: make([]atomic.Int32, n), started: make([]atomic.Int64, n), commits: make([]atomic.Int64, n)}
}

func (t *Tracker) now() int64 { return int64(time.Since(t.base)) + 1 }

// Handled records that a handler started on message seq: a handler's
// first action.
func (t *Tracker) Handled(seq int) {
	if seq < 0 || seq >= len(t.counts) {
		t.bad.Add(1)
		return
	}
	if t.counts[seq].Add(1) != 1 {
		return
	}
	now := t.now()
	t.started[seq].Store(now)
	t.nDistinct.Add(1)
	for old := t.last.Load(); now > old && !t.last.CompareAndSwap(old, now); old = t.last.Load() {
	}
}

// HandledPayload is Handled for the message whose payload this is.
func (t *Tracker) HandledPayload(payload []byte) error {
	seq, err := Seq(payload)
	if err != nil {
		t.bad.Add(1)
		return err
	}
	t.Handled(seq)
	return nil
}

// Committed records that the transaction that sent message seq committed.
func (t *Tracker) Committed(seq int) { t.commits[seq].Store(t.now()) }

// Distinct returns how many messages were handled at least once.
func (t *Tracker) Distinct() int { return int(t.nDistinct.Load()) }

// WaitHandled waits until every message was handled at least once.
func (t *Tracker) WaitHandled(ctx context.Context) error {
	for t.Distinct() < len(t.counts) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d handled: %w", t.Distinct(), len(t.counts), ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
	return nil
}

// Check fails unless every message was handled; duplicates are reported
// on stderr (every system here delivers at least once).
func (t *Tracker) Check(what string) error {
	missing, dups := 0, 0
	for i := range t.counts {
		switch c := int(t.counts[i].Load()); c {
		case 0:
			missing++
		default:
			dups += c - 1
		}
	}
	if dups > 0 {
		Logf("%s: %d duplicate deliveries", what, dups)
	}
	if missing > 0 || t.bad.Load() > 0 {
		return fmt.Errorf("%s: %d of %d messages never handled, %d unknown sequence numbers", what, missing, len(t.counts), t.bad.Load())
	}
	return nil
}

// Latencies returns the p50 and p99 pickup latency in milliseconds: from
// the producer's commit returning to the first handler starting (a
// handler that started a hair before the commit returned counts as 0).
func (t *Tracker) Latencies() (p50, p99 float64) {
	p50, p99, _ = t.LatenciesBetween(time.Time{}, time.Time{})
	return p50, p99
}

// LatenciesBetween is Latencies over the messages whose producer commit
// returned in [from, to) (a zero time is no bound), and how many those are.
func (t *Tracker) LatenciesBetween(from, to time.Time) (p50, p99 float64, n int) {
	lo, hi := int64(math.MinInt64), int64(math.MaxInt64)
	if !from.IsZero() {
		lo = int64(from.Sub(t.base)) + 1
	}
	if !to.IsZero() {
		hi = int64(to.Sub(t.base)) + 1
	}
	var v []float64
	for i := range t.counts {
		s, c := t.started[i].Load(), t.commits[i].Load()
		if s == 0 || c == 0 || c < lo || c >= hi {
			continue
		}
		v = append(v, max(0, float64(s-c)/1e6))
	}
	sort.Float64s(v)
	return Percentile(v, 50), Percentile(v, 99), len(v)
}

// WriteLatencies writes, per message handled, the time its producer's
// commit returned (ms since the tracker began) and its pickup latency
// (ms), tab-separated, one line each, in message order.
func (t *Tracker) WriteLatencies(path string) error {
	var b strings.Builder
	for i := range t.counts {
		s, c := t.started[i].Load(), t.commits[i].Load()
		if s != 0 && c != 0 {
			fmt.Fprintf(&b, "%.3f\t%.3f\n", float64(c)/1e6, float64(s-c)/1e6)
		}
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// FirstCommit returns when message 0's commit returned.
func (t *Tracker) FirstCommit() time.Time {
	return t.base.Add(time.Duration(t.commits[0].Load() - 1))
}

// LastStart returns when the last first handler start happened.
func (t *Tracker) LastStart() time.Time { return t.base.Add(time.Duration(t.last.Load() - 1)) }

// Percentile is the nearest-rank p-th percentile of sorted.
func Percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	k := max(0, int(math.Ceil(p/100*float64(len(sorted))))-1)
	return sorted[k]
}

// Concurrently calls send(seq) for seq in [0,n) from workers goroutines,
// and returns the first error.
func Concurrently(ctx context.Context, n, workers int, send func(context.Context, int) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := int(next.Add(1) - 1); seq < n; seq = int(next.Add(1) - 1) {
				if err := send(ctx, seq); err != nil {
					errs <- fmt.Errorf("send %d: %w", seq, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// Paced calls send for messages from, from+1, … (n of them), one after
// another on a fixed schedule of rate a second (a late send is followed
// by the next at once), and records each commit in tr.
func Paced(ctx context.Context, tr *Tracker, from, n, rate int, send func(context.Context, int) error) error {
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	for i := range n {
		if err := SleepUntil(ctx, start.Add(time.Duration(i)*interval)); err != nil {
			return err
		}
		if err := send(ctx, from+i); err != nil {
			return fmt.Errorf("send %d: %w", from+i, err)
		}
		tr.Committed(from + i)
	}
	return nil
}

// SleepUntil waits until t or ctx's end.
func SleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
