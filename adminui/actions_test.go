package adminui_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/adminui"
	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// postJSON posts body (nil: none) to the API and decodes the answer.
func postJSON(t *testing.T, url string, body any) (int, map[string]any) {
	t.Helper()
	var r *bytes.Reader
	if body != nil {
		b, err := json.Marshal(body)
		require.NoError(t, err)
		r = bytes.NewReader(b)
	} else {
		r = bytes.NewReader(nil)
	}
	resp, err := http.Post(url, "application/json", r)
	require.NoError(t, err)
	var out map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	resp.Body.Close()
	return resp.StatusCode, out
}

// Every group action the CLI has is in the JSON API: force-complete
// (which needs an age), a mode change, cancel, resurrect (of a DEAD
// group only), remove; the check and the storage report; bad input is a
// 400, a forbidden change a 409, a read-only UI a 403.
func TestAPIGroupActions(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	srv := f.serve(t, adminui.Config{Writable: true}, nil)
	ctx := context.Background()
	api := srv.URL + "/api/topics/events"

	code, out := postJSON(t, api+"/groups/billing/force-complete", nil)
	require.Equal(t, http.StatusBadRequest, code, out)
	require.Contains(t, out["error"], "older_than_seconds")
	code, out = postJSON(t, api+"/groups/billing/force-complete", map[string]any{"older_than_seconds": 3600})
	require.Equal(t, http.StatusOK, code, out)
	require.Equal(t, map[string]any{"done": "force-complete", "completed": 0.0}, out)

	code, out = postJSON(t, api+"/mode", map[string]string{"mode": "offset"})
	require.Equal(t, http.StatusOK, code, out)
	topic, err := f.admin.Topic(ctx, "events")
	require.NoError(t, err)
	require.Equal(t, outbox.Offset, topic.Tracking)
	code, _ = postJSON(t, api+"/mode", map[string]string{"mode": "nope"})
	require.Equal(t, http.StatusBadRequest, code)

	code, out = postJSON(t, api+"/groups/billing/resurrect", nil)
	require.Equal(t, http.StatusConflict, code, "an ACTIVE group cannot be resurrected: %v", out)
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, f.group.Stop(stopCtx))
	f.declareDead(t, "events", "billing")
	code, out = postJSON(t, api+"/groups/billing/resurrect", map[string]bool{"backfill": false})
	require.Equal(t, http.StatusOK, code, out)
	require.Equal(t, map[string]any{"done": "resurrect"}, out)
	h, err := f.admin.Group(ctx, "events", "billing")
	require.NoError(t, err)
	require.Equal(t, consumergroup.Active, h.State, "a DEAD group resurrected")
	code, out = postJSON(t, api+"/groups/billing/cancel", nil)
	require.Equal(t, http.StatusOK, code, out)
	h, err = f.admin.Group(ctx, "events", "billing")
	require.NoError(t, err)
	require.Equal(t, consumergroup.Cancelled, h.State)
	code, out = postJSON(t, api+"/groups/billing/remove", nil)
	require.Equal(t, http.StatusOK, code, out)
	_, err = f.admin.Group(ctx, "events", "billing")
	require.ErrorIs(t, err, outbox.ErrNotFound)
	code, _ = postJSON(t, api+"/groups/billing/remove", nil)
	require.Equal(t, http.StatusNotFound, code)
	code, out = postJSON(t, api+"/groups/x/explode", nil)
	require.Equal(t, http.StatusBadRequest, code, out)

	for _, path := range []string{"/api/check", "/api/storage"} {
		resp, err := http.Get(srv.URL + path)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, path)
		var v any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&v))
		resp.Body.Close()
	}
	resp, err := http.Get(srv.URL + "/api/storage")
	require.NoError(t, err)
	var storage struct {
		Partitions int `json:"partitions"`
		Topics     []struct {
			Topic         string  `json:"topic"`
			Stored        int64   `json:"stored"`
			OldestSeconds float64 `json:"oldest_seconds"`
		} `json:"topics"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&storage))
	resp.Body.Close()
	require.Positive(t, storage.Partitions)
	require.NotEmpty(t, storage.Topics)

	ro := f.serve(t, adminui.Config{}, nil)
	code, _ = postJSON(t, ro.URL+"/api/topics/events/groups/billing/cancel", nil)
	require.Equal(t, http.StatusForbidden, code)
}

// In a real browser: force-complete, a mode change, cancel and remove ask
// first and run once confirmed; Back leaves everything as it was.
func TestInBrowserGroupActions(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	srv := f.serve(t, adminui.Config{Writable: true, CacheFor: -1}, nil)
	ctx := context.Background()
	b := newBrowser(t)

	b.open(srv.URL + "/topics/events/groups/billing")
	b.fill("#older-than", "1h")
	b.click("#force-complete")
	b.waitFor("#confirm-action")
	require.Contains(t, b.text("#confirm-action"), "Mark every message")
	b.click("#confirm")
	b.waitFor("#done")
	require.Equal(t, "force-completed 0 messages", b.text("#done"))

	b.open(srv.URL + "/topics/events")
	b.click(`#mode option[value="OFFSET"]`)
	b.click("#change-mode")
	b.waitFor("#confirm-action")
	b.click("#cancel")
	b.waitFor("#mode-form")
	topic, err := f.admin.Topic(ctx, "events")
	require.NoError(t, err)
	require.Equal(t, outbox.Counter, topic.Tracking, "Back changed nothing")
	b.click(`#mode option[value="OFFSET"]`)
	b.click("#change-mode")
	b.waitFor("#confirm-action")
	b.click("#confirm")
	b.waitFor("#done")
	require.Equal(t, "mode changed", b.text("#done"))
	topic, err = f.admin.Topic(ctx, "events")
	require.NoError(t, err)
	require.Equal(t, outbox.Offset, topic.Tracking)

	b.open(srv.URL + "/topics/events/groups/billing")
	b.click("#pause")
	b.waitFor("#done")
	require.Equal(t, "PAUSED", b.text("#state"))
	b.click("#resume")
	b.waitFor("#done")
	require.Equal(t, "ACTIVE", b.text("#state"))

	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, f.group.Stop(stopCtx))
	f.declareDead(t, "events", "billing")
	b.open(srv.URL + "/topics/events/groups/billing")
	require.Equal(t, "DEAD", b.text("#state"))
	b.click("#resurrect")
	b.waitFor("#done")
	require.Equal(t, "resurrected", b.text("#done"))
	require.Equal(t, "ACTIVE", b.text("#state"))
	b.click("#cancel-group")
	b.waitFor("#confirm-action")
	b.click("#confirm")
	b.waitFor("#done")
	require.Equal(t, "cancelled", b.text("#done"))
	require.Equal(t, "CANCELLED", b.text("#state"))
	b.click("#remove")
	b.waitFor("#confirm-action")
	b.click("#confirm")
	b.waitFor("#done")
	require.Equal(t, "removed", b.text("#done"))
	_, err = f.admin.Group(ctx, "events", "billing")
	require.ErrorIs(t, err, outbox.ErrNotFound)
}

// declareDead makes a stopped group's heartbeats an hour old and has
// maintenance declare it DEAD, as it would an hour later.
func (f *fixture) declareDead(t *testing.T, topic, group string) {
	t.Helper()
	ctx := context.Background()
	_, err := f.db.Pool.Exec(ctx, fmt.Sprintf(`UPDATE %q.outbox_topic_subscriptions SET last_heartbeat_at = now() - interval '1 hour'
		WHERE topic = $1 AND group_name = $2`, f.db.Schema), topic, group)
	require.NoError(t, err)
	m, err := consumergroup.NewMaintainer(f.db.Pool, f.client)
	require.NoError(t, err)
	dead, err := m.DetectDead(ctx, topic)
	require.NoError(t, err)
	require.Equal(t, []string{group}, dead)
}
