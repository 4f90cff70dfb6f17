package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/adminui"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// ADMIN -mode M [-n N] [-groups G]: the operator surface beside a large
// backlog. A PUB_SUB topic holds N stored messages that its G groups
// (subscribed before, stopped) have not read, a QUEUE topic N/10 ready
// messages, and each 1,000 dead letters. Then each read an operator or a
// metrics scrape makes is timed, 20 times, with the UI's cache off: the
// admin API's Topics and Groups, the UI's pages and the gauges'
// collection. Every answer must stay under 200 ms.

// adminResult is ADMIN's JSON line: p50 and max per read, in ms.
type adminResult struct {
	System   string             `json:"system"`
	Workload string             `json:"workload"`
	Mode     string             `json:"mode"`
	N        int                `json:"n"`
	Groups   int                `json:"groups"`
	P50Ms    map[string]float64 `json:"p50_ms"`
	MaxMs    map[string]float64 `json:"max_ms"`
}

func (b *bench) admin(ctx context.Context) error {
	const psTopic, qTopic = "admin_pubsub", "admin_queue"
	mode := outbox.TrackingMode(strings.ToUpper(b.c.mode))
	if err := b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: psTopic, Semantics: outbox.PubSub, Tracking: mode}); err != nil {
		return err
	}
	if err := b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: qTopic}); err != nil {
		return err
	}
	if err := b.subscribeIdle(ctx, psTopic); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "storing %d messages...\n", b.c.N)
	began := time.Now()
	// Rows that require every group, as a send after the subscriptions
	// writes them (bits 0..G-1; the subscriptions' ids).
	for start := 0; start < b.c.N; start += 100_000 {
		_, err := b.pool.Exec(ctx, `INSERT INTO `+schema+`.outbox_published
    (topic, payload, correlation_id, status, required_bits, done_bits, required_ids, required_count, completed_count)
SELECT $1, jsonb_build_object('seq', i), 'c' || i, 'PUBLISHED',
       CASE WHEN $4 = 'BITMAP' THEN (1::bigint << $5) - 1 ELSE 0 END, 0,
       CASE WHEN $4 = 'COUNTER' THEN (SELECT array_agg(id) FROM `+schema+`.outbox_topic_subscriptions WHERE topic = $1) ELSE '{}' END,
       CASE WHEN $4 = 'COUNTER' THEN $5 ELSE 0 END, 0
FROM generate_series($2::int, $3::int - 1) AS i`, psTopic, start, min(b.c.N, start+100_000), string(mode), b.c.Groups)
		if err != nil {
			return fmt.Errorf("store: %w", err)
		}
	}
	if _, err := b.pool.Exec(ctx, `INSERT INTO `+schema+`.outbox_published (topic, payload, correlation_id, status)
SELECT $1, jsonb_build_object('seq', i), 'c' || i, 'PUBLISHED' FROM generate_series(1, $2::int) AS i`, qTopic, b.c.N/10); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	// The QUEUE topic's dead letters are its group's, with their copies.
	if _, err := b.pool.Exec(ctx, `INSERT INTO `+schema+`.outbox_group_retries
    (subscription_id, message_id, status, attempts, available_at, last_error, dead_lettered_at,
     payload, headers, correlation_id, priority, created_at, xid)
SELECT s.id, 1000000000000 + i, 'DEAD_LETTER', 10, now(), 'boom', now(), '{}', '{}', 'd' || i, 0, now(), pg_current_xact_id()
FROM `+schema+`.outbox_topic_subscriptions AS s, generate_series(1, 1000) AS i
WHERE s.topic = $1`, qTopic); err != nil {
		return fmt.Errorf("store dead letters: %w", err)
	}
	if _, err := b.pool.Exec(ctx, `INSERT INTO `+schema+`.outbox_group_retries
    (subscription_id, message_id, status, attempts, available_at, last_error, dead_lettered_at)
SELECT s.id, o.id, 'DEAD_LETTER', 10, now(), 'boom', now()
FROM `+schema+`.outbox_topic_subscriptions AS s
CROSS JOIN LATERAL (SELECT id FROM `+schema+`.outbox_published WHERE topic = $1 ORDER BY id LIMIT 1000) AS o
WHERE s.topic = $1`, psTopic); err != nil {
		return fmt.Errorf("store group dead letters: %w", err)
	}
	if _, err := b.pool.Exec(ctx, `VACUUM ANALYZE`); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "stored in %v\n", time.Since(began).Round(time.Second))

	adm, err := admin.New(b.client, admin.Options{})
	if err != nil {
		return err
	}
	ui, err := adminui.NewHandler(adminui.Config{Admin: adm, CacheFor: -1})
	if err != nil {
		return err
	}
	reader := sdkmetric.NewManualReader()
	reg, err := adm.RegisterGauges(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		return err
	}
	defer reg.Unregister()

	page := func(path string) func() error {
		return func() error {
			rec := httptest.NewRecorder()
			ui.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil).WithContext(ctx))
			if rec.Code != http.StatusOK {
				return fmt.Errorf("GET %s: %d %s", path, rec.Code, rec.Body.String())
			}
			return nil
		}
	}
	reads := []struct {
		name string
		f    func() error
	}{
		{"admin.Topics", func() error { _, err := adm.Topics(ctx); return err }},
		{"admin.Groups", func() error { _, err := adm.Groups(ctx, psTopic); return err }},
		{"ui /", page("/")},
		{"ui pubsub topic", page("/topics/" + psTopic)},
		{"ui group", page("/topics/" + psTopic + "/groups/g0")},
		{"ui queue topic", page("/topics/" + qTopic)},
		{"api dead letters", page("/api/topics/" + qTopic + "/dead-letters?limit=100")},
		{"gauges", func() error { var rm metricdata.ResourceMetrics; return reader.Collect(ctx, &rm) }},
	}
	res := adminResult{System: b.c.System, Workload: b.c.Workload, Mode: b.c.mode, N: b.c.N, Groups: b.c.Groups,
		P50Ms: map[string]float64{}, MaxMs: map[string]float64{}}
	for _, r := range reads {
		var ms []float64
		for range 20 {
			start := time.Now()
			if err := r.f(); err != nil {
				return fmt.Errorf("%s: %w", r.name, err)
			}
			ms = append(ms, float64(time.Since(start).Microseconds())/1000)
		}
		slices.Sort(ms)
		res.P50Ms[r.name], res.MaxMs[r.name] = ms[len(ms)/2], ms[len(ms)-1]
	}
	h, err := adm.Group(ctx, psTopic, "g0")
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "g0: unread %d (counts stop at %d), dead letters %d, lag %v\n", h.Unread, adm.CountLimit(), h.DeadLetters, h.Lag)
	return json.NewEncoder(os.Stdout).Encode(res)
}
