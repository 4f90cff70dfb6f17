package adminui_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/adminui"
	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/blockedtest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/queuetest"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/router"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// fixture is a database with a QUEUE topic "orders" holding two dead
// letters (one with an e-mail address in its payload) and a ready
// message, and a PUB_SUB topic "events" with a running group "billing"
// holding one dead letter.
type fixture struct {
	client *outbox.Client
	admin  *admin.Admin
	dead   []int64 // the dead letters of orders
	group  *consumergroup.Group
	db     *pgtest.DB
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	client, err := outbox.NewClient(db.Pool, outbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	require.NoError(t, client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "orders", Semantics: outbox.Queue}))
	require.NoError(t, client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: outbox.Counter}))
	producer, err := outbox.NewProducer(outbox.ProducerConfig{Schema: db.Schema, AllowUnconfiguredTopics: true})
	require.NoError(t, err)
	f := &fixture{client: client, db: db}
	f.dead = queuetest.DeadLetter(t, db.Pool, client, "schema mismatch: field total missing",
		outbox.Message{Topic: "orders", Payload: json.RawMessage(`{"email":"someone@example.com"}`), Group: "customer-7"},
		outbox.Message{Topic: "orders", Payload: json.RawMessage(`{"n":2}`)})
	_, err = producer.Send(ctx, db.Pool, outbox.Message{Topic: "orders", Payload: json.RawMessage(`{"n":3}`)})
	require.NoError(t, err)
	g, err := consumergroup.New(db.Pool, consumergroup.Config{Topic: "events", Group: "billing", Client: client,
		PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, g.AddConsumer("m", func(context.Context, *outbox.Delivery) error {
		return outbox.Permanent(errors.New("billing account closed"))
	}, nil))
	require.NoError(t, g.Start(ctx, consumergroup.FromNow()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = g.Stop(ctx)
	})
	f.group = g
	_, err = producer.Send(ctx, db.Pool, outbox.Message{Topic: "events", Payload: json.RawMessage(`{"invoice":1}`)})
	require.NoError(t, err)
	pgtest.Eventually(t, 30*time.Second, "the group's dead letter", func() bool {
		dls, err := g.DeadLetters(ctx, 0, 10)
		require.NoError(t, err)
		return len(dls) == 1
	})
	f.admin, err = admin.New(client, admin.Options{})
	require.NoError(t, err)
	return f
}

