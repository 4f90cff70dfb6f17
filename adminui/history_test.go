package adminui_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/adminui"
	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/clocktest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// chartsFixture is a PUB_SUB topic "events" with a group "audit" that
// dead-letters the messages whose payload says {"bad": true}, a QUEUE
// topic "jobs", and a History sampled by the test on its own clock.
type chartsFixture struct {
	db       *pgtest.DB
	client   *outbox.Client
	admin    *admin.Admin
	producer *outbox.Producer
	history  *adminui.History
	clock    *clocktest.Clock
	handled  atomic.Int64
}

func newChartsFixture(t testing.TB) *chartsFixture {
	t.Helper()
	ctx := context.Background()
	f := &chartsFixture{db: pgtest.NewDB(t), clock: clocktest.New(time.Date(2026, 12, 4, 9, 0, 0, 0, time.UTC))}
	var err error
	f.client, err = outbox.NewClient(f.db.Pool, outbox.Config{Schema: f.db.Schema})
	require.NoError(t, err)
	require.NoError(t, f.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: outbox.Offset}))
	require.NoError(t, f.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "jobs", Semantics: outbox.Queue}))
	f.producer, err = outbox.NewProducer(outbox.ProducerConfig{Schema: f.db.Schema})
	require.NoError(t, err)
	f.admin, err = admin.New(f.client, admin.Options{})
	require.NoError(t, err)
	f.history, err = adminui.NewHistory(adminui.HistoryConfig{Admin: f.admin, Clock: f.clock})
	require.NoError(t, err)
	g := f.group(t)
	require.NoError(t, g.Start(ctx, consumergroup.FromNow()))
	f.stop(t, g) // subscribed; its messages wait until it runs again
	return f
}

// group returns an instance of the audit group, not started.
func (f *chartsFixture) group(t testing.TB) *consumergroup.Group {
	t.Helper()
	g, err := consumergroup.New(f.db.Pool, consumergroup.Config{Topic: "events", Group: "audit", Client: f.client,
		PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, g.AddConsumer("m", func(_ context.Context, d *outbox.Delivery) error {
		var p struct{ Bad bool }
		if err := json.Unmarshal(d.Payload, &p); err == nil && p.Bad {
			return outbox.Permanent(errors.New("malformed event"))
		}
		f.handled.Add(1)
		return nil
	}, nil))
	return g
}

func (f *chartsFixture) stop(t testing.TB, g *consumergroup.Group) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, g.Stop(ctx))
}

// run starts an instance of the audit group until the test ends.
func (f *chartsFixture) run(t *testing.T) {
	t.Helper()
	g := f.group(t)
	require.NoError(t, g.Start(context.Background(), consumergroup.FromNow()))
	t.Cleanup(func() { f.stop(t, g) })
}

// drained waits until audit has read everything and holds dead dead
// letters.
func (f *chartsFixture) drained(t *testing.T, dead int64) {
	t.Helper()
	pgtest.Eventually(t, 30*time.Second, "the group drained", func() bool {
		h, err := f.admin.Group(context.Background(), "events", "audit")
		require.NoError(t, err)
		return h.Unread == 0 && h.Queued == 0 && h.Waiting == 0 && h.DeadLetters == dead
	})
}

// send sends n messages to topic, bad of them dead-lettered by audit.
func (f *chartsFixture) send(t testing.TB, topic string, n, bad int) {
	t.Helper()
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{Topic: topic, Payload: json.RawMessage(fmt.Sprintf(`{"n":%d,"bad":%v}`, i, i < bad))}
	}
	_, err := f.producer.SendBatch(context.Background(), f.db.Pool, msgs)
	require.NoError(t, err)
}

// sample moves the clock on by the history's interval and samples.
func (f *chartsFixture) sample(t testing.TB) {
	t.Helper()
	f.clock.Advance(adminui.DefaultHistoryEvery)
	require.NoError(t, f.history.Sample(context.Background()))
}

// series returns a topic's or group's readings by series name.
func series(h *adminui.History, topic, group string) map[string][]adminui.Point {
	out := map[string][]adminui.Point{}
	for _, s := range h.Of(topic, group) {
		out[s.Name] = s.Points
	}
	return out
}

// total adds up a rate series' messages (each reading is per second over
// the interval before it).
func total(points []adminui.Point) float64 {
	var sum float64
	for _, p := range points {
		sum += p.Value * adminui.DefaultHistoryEvery.Seconds()
	}
	return sum
}

func last(points []adminui.Point) float64 {
	if len(points) == 0 {
		return -1
	}
	return points[len(points)-1].Value
}

