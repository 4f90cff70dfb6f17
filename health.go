package pgoutbox

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/maintenance"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/router"
)

// Health is a client's health, as Client.Health and Client.Liveness
// report it.
type Health struct {
	// Live: nothing the client started has ended on its own. A client
	// that is not live will not recover by itself (a subscription was
	// cancelled or deleted under a running group, say): restarting the
	// process is the usual answer. Live never depends on the database.
	Live bool `json:"live"`
	// Ready: the client runs, the database answered, and every component
	// does its work: running, its looks for work succeeding, its
	// heartbeats going through. Without the database (Liveness), Ready
	// leaves the database out.
	Ready bool `json:"ready"`
	// Problems say in words what makes the client not live or not ready.
	Problems []string `json:"problems,omitempty"`
	// Warnings say what deserves a look without stopping the client's
	// work: a maintenance job failing, a backfill failing (new messages
	// still flow), a LISTEN connection reconnecting (consumers poll
	// meanwhile), no session to prove the process alive.
	Warnings []string `json:"warnings,omitempty"`
	// CheckedAt is when the report was made.
	CheckedAt time.Time `json:"checked_at"`
	// Running: between Start and Stop.
	Running bool `json:"running"`
	// Database is the answer to a ping (Health only).
	Database *DatabaseHealth `json:"database,omitempty"`
	// Connections are the client's connections of its own.
	Connections outbox.ConnectionStatus `json:"connections"`
	// Components are what the client starts and stops, in the order they
	// were created: the maintenance service first (unless NoMaintenance),
	// then consumers, groups, relays and routers.
	Components []ComponentHealth `json:"components"`
	// Maintenance is where each maintenance job stands (none with
	// NoMaintenance).
	Maintenance []maintenance.JobStatus `json:"maintenance,omitempty"`
}

// DatabaseHealth is the answer to a ping of the client's pool.
type DatabaseHealth struct {
	Reachable bool          `json:"reachable"`
	Latency   time.Duration `json:"-"`
	Error     string        `json:"error,omitempty"`
}

// MarshalJSON writes the latency in seconds.
func (d DatabaseHealth) MarshalJSON() ([]byte, error) {
	type plain DatabaseHealth
	return json.Marshal(struct {
		plain
		LatencySeconds float64 `json:"latency_seconds"`
	}{plain(d), d.Latency.Seconds()})
}

// ComponentHealth is where one component of the client stands.
type ComponentHealth struct {
	// Name says what it is: "consumer of orders", "consumer group
	// billing of orders", "relay of orders", "router", "maintenance".
	Name string `json:"name"`
	// Running: started, and not ended.
	Running bool `json:"running"`
	// Instance is the consumer group instance behind a consumer, group or
	// relay.
	Instance *consumergroup.Status `json:"instance,omitempty"`
	// Sources are a router's sources (a router on standby: while it
	// leads).
	Sources []router.SourceStatus `json:"sources,omitempty"`
	// Standby is where a router on standby stands (see Standby).
	Standby *StandbyHealth `json:"standby,omitempty"`
}

func instanceHealth(s consumergroup.Status) ComponentHealth {
	return ComponentHealth{Running: s.Running, Instance: &s}
}

// FailingLooks is how many looks for work in a row must fail before
// Health says an instance is not ready: a single failure is retried
// within the instance's PollInterval.
const FailingLooks = 3

// DefaultPingTimeout bounds Health's ping when its context has no
// earlier deadline.
const DefaultPingTimeout = 2 * time.Second

// Health reports whether the client is live and ready, and why not:
// everything Liveness reports, and a ping of the database (bounded by
// ctx, and by DefaultPingTimeout).
func (c *Client) Health(ctx context.Context) Health {
	h := c.Liveness()
	ctx, cancel := context.WithTimeout(ctx, DefaultPingTimeout)
	defer cancel()
	start := time.Now()
	err := c.pool.Ping(ctx)
	d := &DatabaseHealth{Reachable: err == nil, Latency: time.Since(start)}
	if err != nil {
		d.Error = err.Error()
		h.problem(false, "the database did not answer a ping within %v: %v", DefaultPingTimeout, err)
	}
	h.Database = d
	return h
}

// Liveness is Health without the database: it is read from memory, so it
// answers at once however slow the database is.
func (c *Client) Liveness() Health {
	h := Health{Live: true, Ready: true, CheckedAt: time.Now(), Connections: c.outbox.Connections()}
	c.mu.Lock()
	h.Running = c.live
	comps := make([]*component, len(c.components))
	copy(comps, c.components)
	c.mu.Unlock()
	if !h.Running {
		h.problem(false, "the client is not running (call Start)")
	}
	for _, comp := range comps {
		ch := comp.status()
		ch.Name = comp.name
		h.Components = append(h.Components, ch)
		if h.Running {
			h.check(ch)
		}
	}
	if c.maint != nil {
		h.Maintenance = c.maint.Status()
		for _, j := range h.Maintenance {
			switch {
			case j.Failures > 0:
				h.Warnings = append(h.Warnings, fmt.Sprintf("maintenance job %s failed %d time(s) in a row, last at %s: %s",
					j.Job, j.Failures, j.LastErrorAt.Format(time.RFC3339), j.LastError))
			case j.FallingBehind():
				h.Warnings = append(h.Warnings, fmt.Sprintf("maintenance job %s is falling behind: its last %d passes took longer than its interval (%v)",
					j.Job, j.Behind, j.Every))
			}
		}
	}
	switch h.Connections.WakeUps {
	case outbox.WakeUpsReconnecting, outbox.WakeUpsDeaf:
		h.Warnings = append(h.Warnings, fmt.Sprintf("the LISTEN connection is %s (consumers poll meanwhile)", h.Connections.WakeUps))
	}
	switch h.Connections.ProofOfLife {
	case outbox.ProofNoSession, outbox.ProofReconnecting:
		h.Warnings = append(h.Warnings, fmt.Sprintf("the session proving this process alive: %s (if the process dies, its work comes back with its lease)",
			h.Connections.ProofOfLife))
	}
	return h
}