func (f *fixture) serve(t *testing.T, cfg adminui.Config, wrap func(http.Handler) http.Handler) *httptest.Server {
	t.Helper()
	cfg.Admin = f.admin
	h, err := adminui.NewHandler(cfg)
	require.NoError(t, err)
	if wrap != nil {
		h = wrap(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

func (f *fixture) deadLetters(t *testing.T) []int64 {
	t.Helper()
	adm, err := admin.New(f.client, admin.Options{})
	require.NoError(t, err)
	dls, err := adm.DeadLetters(context.Background(), "orders", "", 0, 10)
	require.NoError(t, err)
	ids := make([]int64, len(dls))
	for i, d := range dls {
		ids[i] = d.ID
	}
	return ids
}

// In a real browser: the topics page lists both topics, the QUEUE topic's
// page lists its dead letters, a click on one's Replay button replays it
// (and only it), and the group's page shows its state and dead letter.
func TestInBrowser(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	srv := f.serve(t, adminui.Config{Prefix: "/ops", Writable: true}, nil)
	b := newBrowser(t)
	shots := t.TempDir()

	b.open(srv.URL + "/ops/")
	require.Equal(t, 2, b.count("#topics tr[data-topic]"))
	require.Contains(t, b.text(`#topics tr[data-topic="events"]`), "billing")
	require.Contains(t, b.text(`#topics tr[data-topic="orders"]`), "QUEUE")
	b.screenshot(filepath.Join(shots, "topics.png"))

	b.click(`#topics tr[data-topic="orders"] a`)
	b.waitFor("#dead-letters")
	require.Equal(t, 2, b.count("#dead-letters tr[data-id]"))
	require.Contains(t, b.text("#dead-letters"), "schema mismatch")
	require.NotContains(t, b.text("#dead-letters"), "someone@example.com", "payloads are hidden by default")
	b.screenshot(filepath.Join(shots, "orders.png"))

	replayed := f.dead[0]
	b.click(fmt.Sprintf(`button.replay[data-id="%d"]`, replayed))
	b.waitFor("#done")
	require.Equal(t, "replayed 1 dead letters", b.text("#done"))
	require.Equal(t, 1, b.count("#dead-letters tr[data-id]"))
	require.Zero(t, b.count(fmt.Sprintf(`#dead-letters tr[data-id="%d"]`, replayed)))
	require.Equal(t, []int64{f.dead[1]}, f.deadLetters(t), "the clicked one, and only it, was replayed")
	require.NotContains(t, b.url(), "done", "the banner does not come from the address")
	b.reload()
	b.waitFor("#dead-letters")
	require.Zero(t, b.count("#done"), "a reload does not say it again")

	kept := f.dead[1]
	b.click(fmt.Sprintf(`button.purge[data-id="%d"]`, kept))
	b.waitFor("#confirm-purge")
	require.Contains(t, b.text("#confirm-purge"), fmt.Sprint(kept))
	b.click("#cancel")
	b.waitFor("#dead-letters")
	require.Equal(t, []int64{kept}, f.deadLetters(t), "cancelled: nothing purged")
	b.click(fmt.Sprintf(`button.purge[data-id="%d"]`, kept))
	b.waitFor("#confirm-purge")
	b.click("#confirm")
	b.waitFor("#done")
	require.Equal(t, "purged 1 dead letters", b.text("#done"))
	require.Empty(t, f.deadLetters(t))

	b.open(srv.URL + "/ops/topics/events/groups/billing")
	require.Equal(t, "ACTIVE", b.text("#state"))
	require.Equal(t, 1, b.count("#dead-letters tr[data-id]"))
	require.Contains(t, b.text("#dead-letters"), "billing account closed")
	b.click("#pause")
	b.waitFor("#done")
	require.Equal(t, "PAUSED", b.text("#state"))
	b.screenshot(filepath.Join(shots, "group.png"))
	t.Logf("screenshots in %s", shots)
}

// In a real browser, an ordered topic's blocked message groups: listed on
// the topics page (with a router's pools under a title that is not
// "Router 0", and no age for the oldest ready message of a topic with
// none ready), on the topic's page, where purging the dead letter that
// blocks cust-99 (once confirmed) lets it go on, and on the group's page,
// which tells its queue from its retries.
func TestInBrowserBlockedGroups(t *testing.T) {
	t.Parallel()
	f := newOrderedFixture(t)
	rt, err := router.New(router.Config{AllowedHosts: []string{"127.0.0.1"}, Pools: []router.PoolConfig{{Code: "P", Concurrency: 1}}})
	require.NoError(t, err)
	srv := f.serve(t, adminui.Config{Prefix: "/ops", Writable: true, Routers: []*router.Router{rt}})
	b := newBrowser(t)

	b.open(srv.URL + "/ops/")
	require.Equal(t, 4, b.count("#blocked tr[data-message-group]"))
	require.Contains(t, b.text(`#blocked tr[data-topic="orders"][data-message-group="cust-99"]`), blockedtest.QueueDeadError)
	require.Contains(t, b.text(`#blocked tr[data-topic="events"][data-group="billing"][data-message-group="cust-99"]`),
		blockedtest.GroupDeadError)
	require.Equal(t, "–", b.text(`#topics tr[data-topic="later"] .oldest-ready`))
	require.NotContains(t, b.text("main"), "Router 0")
	require.Contains(t, b.text("main"), "Router")

	b.click(`#blocked tr[data-topic="orders"][data-message-group="cust-99"] a`)
	b.waitFor("#blocked")
	row := fmt.Sprintf(`#blocked tr[data-head="%d"]`, f.DeadHead)
	require.Contains(t, b.text(row), "cust-99")
	require.Contains(t, b.text(row), "dead letter")
	if dir := os.Getenv("PGOUTBOX_SCREENSHOTS"); dir != "" { // README's picture
		b.screenshot(filepath.Join(dir, "adminui.png"))
	}
	b.click(fmt.Sprintf(`button.purge[data-id="%d"]`, f.DeadHead))
	b.waitFor("#confirm")
	b.click("#confirm")
	b.waitFor("#done")
	require.Equal(t, "purged 1 dead letters", b.text("#done"))
	require.Zero(t, b.count(`#blocked tr[data-message-group="cust-99"]`), "cust-99 goes on")
	require.Equal(t, 1, b.count(`#blocked tr[data-message-group="cust-5"]`), "cust-5 waits for its retry")

	b.open(srv.URL + "/ops/topics/events/groups/billing")
	require.Equal(t, "1", b.text("#waiting"), "cust-5's head waits for a retry")
	require.Equal(t, "3", b.text("#queued"), "three wait behind the heads, never tried")
	require.Contains(t, b.text(`#blocked tr[data-message-group="cust-99"]`), blockedtest.GroupDeadError)
}

func post(t *testing.T, srv *httptest.Server, path string, form url.Values, header http.Header) (int, string) {
	t.Helper()
	req, err := http.NewRequest("POST", srv.URL+path, strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range header {
		req.Header[k] = v
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func get(t testing.TB, srv *httptest.Server, path string) (int, string) {
	t.Helper()
	resp, err := http.Get(srv.URL + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// Refused, each with a 4xx and a message, and nothing changes: an action
// on a read-only UI, one the caller's middleware does not approve, a
// forged cross-site form post, unknown names, malformed ids and bodies.
func TestRefusals(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	replay := url.Values{"id": {fmt.Sprint(f.dead[0])}}
	gone, err := consumergroup.New(f.client.Pool(), consumergroup.Config{Topic: "events", Group: "gone", Client: f.client})
	require.NoError(t, err)
	require.NoError(t, gone.AddConsumer("m", func(context.Context, *outbox.Delivery) error { return nil }, nil))
	require.NoError(t, gone.Start(context.Background(), consumergroup.FromNow()))
	require.NoError(t, gone.Cancel(context.Background()))

	ro := f.serve(t, adminui.Config{}, nil)
	code, body := get(t, ro, "/topics/orders")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `id="read-only"`)
	require.NotContains(t, body, `method="post"`, "a read-only page offers no action (a look-up is a read)")
	code, body = post(t, ro, "/topics/orders/dead-letters/replay", replay, nil)
	require.Equal(t, http.StatusForbidden, code)
	require.Contains(t, body, "read-only")
	code, body = post(t, ro, "/api/topics/orders/dead-letters/purge", nil, nil)
	require.Equal(t, http.StatusForbidden, code, body)

	operatorsOnly := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost && r.Header.Get("X-Operator") != "yes" {
				http.Error(w, "operators only", http.StatusForbidden)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
	rw := f.serve(t, adminui.Config{Writable: true}, operatorsOnly)
	code, body = post(t, rw, "/topics/orders/dead-letters/replay", replay, nil)
	require.Equal(t, http.StatusForbidden, code)
	require.Contains(t, body, "operators only")

	op := http.Header{"X-Operator": {"yes"}}
	forged := http.Header{"X-Operator": {"yes"}, "Sec-Fetch-Site": {"cross-site"}}
	code, _ = post(t, rw, "/topics/orders/dead-letters/replay", replay, forged)
	require.Equal(t, http.StatusForbidden, code, "a form posted from another site")
	forged = http.Header{"X-Operator": {"yes"}, "Origin": {"https://evil.example"}}
	code, _ = post(t, rw, "/topics/orders/dead-letters/purge", replay, forged)
	require.Equal(t, http.StatusForbidden, code, "a form posted from another origin")

	for _, c := range []struct {
		path string
		form url.Values
		code int
		says string
	}{
		{"/topics/nope/dead-letters/replay", replay, http.StatusNotFound, "not found"},
		{"/topics/orders/dead-letters/replay", url.Values{"id": {"12abc"}}, http.StatusBadRequest, "not a message id"},
		{"/topics/orders/dead-letters/replay", url.Values{"id": {"99999999"}}, http.StatusNotFound, "not found"},
		{"/topics/orders/dead-letters/explode", replay, http.StatusBadRequest, "unknown action"},
		{"/topics/events/groups/nobody/pause", nil, http.StatusNotFound, "nobody"},
		{"/topics/events/groups/gone/resume", nil, http.StatusConflict, "CANCELLED"},
		{"/topics/orders/groups/billing/pause", nil, http.StatusBadRequest, "QUEUE"},
		{"/topics/orders/dead-letters/purge", nil, http.StatusBadRequest, "no dead letter named"},
	} {
		code, body := post(t, rw, c.path, c.form, op)
		require.Equal(t, c.code, code, "%s: %s", c.path, body)
		require.Contains(t, body, c.says, c.path)
	}
	for _, c := range []struct {
		path string
		code int
		says string
	}{
		{"/topics/nope", http.StatusNotFound, "not found"},
		{"/topics/events/groups/nobody", http.StatusNotFound, "nobody"},
		{"/topics/bad%20name", http.StatusBadRequest, "invalid topic"},
		{"/api/topics/nope", http.StatusNotFound, `"error":`},
		{"/api/topics/orders/dead-letters?limit=abc", http.StatusBadRequest, `"error":`},
		{"/api/topics/orders/dead-letters?after=-3", http.StatusBadRequest, `"error":`},
		{"/api/topics/events/groups/nobody", http.StatusNotFound, `"error":`},
	} {
		code, body := get(t, rw, c.path)
		require.Equal(t, c.code, code, "%s: %s", c.path, body)
		require.Contains(t, body, c.says, c.path)
	}
	req, err := http.NewRequest("POST", rw.URL+"/api/topics/orders/dead-letters/replay", strings.NewReader(`{"ids": ["x"]}`))
	require.NoError(t, err)
	req.Header.Set("X-Operator", "yes")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, "a malformed JSON body")
	for _, body := range []string{`{}`, `null`, `{"ids": []}`} {
		req, err := http.NewRequest("POST", rw.URL+"/api/topics/orders/dead-letters/purge", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("X-Operator", "yes")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, "purge with %s names no dead letter", body)
	}
	resp, err = http.Get(rw.URL + "/topics/orders")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, "DENY", resp.Header.Get("X-Frame-Options"), "pages may not be framed")
	require.Contains(t, resp.Header.Get("Content-Security-Policy"), "frame-ancestors 'none'")
	_, body = get(t, rw, "/topics/orders?done=<b>you+were+hacked</b>")
	require.NotContains(t, body, "hacked", "the banner says only what an action did")

	require.ElementsMatch(t, f.dead, f.deadLetters(t), "nothing was replayed or purged")
	state, err := f.group.State(context.Background())
	require.NoError(t, err)
	require.Equal(t, consumergroup.Active, state, "nothing was paused")

	// The approved, same-origin actions go through; resuming a group that
	// is ACTIVE already is what was asked for.
	code, _ = post(t, rw, "/topics/events/groups/billing/resume", nil, op)
	require.Equal(t, http.StatusSeeOther, code)
	replay.Set("confirm", "yes")
	code, _ = post(t, rw, "/topics/orders/dead-letters/purge", replay, op)
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, []int64{f.dead[1]}, f.deadLetters(t))
}

// The JSON API reads what the pages show; payloads only when enabled, and
// then through the redaction hook.
func TestAPIAndPayloads(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	hidden := f.serve(t, adminui.Config{Prefix: "/ops"}, nil)
	code, body := get(t, hidden, "/ops/api/topics")
	require.Equal(t, http.StatusOK, code, body)
	var topics []topicJSON
	require.NoError(t, json.Unmarshal([]byte(body), &topics))
	require.Len(t, topics, 2)
	require.Equal(t, "orders", topics[1].Name)
	require.EqualValues(t, 1, *topics[1].Ready)
	require.EqualValues(t, 2, *topics[1].DeadLetters)
	require.Nil(t, topics[0].Ready, "a PUB_SUB topic's backlog is its groups'")

	code, body = get(t, hidden, "/ops/api/topics/events/groups")
	require.Equal(t, http.StatusOK, code, body)
	var groups []consumergroup.Health
	require.NoError(t, json.Unmarshal([]byte(body), &groups))
	require.Len(t, groups, 1)
	require.EqualValues(t, 1, groups[0].DeadLetters)

	code, body = get(t, hidden, "/ops/api/topics/orders/dead-letters")
	require.Equal(t, http.StatusOK, code, body)
	require.NotContains(t, body, "someone@example.com")
	require.NotContains(t, body, `"payload"`)

	redacting := f.serve(t, adminui.Config{ShowPayloads: true, Redact: func(d outbox.DeadLetter) outbox.DeadLetter {
		d.Payload = json.RawMessage(strings.ReplaceAll(string(d.Payload), "someone@example.com", "***"))
		return d
	}}, nil)
	code, body = get(t, redacting, "/api/topics/orders/dead-letters?limit=10")
	require.Equal(t, http.StatusOK, code, body)
	require.NotContains(t, body, "someone@example.com")
	require.Contains(t, body, `"payload":{"email":"***"}`)
	code, body = get(t, redacting, "/topics/orders")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "***")
	require.NotContains(t, body, "someone@example.com")

	masking := f.serve(t, adminui.Config{Redact: func(d outbox.DeadLetter) outbox.DeadLetter {
		d.LastError = "***"
		return d
	}}, nil)
	code, body = get(t, masking, "/api/topics/orders/dead-letters")
	require.Equal(t, http.StatusOK, code, body)
	require.NotContains(t, body, "schema mismatch", "Redact applies without ShowPayloads too")
	require.NotContains(t, body, "someone@example.com")

	code, body = get(t, redacting, "/static/style.css")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "font")
}

func TestConfig(t *testing.T) {
	_, err := adminui.NewHandler(adminui.Config{})
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
}

// A topic that holds messages without a configuration (its configuration
// was deleted by hand) is on the topics page, flagged, and its own page
// says what that means.
func TestPagesFlagUnconfiguredTopics(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	_, err := f.admin.Topic(context.Background(), "emials")
	require.ErrorIs(t, err, outbox.ErrNotFound)
	_, err = f.client.Pool().Exec(context.Background(), `INSERT INTO `+pgx.Identifier{f.client.Schema(), "outbox_published"}.Sanitize()+
		` (topic, payload, correlation_id, status) VALUES ('emials', '{}', 'c', 'PUBLISHED')`)
	require.NoError(t, err)
	srv := f.serve(t, adminui.Config{}, nil)
	code, body := get(t, srv, "/")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `data-topic="emials"`)
	require.Contains(t, body, "(unconfigured)")
	code, body = get(t, srv, "/topics/emials")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "was never configured")
}

// topicJSON is the documented JSON shape of a topic (see admin.Topic's
// MarshalJSON), as a client of the API decodes it.
type topicJSON struct {
	Name        string   `json:"name"`
	Semantics   string   `json:"semantics"`
	Groups      []string `json:"groups"`
	Ready       *int64   `json:"ready"`
	Scheduled   *int64   `json:"scheduled"`
	Leased      *int64   `json:"leased"`
	DeadLetters *int64   `json:"dead_letters"`
}
