package adminui

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// Defaults of HistoryConfig.
const (
	DefaultHistoryEvery = 10 * time.Second
	DefaultHistorySpan  = time.Hour
)

// sentLimit is where a sample stops counting a topic's sends: a rate
// read as this many per interval means "at least".
const sentLimit = 1_000_000

// HistoryConfig configures a History.
type HistoryConfig struct {
	// Admin reads the topics and groups. Required.
	Admin *admin.Admin
	// Every is how often Run samples; defaults to DefaultHistoryEvery.
	Every time.Duration
	// Span is how far back the charts go; defaults to DefaultHistorySpan.
	Span time.Duration
	// Clock stamps the samples; defaults to the system clock.
	Clock outbox.Clock
	// Logger receives a sample's failure (Run goes on). Defaults to
	// slog.Default().
	Logger *slog.Logger
}

// History keeps in memory, for the UI's charts and its JSON API, what
// every topic and group did over the last Span: each sample reads the
// topics' counts and the groups' health (bounded reads, see package
// admin) and counts each topic's sends since the sample before with an
// index range scan of what was sent in between (admin.Admin.SentBetween),
// never a count of a topic. Give it to Config.History and run it:
//
//	h, err := adminui.NewHistory(adminui.HistoryConfig{Admin: adm})
//	go h.Run(ctx) // until ctx ends
//
// The series, per topic and per group (a QUEUE topic's are its
// consumers' group's):
//
//   - sent: messages sent per second (topics);
//   - finished: messages finished per second: sent minus the backlog's
//     growth, an estimate, absent while a backlog is past the count limit;
//   - backlog: messages waiting (a group: unread, queued, waiting for a
//     retry and scheduled; a QUEUE topic: ready, scheduled and leased);
//   - lag: seconds the oldest waiting message has waited;
//   - retrying: messages waiting for a retry (a QUEUE topic: scheduled,
//     which counts its retries);
//   - dead_letters: dead letters held.
//
// It is the serving process's memory: a restart starts the charts again,
// and each process serving the UI keeps its own.
type History struct {
	cfg  HistoryConfig
	keep int

	mu     sync.Mutex
	at     []time.Time // ring of sample times, oldest at next once full
	next   int
	series map[seriesKey][]float64 // rings aligned with at; NaN: no reading
	prev   map[seriesKey]backlog   // the last sample's backlog per topic or group (name "")
	mark   admin.Watermark
	marked bool
	last   time.Time
}

// seriesKey names a series: a topic's (group "") or a group's; with name
// "", the topic or group itself.
type seriesKey struct{ topic, group, name string }

// backlog is a topic's or group's backlog at a sample, and whether it was
// counted in full.
type backlog struct {
	n     int64
	exact bool
}

// Series names.
const (
	seriesSent        = "sent"
	seriesFinished    = "finished"
	seriesBacklog     = "backlog"
	seriesLag         = "lag"
	seriesRetrying    = "retrying"
	seriesDeadLetters = "dead_letters"
)