// problem records why the client is not ready, and, with notLive, why
// it is not live either.
func (h *Health) problem(notLive bool, format string, args ...any) {
	h.Ready = false
	if notLive {
		h.Live = false
	}
	h.Problems = append(h.Problems, fmt.Sprintf(format, args...))
}

// check records the problems of a component of a running client.
func (h *Health) check(ch ComponentHealth) {
	switch {
	case ch.Instance != nil:
		h.checkInstance(ch.Name, *ch.Instance)
	case !ch.Running:
		h.problem(true, "%s is not running", ch.Name)
	}
	if sb := ch.Standby; sb != nil && !sb.Leading && sb.Error != "" {
		h.Warnings = append(h.Warnings, fmt.Sprintf("%s stands by and cannot lead: %s", ch.Name, sb.Error))
	}
	for _, s := range ch.Sources {
		if s.Instance != nil && s.Instance.Running {
			h.checkInstance(ch.Name+" source "+s.Name, *s.Instance)
		} else if !s.Running && s.LastError != "" {
			h.problem(false, "%s source %s stopped: %s (the router restarts it)", ch.Name, s.Name, s.LastError)
		}
	}
}

// checkInstance records the problems of a consumer group instance.
func (h *Health) checkInstance(name string, s consumergroup.Status) {
	switch {
	case s.Err != nil:
		h.problem(true, "%s stopped on its own: %v", name, s.Err)
		return
	case !s.Running:
		h.problem(true, "%s is not running", name)
		return
	}
	if s.LookFailures >= FailingLooks {
		h.problem(false, "%s: its last %d looks for work failed, the last at %s: %s",
			name, s.LookFailures, s.LastLookErrorAt.Format(time.RFC3339), s.LastLookError)
	}
	if s.Backfill == consumergroup.BackfillFailed {
		h.Warnings = append(h.Warnings, fmt.Sprintf("%s: its backfill failed at %s (new messages still flow): %s",
			name, s.BackfillErrorAt.Format(time.RFC3339), s.BackfillError))
	}
	if s.Silent {
		h.problem(false, "%s: no heartbeat went through since %s; it fetches nothing until one does",
			name, s.LastHeartbeat.Format(time.RFC3339))
	}
}

// observeHealth reports the client's health from memory (Liveness) at
// each collection: pgoutbox.client.live and .ready (1 or 0; ready leaves
// out the database's ping) and .warnings (how many), by schema.
func (c *Client) observeHealth(mp metric.MeterProvider) error {
	meter := mp.Meter("github.com/pgoutbox/pgoutbox")
	live, err := meter.Int64ObservableGauge("pgoutbox.client.live",
		metric.WithDescription("1 while nothing the client started has ended on its own (see Client.Liveness)"))
	if err != nil {
		return err
	}
	ready, err := meter.Int64ObservableGauge("pgoutbox.client.ready",
		metric.WithDescription("1 while the client runs and every component does its work (Client.Liveness: no database ping)"))
	if err != nil {
		return err
	}
	warned, err := meter.Int64ObservableGauge("pgoutbox.client.warnings",
		metric.WithDescription("how many warnings the client's health report holds"))
	if err != nil {
		return err
	}
	attrs := metric.WithAttributes(attribute.String("schema", c.cfg.Schema))
	_, err = meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		h := c.Liveness()
		o.ObserveInt64(live, bit(h.Live), attrs)
		o.ObserveInt64(ready, bit(h.Ready), attrs)
		o.ObserveInt64(warned, int64(len(h.Warnings)), attrs)
		return nil
	}, live, ready, warned)
	return err
}

func bit(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// HealthHandler serves the client's health over HTTP, for probes:
// GET /healthz answers 200 when the client is live (Liveness: no query)
// and /readyz 200 when it is ready (Health: with a ping of the
// database), 503 otherwise, each with the report as JSON. Mount it where
// the probes look, e.g. mux.Handle("/healthz", h) and
// mux.Handle("/readyz", h); any other path is /readyz.
func (c *Client) HealthHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var h Health
		ok := false
		if strings.HasSuffix(r.URL.Path, "/healthz") {
			h = c.Liveness()
			ok = h.Live
		} else {
			h = c.Health(r.Context())
			ok = h.Ready
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(h)
	})
}
