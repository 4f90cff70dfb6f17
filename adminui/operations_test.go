package adminui_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/adminui"
	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/blockedtest"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/router"
)

// orderedFixture is blockedtest's fixture (ordered topics "orders" and
// "events", each with message groups cust-99 and cust-5 blocked) and a
// QUEUE topic "later" whose only message is due in an hour.
type orderedFixture struct {
	*blockedtest.Fixture
	admin *admin.Admin
}

func newOrderedFixture(t *testing.T) *orderedFixture {
	t.Helper()
	f := &orderedFixture{Fixture: blockedtest.New(t, outbox.TopicConfig{Name: "later", Semantics: outbox.Queue})}
	producer, err := outbox.NewProducer(outbox.ProducerConfig{Schema: f.DB.Schema, AllowUnconfiguredTopics: true})
	require.NoError(t, err)
	_, err = producer.Send(context.Background(), f.DB.Pool, outbox.Message{Topic: "later", Payload: json.RawMessage(`{}`), Delay: time.Hour})
	require.NoError(t, err)
	f.admin, err = admin.New(f.Client, admin.Options{})
	require.NoError(t, err)
	return f
}

func (f *orderedFixture) serve(t *testing.T, cfg adminui.Config) *httptest.Server {
	t.Helper()
	cfg.Admin = f.admin
	h, err := adminui.NewHandler(cfg)
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

func readBody(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(body)
}

// The blocked message groups, in the JSON API: every ordered topic's and
// group's, a topic's, a group's; and a group's health tells its queue
// from its retries.
func TestAPIBlockedGroups(t *testing.T) {
	t.Parallel()
	f := newOrderedFixture(t)
	srv := f.serve(t, adminui.Config{Redact: hiding("customer")})

	code, body := get(t, srv, "/api/blocked")
	require.Equal(t, http.StatusOK, code, body)
	var all []admin.Blocked
	require.NoError(t, json.Unmarshal([]byte(body), &all))
	require.Len(t, all, 4, body)
	require.Equal(t, "events", all[0].Topic, "by topic")
	require.Equal(t, "billing", all[0].ConsumerGroup)
	last := all[3]
	require.Equal(t, "orders", last.Topic)
	require.Empty(t, last.ConsumerGroup)
	if last.Group != "cust-99" {
		last = all[2]
	}
	require.Equal(t, f.DeadHead, last.HeadID)
	require.True(t, last.DeadLettered)
	require.Equal(t, 2, last.Behind)
	require.Equal(t, "permanent: no such ***", last.LastError, "through Redact, as dead letters are")

	code, body = get(t, srv, "/api/topics/orders/blocked")
	require.Equal(t, http.StatusOK, code, body)
	var bs []outbox.BlockedGroup
	require.NoError(t, json.Unmarshal([]byte(body), &bs))
	require.Len(t, bs, 2)
	require.ElementsMatch(t, []int64{f.DeadHead, f.RetryHead}, []int64{bs[0].HeadID, bs[1].HeadID})
	code, body = get(t, srv, "/api/topics/events/blocked?group=billing&limit=5")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "account closed")
	code, body = get(t, srv, "/api/topics/events/blocked")
	require.Equal(t, http.StatusOK, code, body)
	var each []admin.Blocked
	require.NoError(t, json.Unmarshal([]byte(body), &each))
	require.Len(t, each, 2, "without group=, each of a PUB_SUB topic's groups': %s", body)
	require.Equal(t, "billing", each[0].ConsumerGroup)
	code, body = get(t, srv, "/api/topics/later/blocked")
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, "[]\n", body, "a topic that is not ordered has none")
	for path, want := range map[string]int{
		"/api/topics/nope/blocked":                 http.StatusNotFound,
		"/api/topics/events/blocked?group=nobody":  http.StatusNotFound,
		"/api/topics/orders/blocked?limit=-1":      http.StatusBadRequest,
		"/api/topics/orders/blocked?group=billing": http.StatusBadRequest,
	} {
		code, body := get(t, srv, path)
		require.Equal(t, want, code, "%s: %s", path, body)
		require.Contains(t, body, `"error":`, path)
	}

	code, body = get(t, srv, "/api/topics/events/groups/billing")
	require.Equal(t, http.StatusOK, code, body)
	var h consumergroup.Health
	require.NoError(t, json.Unmarshal([]byte(body), &h))
	require.EqualValues(t, 1, h.Waiting, "cust-5's head waits for a retry")
	require.EqualValues(t, 3, h.Queued, "the three behind the heads")

	code, body = get(t, srv, "/api/topics/later")
	require.Equal(t, http.StatusOK, code, body)
	var later topicJSON
	require.NoError(t, json.Unmarshal([]byte(body), &later))
	require.EqualValues(t, 1, *later.Scheduled)
	require.Zero(t, *later.Leased)
}