// The charts' figures, read as the samples come: each send counted once
// (however late a busy server lets the watermark pass it), a group's
// backlog and lag growing while it is stopped and falling to nothing as
// it runs, its dead letters over time, and a QUEUE topic's backlog.
func TestHistory(t *testing.T) {
	t.Parallel()
	f := newChartsFixture(t)
	f.sample(t) // the first sample marks where counting starts
	require.Empty(t, series(f.history, "events", "")["sent"], "no rate before a second sample")

	f.send(t, "events", 40, 4)
	f.send(t, "jobs", 5, 0)
	pgtest.Eventually(t, 30*time.Second, "every send counted, once", func() bool {
		f.sample(t)
		return total(series(f.history, "events", "")["sent"]) >= 40 && total(series(f.history, "jobs", "")["sent"]) >= 5
	})
	audit := series(f.history, "events", "audit")
	require.InDelta(t, 40, total(series(f.history, "events", "")["sent"]), 1e-9, "each send counted once")
	require.InDelta(t, 5, total(series(f.history, "jobs", "")["sent"]), 1e-9)
	require.EqualValues(t, 40, last(audit["backlog"]), "nobody reads while the group is stopped")
	require.Positive(t, last(audit["lag"]))
	require.Zero(t, last(audit["dead_letters"]))
	require.EqualValues(t, 5, last(series(f.history, "jobs", "")["backlog"]), "the QUEUE topic's ready messages")

	f.run(t)
	f.drained(t, 4)
	require.EqualValues(t, 36, f.handled.Load())
	f.sample(t)
	audit = series(f.history, "events", "audit")
	require.Zero(t, last(audit["backlog"]))
	require.Zero(t, last(audit["lag"]))
	require.EqualValues(t, 4, last(audit["dead_letters"]), "dead letters over time")
	require.Positive(t, last(audit["finished"]), "the backlog fell with nothing sent: finished")
	require.Len(t, audit["backlog"], len(audit["dead_letters"]), "one reading of each per sample")
	require.InDelta(t, 40, total(series(f.history, "events", "")["sent"]), 1e-9, "counted once over every sample")
	require.Zero(t, last(series(f.history, "events", "")["sent"]), "nothing sent since")

	srv := httptest.NewServer(handler(t, adminui.Config{Admin: f.admin, History: f.history}))
	t.Cleanup(srv.Close)
	code, body := get(t, srv, "/api/topics/events/groups/audit/history")
	require.Equal(t, http.StatusOK, code, body)
	var doc struct {
		Every  float64 `json:"every_seconds"`
		Span   float64 `json:"span_seconds"`
		Series []struct {
			Name   string `json:"name"`
			Points []struct {
				At    time.Time `json:"at"`
				Value float64   `json:"value"`
			} `json:"points"`
		} `json:"series"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &doc))
	require.Equal(t, 10.0, doc.Every)
	require.Equal(t, 3600.0, doc.Span)
	names := []string{}
	for _, s := range doc.Series {
		names = append(names, s.Name)
	}
	require.Equal(t, []string{"finished", "backlog", "lag", "retrying", "dead_letters"}, names)
	require.Equal(t, f.clock.Now(), doc.Series[1].Points[len(doc.Series[1].Points)-1].At.UTC(), "stamped by the history's clock")
	code, _ = get(t, srv, "/api/topics/nope/history")
	require.Equal(t, http.StatusNotFound, code)
	off := httptest.NewServer(handler(t, adminui.Config{Admin: f.admin}))
	t.Cleanup(off.Close)
	code, body = get(t, off, "/api/topics/events/history")
	require.Equal(t, http.StatusNotFound, code)
	require.Contains(t, body, "charts are off")
}

// A history keeps its span and no more, and forgets a group that is gone.
func TestHistoryKeepsItsSpan(t *testing.T) {
	t.Parallel()
	f := newChartsFixture(t)
	h, err := adminui.NewHistory(adminui.HistoryConfig{Admin: f.admin, Clock: f.clock, Every: time.Second, Span: 5 * time.Second})
	require.NoError(t, err)
	for range 9 {
		f.clock.Advance(time.Second)
		require.NoError(t, h.Sample(context.Background()))
	}
	backlog := series(h, "events", "audit")["backlog"]
	require.Len(t, backlog, 6, "5 s of 1 s samples, both ends")
	require.Equal(t, f.clock.Now(), backlog[5].At)
	require.Equal(t, f.clock.Now().Add(-5*time.Second), backlog[0].At)

	require.NoError(t, f.admin.RemoveGroup(context.Background(), "events", "audit"))
	for range 6 {
		f.clock.Advance(time.Second)
		require.NoError(t, h.Sample(context.Background()))
	}
	require.Empty(t, h.Of("events", "audit"), "a removed group's charts go once its span has passed")

	for _, cfg := range []adminui.HistoryConfig{{}, {Admin: f.admin, Every: -time.Second}, {Admin: f.admin, Every: time.Minute, Span: time.Second}} {
		_, err := adminui.NewHistory(cfg)
		require.ErrorIs(t, err, outbox.ErrInvalidConfig)
	}
}

// In a real browser: the charts draw what the history read (a group's
// backlog growing while it is stopped, then draining, its dead letters),
// the Checks page, and the message look-up.
func TestInBrowserCharts(t *testing.T) {
	t.Parallel()
	f := newChartsFixture(t)
	f.sample(t)
	for i := range 12 { // two minutes of sends while the group is stopped
		f.send(t, "events", 20+10*(i%4), 1)
		f.send(t, "jobs", 3, 0)
		f.sample(t)
	}
	f.run(t)
	f.drained(t, 12)
	for i := range 6 { // a minute of sends the running group keeps up with
		f.send(t, "events", 15, i%2)
		f.sample(t)
	}
	f.drained(t, 15)
	f.sample(t)
	want := len(series(f.history, "events", "audit")["backlog"])
	require.GreaterOrEqual(t, want, 19)

	srv := httptest.NewServer(handler(t, adminui.Config{Admin: f.admin, History: f.history, CacheFor: -1}))
	t.Cleanup(srv.Close)
	b := newBrowser(t)
	b.open(srv.URL + "/topics/events/groups/audit")
	b.waitFor("#charts")
	for _, s := range []string{"finished", "backlog", "lag", "retrying", "dead_letters"} {
		fig := fmt.Sprintf(`figure.chart[data-series="%s"]`, s)
		require.Equal(t, 1, b.count(fig), s)
		require.Positive(t, b.count(fig+" polyline"), "%s: a line drawn", s)
	}
	require.Equal(t, strconv.Itoa(want), b.attr(`figure.chart[data-series="backlog"]`, "data-points"))
	require.Equal(t, "0", b.text(`figure.chart[data-series="backlog"] .last`), "drained")
	deadNow := b.text(`figure.chart[data-series="dead_letters"] .last`)
	require.Equal(t, "15", deadNow, "12 while stopped, 3 since")
	require.Equal(t, "Lag (seconds), last 1h", b.attr(`figure.chart[data-series="lag"] svg`, "aria-label"))
	if dir := os.Getenv("PGOUTBOX_SCREENSHOTS"); dir != "" {
		b.screenshot(filepath.Join(dir, "adminui-charts.png"))
	}

	b.open(srv.URL + "/topics/jobs")
	b.waitFor(`figure.chart[data-series="backlog"]`)
	require.Equal(t, "36", b.text(`figure.chart[data-series="backlog"] .last`), "the QUEUE topic's ready messages")

	b.open(srv.URL + "/topics/events")
	b.fill("#message-id", strconv.FormatInt(firstID(t, f), 10))
	b.click("#look-up")
	b.waitFor("#message-groups")
	require.Equal(t, "DEAD_LETTER", b.text(`#message-groups tr[data-group="audit"] .state`), "the first message was bad")

	b.click("#nav-checks")
	b.waitFor("#storage")
	require.Contains(t, b.text(`#storage tr[data-topic="jobs"]`), "36")
	require.Contains(t, b.text("#consistent"), "adds up")
	require.Contains(t, b.text("#no-stuck"), "Nothing waits that long", "nothing an hour old")
	b.fill("#stuck-older-than", "0s")
	b.click("#stuck-look")
	b.waitFor("#stuck")
	require.Contains(t, b.text(`#stuck tr[data-topic="jobs"]`), "jobs", "nothing reads jobs")
}

// firstID is the id of events' first message.
func firstID(t *testing.T, f *chartsFixture) int64 {
	t.Helper()
	var id int64
	require.NoError(t, f.db.Pool.QueryRow(context.Background(),
		fmt.Sprintf(`SELECT min(id) FROM %q.outbox_published WHERE topic = 'events'`, f.db.Schema)).Scan(&id))
	return id
}

func handler(t testing.TB, cfg adminui.Config) http.Handler {
	t.Helper()
	h, err := adminui.NewHandler(cfg)
	require.NoError(t, err)
	return h
}