// NewHistory returns a History with nothing sampled yet.
func NewHistory(cfg HistoryConfig) (*History, error) {
	if cfg.Admin == nil {
		return nil, fmt.Errorf("%w: adminui: history: Admin is nil", outbox.ErrInvalidConfig)
	}
	if cfg.Every < 0 || cfg.Span < 0 {
		return nil, fmt.Errorf("%w: adminui: history: Every and Span must not be negative", outbox.ErrInvalidConfig)
	}
	cfg.Every = cmp.Or(cfg.Every, DefaultHistoryEvery)
	cfg.Span = cmp.Or(cfg.Span, DefaultHistorySpan)
	if cfg.Span < cfg.Every {
		return nil, fmt.Errorf("%w: adminui: history: Span %s is shorter than Every %s", outbox.ErrInvalidConfig, cfg.Span, cfg.Every)
	}
	if cfg.Clock == nil {
		cfg.Clock = systemClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	keep := int(cfg.Span/cfg.Every) + 1
	return &History{cfg: cfg, keep: keep, series: map[seriesKey][]float64{}, prev: map[seriesKey]backlog{}}, nil
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// Run samples every Every until ctx ends, and returns nil then. A sample
// that fails is logged at WARN and leaves a gap in the charts.
func (h *History) Run(ctx context.Context) error {
	t := time.NewTicker(h.cfg.Every)
	defer t.Stop()
	for {
		if err := h.Sample(ctx); err != nil && ctx.Err() == nil {
			h.cfg.Logger.Warn("pgoutbox admin UI: reading the charts' figures failed", "error", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Sample reads every topic's and group's figures now and adds them to the
// charts. Run calls it every Every; call it yourself to sample at other
// times.
func (h *History) Sample(ctx context.Context) error {
	adm := h.cfg.Admin
	mark, err := adm.Watermark(ctx)
	if err != nil {
		return err
	}
	topics, err := adm.Topics(ctx)
	if err != nil {
		return err
	}
	now := h.cfg.Clock.Now()
	h.mu.Lock()
	from, marked, since := h.mark, h.marked, now.Sub(h.last)
	h.mu.Unlock()

	point := map[seriesKey]float64{}
	backlogs := map[seriesKey]backlog{}
	for _, t := range topics {
		sent := math.NaN()
		if marked && since > 0 {
			n, err := adm.SentBetween(ctx, t.Name, from, mark, sentLimit)
			if err != nil {
				return err
			}
			sent = float64(n) / since.Seconds()
		}
		point[seriesKey{t.Name, "", seriesSent}] = sent
		if t.Semantics == outbox.Queue {
			b := backlog{t.Ready + t.Scheduled + t.Leased, max(t.Ready, t.Scheduled, t.Leased) < int64(adm.CountLimit())}
			lag := 0.0
			if t.Ready > 0 {
				lag = t.OldestReady.Seconds()
			}
			h.record(point, backlogs, t.Name, "", b, lag, t.Scheduled, t.DeadLetters)
			continue
		}
		groups, err := adm.Groups(ctx, t.Name)
		if errors.Is(err, outbox.ErrNotFound) {
			continue // gone since the list was read
		}
		if err != nil {
			return err
		}
		for _, g := range groups {
			h.record(point, backlogs, t.Name, g.Group, groupBacklog(g, int64(adm.CountLimit())), g.Lag.Seconds(), g.Waiting, g.DeadLetters)
		}
	}
	h.add(now, mark, point, backlogs, since)
	return nil
}

// groupBacklog is what a group has yet to finish.
func groupBacklog(g consumergroup.Health, limit int64) backlog {
	return backlog{g.Unread + g.Queued + g.Waiting + g.Scheduled, max(g.Unread, g.Queued, g.Waiting, g.Scheduled) < limit}
}

// record puts a topic's or group's readings into point.
func (h *History) record(point map[seriesKey]float64, backlogs map[seriesKey]backlog, topic, group string, b backlog, lag float64, retrying, dead int64) {
	point[seriesKey{topic, group, seriesBacklog}] = float64(b.n)
	point[seriesKey{topic, group, seriesLag}] = lag
	point[seriesKey{topic, group, seriesRetrying}] = float64(retrying)
	point[seriesKey{topic, group, seriesDeadLetters}] = float64(dead)
	backlogs[seriesKey{topic, group, ""}] = b
}

// add appends a sample, working out each finished rate from the topic's
// sends and the backlog's growth since the sample before.
func (h *History) add(now time.Time, mark admin.Watermark, point map[seriesKey]float64, backlogs map[seriesKey]backlog, since time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for key, b := range backlogs {
		finished := math.NaN()
		prev, ok := h.prev[key]
		sent := point[seriesKey{key.topic, "", seriesSent}]
		if ok && prev.exact && b.exact && !math.IsNaN(sent) {
			finished = max(0, sent-float64(b.n-prev.n)/since.Seconds())
		}
		point[seriesKey{key.topic, key.group, seriesFinished}] = finished
	}
	h.prev = backlogs
	h.mark, h.marked, h.last = mark, true, now

	if len(h.at) < h.keep {
		h.at = append(h.at, now)
	} else {
		h.at[h.next] = now
	}
	slot := h.next
	h.next = (h.next + 1) % h.keep
	for key, v := range point {
		ring, ok := h.series[key]
		if !ok {
			ring = make([]float64, h.keep)
			for i := range ring {
				ring[i] = math.NaN()
			}
			h.series[key] = ring
		}
		ring[slot] = v
	}
	for key, ring := range h.series {
		if _, ok := point[key]; ok {
			continue
		}
		ring[slot] = math.NaN() // a topic or group gone, or not read this time
		if !slices.ContainsFunc(ring, func(v float64) bool { return !math.IsNaN(v) }) {
			delete(h.series, key) // nothing left to show
		}
	}
}

// Point is one reading of a series.
type Point struct {
	At    time.Time `json:"at"`
	Value float64   `json:"value"`
}

// Series is a topic's or group's readings of one figure, oldest first.
type Series struct {
	Name   string  `json:"name"`
	Points []Point `json:"points"`
}

// Of returns the series of a topic (group "") or of one of its groups,
// in the order the package documentation lists them, each with the
// readings of the last Span (none read yet: empty).
func (h *History) Of(topic, group string) []Series {
	names := []string{seriesSent, seriesFinished, seriesBacklog, seriesLag, seriesRetrying, seriesDeadLetters}
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []Series
	for _, name := range names {
		ring, ok := h.series[seriesKey{topic, group, name}]
		if !ok {
			continue
		}
		s := Series{Name: name, Points: []Point{}}
		for i := range h.at {
			slot := i
			if len(h.at) == h.keep {
				slot = (h.next + i) % h.keep
			}
			if v := ring[slot]; !math.IsNaN(v) {
				s.Points = append(s.Points, Point{At: h.at[slot], Value: v})
			}
		}
		out = append(out, s)
	}
	return out
}