// The pages: blocked message groups where an operator looks (the topics
// page, the topic's, the group's); a group's queue apart from its
// retries; no age for the oldest ready message of a topic with none
// ready; a router's section not titled "Router 0".
func TestPagesShowBlockedGroups(t *testing.T) {
	t.Parallel()
	f := newOrderedFixture(t)
	rt, err := router.New(router.Config{AllowedHosts: []string{"127.0.0.1"}, Pools: []router.PoolConfig{{Code: "P", Concurrency: 1}}})
	require.NoError(t, err)
	srv := f.serve(t, adminui.Config{Routers: []*router.Router{rt}})

	code, body := get(t, srv, "/")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `id="blocked"`)
	require.Contains(t, body, "no such customer")
	require.Contains(t, body, "account closed")
	require.NotContains(t, body, "Router 0")
	require.Contains(t, body, `<td class="num oldest-ready">–</td>`, "later has nothing ready")

	_, body = get(t, srv, "/topics/orders")
	require.Contains(t, body, `id="blocked"`)
	require.Contains(t, body, fmt.Sprintf(`data-head="%d"`, f.DeadHead))
	_, body = get(t, srv, "/topics/events")
	require.Contains(t, body, `<tr data-topic="events" data-group="billing" data-message-group="cust-99">`, "its groups'")
	_, body = get(t, srv, "/topics/later")
	require.Contains(t, body, `<dd id="oldest-ready">–</dd>`)
	_, body = get(t, srv, "/topics/events/groups/billing")
	require.Contains(t, body, `id="blocked"`)
	require.Contains(t, body, `<dd id="waiting">1</dd>`)
	require.Contains(t, body, `<dd id="queued">3</dd>`)
}

// A banner says what an action did once, on the page the action
// returned to: not from a link, not again on a reload.
func TestBannerOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	srv := f.serve(t, adminui.Config{Writable: true}, nil)

	_, body := get(t, srv, "/topics/orders?done=purge&n=999999")
	require.NotContains(t, body, `id="done"`, "a link cannot make the page say an action was done")
	require.NotContains(t, body, "999999")

	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	browser := &http.Client{Jar: jar}
	resp, err := browser.PostForm(srv.URL+"/topics/orders/dead-letters/replay", url.Values{"id": {fmt.Sprint(f.dead[0])}})
	require.NoError(t, err)
	first := readBody(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode, first)
	require.Equal(t, "/topics/orders", resp.Request.URL.RequestURI(), "redirected to the page, no query")
	require.Contains(t, first, `<p class="done" id="done">replayed 1 dead letters</p>`)
	resp, err = browser.Get(srv.URL + "/topics/orders")
	require.NoError(t, err)
	require.NotContains(t, readBody(t, resp), `id="done"`, "a reload shows no banner")
}

// Purging from a page asks first: the button shows what would be purged
// and a confirming button; only that one purges.
func TestPurgeAsksFirst(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	srv := f.serve(t, adminui.Config{Writable: true}, nil)
	purge := url.Values{"id": {fmt.Sprint(f.dead[0])}}
	code, body := post(t, srv, "/topics/orders/dead-letters/purge", purge, nil)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `id="confirm-purge"`)
	require.Contains(t, body, fmt.Sprint(f.dead[0]))
	require.ElementsMatch(t, f.dead, f.deadLetters(t), "nothing purged yet")

	purge.Set("confirm", "yes")
	code, body = post(t, srv, "/topics/orders/dead-letters/purge", purge, nil)
	require.Equal(t, http.StatusSeeOther, code, body)
	require.Equal(t, []int64{f.dead[1]}, f.deadLetters(t))
}

// A body larger than the API takes is refused as too large (413), before
// it is read whole.
func TestAPIBodyTooLarge(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	srv := f.serve(t, adminui.Config{Writable: true}, nil)
	big := `{"ids": [` + strings.Repeat("1,", 4<<20) + `1]}` // 8 MiB
	resp, err := http.Post(srv.URL+"/api/topics/orders/dead-letters/replay", "application/json", bytes.NewReader([]byte(big)))
	require.NoError(t, err)
	body := readBody(t, resp)
	require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode, body)
	require.Contains(t, body, "too large")
	code, body := post(t, srv, "/topics/orders/dead-letters/replay", url.Values{"id": {strings.Repeat("1", 8<<20)}}, nil)
	require.Equal(t, http.StatusRequestEntityTooLarge, code, "a form too: %.200s", body)
	require.ElementsMatch(t, f.dead, f.deadLetters(t), "nothing replayed")
}

// Which groups finished a message: one per group, last errors through
// Redact; an unknown message is 404, a bad id 400.
func TestAPIMessageGroups(t *testing.T) {
	t.Parallel()
	f := newOrderedFixture(t)
	srv := f.serve(t, adminui.Config{Redact: hiding("account")})
	for mg, want := range map[string]admin.MessageState{"cust-99": admin.MessageDeadLettered, "cust-5": admin.MessageRetrying,
		"cust-1": admin.MessageFinished} {
		code, body := get(t, srv, fmt.Sprintf("/api/topics/events/messages/%d/groups", f.EventsMessage(t, mg, 0)))
		require.Equal(t, http.StatusOK, code, body)
		var gs []admin.MessageGroup
		require.NoError(t, json.Unmarshal([]byte(body), &gs))
		require.Len(t, gs, 1, body)
		require.Equal(t, "billing", gs[0].ConsumerGroup)
		require.Equal(t, want, gs[0].State, mg)
		if mg == "cust-99" {
			require.Equal(t, "permanent: *** closed", gs[0].LastError, "through Redact")
		}
	}
	code, body := get(t, srv, fmt.Sprintf("/api/topics/events/messages/%d/groups", f.EventsMessage(t, "cust-99", 1)))
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `"state":"PENDING"`, "behind its blocked head")
	code, body = get(t, srv, fmt.Sprintf("/api/topics/orders/messages/%d/groups", f.DeadHead))
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `"state":"DEAD_LETTER"`, "a QUEUE topic's consumers' group")
	for path, want := range map[string]int{
		"/api/topics/events/messages/999999999/groups": http.StatusNotFound,
		"/api/topics/nope/messages/1/groups":           http.StatusNotFound,
		"/api/topics/events/messages/x/groups":         http.StatusBadRequest,
		"/api/topics/events/messages/-1/groups":        http.StatusBadRequest,
	} {
		code, body := get(t, srv, path)
		require.Equal(t, want, code, "%s: %s", path, body)
	}
}

// hiding is a Config.Redact that replaces word in last errors with "***".
func hiding(word string) func(outbox.DeadLetter) outbox.DeadLetter {
	return func(d outbox.DeadLetter) outbox.DeadLetter {
		d.LastError = strings.ReplaceAll(d.LastError, word, "***")
		return d
	}
}

// The topics page and the JSON API show, for each router name, which
// instance leads and which holds which permits of each pool.
func TestRouterClusters(t *testing.T) {
	t.Parallel()
	f := newOrderedFixture(t)
	srv := f.serve(t, adminui.Config{CacheFor: -1})
	code, body := get(t, srv, "/api/routers/shared")
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, "[]\n", body, "no router shares anything yet")

	_, err := f.DB.Pool.Exec(context.Background(), fmt.Sprintf(`
		INSERT INTO %[1]q.outbox_router_permits (router, pool, instance, permits, wanted, lease_until)
		VALUES ('webhooks', 'P', 'web-1', 3, 4, now() + interval '10 seconds'),
		       ('webhooks', 'P', 'web-2', 1, 2, now() + interval '10 seconds'),
		       ('webhooks', 'P', 'web-3', 2, 2, now() - interval '1 second');
		INSERT INTO %[1]q.outbox_router_leaders (router, instance) VALUES ('webhooks', 'web-1')`, f.DB.Schema))
	require.NoError(t, err)
	code, body = get(t, srv, "/api/routers/shared")
	require.Equal(t, http.StatusOK, code, body)
	var clusters []struct {
		Name   string `json:"name"`
		Leader struct {
			Instance string `json:"instance"`
		} `json:"leader"`
		Permits []struct {
			Instance  string  `json:"instance"`
			Permits   int     `json:"permits"`
			LeaseLeft float64 `json:"lease_left_seconds"`
		} `json:"permits"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &clusters))
	require.Len(t, clusters, 1)
	require.Equal(t, "web-1", clusters[0].Leader.Instance)
	require.Len(t, clusters[0].Permits, 2, "an expired lease holds nothing")
	require.Equal(t, 3, clusters[0].Permits[0].Permits)
	require.Positive(t, clusters[0].Permits[0].LeaseLeft)

	code, body = get(t, srv, "/")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "Routers named webhooks")
	require.Contains(t, body, `<strong class="leader">web-1</strong>`)
	require.Contains(t, body, `<tr data-instance="web-2"><td>P</td><td>web-2</td><td class="num">1</td>`)
	require.NotContains(t, body, "web-3")
}
