package adminui

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/router"
)

// The reads, shared by the pages and the API (cached).

func (u *ui) topics(ctx context.Context) ([]admin.Topic, error) {
	return get(&u.cache, "topics", func() ([]admin.Topic, error) { return u.cfg.Admin.Topics(ctx) })
}

func (u *ui) topic(ctx context.Context, name string) (admin.Topic, error) {
	return get(&u.cache, "topic\x00"+name, func() (admin.Topic, error) { return u.cfg.Admin.Topic(ctx, name) })
}

func (u *ui) groups(ctx context.Context, topic string) ([]consumergroup.Health, error) {
	return get(&u.cache, "groups\x00"+topic, func() ([]consumergroup.Health, error) { return u.cfg.Admin.Groups(ctx, topic) })
}

func (u *ui) group(ctx context.Context, topic, group string) (consumergroup.Health, error) {
	return get(&u.cache, "group\x00"+topic+"\x00"+group, func() (consumergroup.Health, error) {
		return u.cfg.Admin.Group(ctx, topic, group)
	})
}

// deadLetterPage is the most dead letters a page or API call lists.
const deadLetterPage = 100

func (u *ui) deadLetters(ctx context.Context, topic, group string, after int64, limit int) ([]admin.DeadLetterView, error) {
	dls, err := u.cfg.Admin.DeadLetters(ctx, topic, group, after, limit)
	if err != nil {
		return nil, err
	}
	out := make([]admin.DeadLetterView, len(dls))
	for i, d := range dls {
		if u.cfg.Redact != nil { // last errors and message groups may hold personal data too
			d = u.cfg.Redact(d)
		}
		out[i] = admin.View(d, u.cfg.ShowPayloads)
	}
	return out, nil
}

// The actions, shared by the forms and the API.

// deadLetterAction replays or purges the dead letters ids, or, with all
// and no ids, every one there. Purging all needs all: an empty list alone
// never deletes anything.
func (u *ui) deadLetterAction(ctx context.Context, topic, action, group string, ids []int64, all bool) (int64, error) {
	if !u.cfg.Writable {
		return 0, ErrReadOnly
	}
	if len(ids) > 0 && all {
		return 0, fmt.Errorf("%w: give ids or all, not both", errBadInput)
	}
	if len(ids) == 0 && !all {
		return 0, fmt.Errorf("%w: no dead letter named (give ids, or all to take every one)", errBadInput)
	}
	defer u.cache.clear()
	var n int64
	var err error
	switch action {
	case "replay":
		n, err = u.cfg.Admin.ReplayDeadLetters(ctx, topic, group, ids...)
	case "purge":
		n, err = u.cfg.Admin.PurgeDeadLetters(ctx, topic, group, ids...)
	default:
		return 0, fmt.Errorf("%w: unknown action %q (replay or purge)", errBadInput, action)
	}
	if err != nil && n > 0 { // the others were done: say so
		err = fmt.Errorf("%sed %d; %w", action, n, err)
	}
	return n, err
}

func (u *ui) groupAction(ctx context.Context, topic, group, action string) error {
	if !u.cfg.Writable {
		return ErrReadOnly
	}
	defer u.cache.clear()
	switch action {
	case "pause":
		return u.cfg.Admin.PauseGroup(ctx, topic, group)
	case "resume":
		return u.cfg.Admin.ResumeGroup(ctx, topic, group)
	}
	return fmt.Errorf("%w: unknown action %q (pause or resume)", errBadInput, action)
}

// Pages.

// RouterView is a router's pools and warnings.
type RouterView struct {
	Pools    []router.PoolStats `json:"pools"`
	Warnings []router.Warning   `json:"warnings"`
}

func (u *ui) routers() []RouterView {
	out := make([]RouterView, len(u.cfg.Routers))
	for i, r := range u.cfg.Routers {
		out[i] = RouterView{Pools: r.Pools(), Warnings: r.Warnings()}
	}
	return out
}

func (u *ui) render(w http.ResponseWriter, r *http.Request, page string, code int, data map[string]any) {
	data["Prefix"] = u.cfg.Prefix
	data["Writable"] = u.cfg.Writable
	data["ShowPayloads"] = u.cfg.ShowPayloads
	data["Done"] = doneMessage(r.URL.Query())
	var buf bytes.Buffer
	if err := u.pages[page].Execute(&buf, data); err != nil {
		u.cfg.Logger.Error("pgoutbox admin UI: rendering a page failed", "page", page, "error", err)
		http.Error(w, "rendering the page failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	_, _ = buf.WriteTo(w)
}

// doneMessage is the banner after an action: built from a known action
// and a count, so a link cannot make the page say anything else.
func doneMessage(q url.Values) string {
	n, err := strconv.ParseInt(q.Get("n"), 10, 64)
	switch action := q.Get("done"); action {
	case "replay", "purge":
		if err == nil && n >= 0 {
			return fmt.Sprintf("%sed %d dead letters", action, n)
		}
	case "pause", "resume":
		return action + "d"
	}
	return ""
}

func (u *ui) pageError(w http.ResponseWriter, r *http.Request, err error) {
	code := status(err)
	if code == http.StatusInternalServerError {
		u.cfg.Logger.Error("pgoutbox admin UI: a request failed", "path", r.URL.Path, "error", err)
	}
	u.render(w, r, "error", code, map[string]any{"Title": http.StatusText(code), "Status": code, "Error": clientMessage(code, err)})
}

func (u *ui) topicsPage(w http.ResponseWriter, r *http.Request) {
	topics, err := u.topics(r.Context())
	if err != nil {
		u.pageError(w, r, err)
		return
	}
	u.render(w, r, "topics", http.StatusOK, map[string]any{"Title": "Topics", "Topics": topics, "Routers": u.routers()})
}

func (u *ui) topicPage(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("topic")
	t, err := u.topic(r.Context(), name)
	if err != nil {
		u.pageError(w, r, err)
		return
	}
	data := map[string]any{"Title": name, "Topic": t, "TopicName": name, "GroupName": ""}
	if t.Semantics == outbox.PubSub {
		data["Groups"], err = u.groups(r.Context(), name)
	} else {
		data["DeadLetters"], err = u.deadLetters(r.Context(), name, "", 0, deadLetterPage)
	}
	if err != nil {
		u.pageError(w, r, err)
		return
	}
	u.render(w, r, "topic", http.StatusOK, data)
}

func (u *ui) groupPage(w http.ResponseWriter, r *http.Request) {
	topic, group := r.PathValue("topic"), r.PathValue("group")
	h, err := u.group(r.Context(), topic, group)
	if err != nil {
		u.pageError(w, r, err)
		return
	}
	dls, err := u.deadLetters(r.Context(), topic, group, 0, deadLetterPage)
	if err != nil {
		u.pageError(w, r, err)
		return
	}
	u.render(w, r, "group", http.StatusOK, map[string]any{"Title": group + " on " + topic, "Health": h, "DeadLetters": dls,
		"TopicName": topic, "GroupName": group})
}

// deadLettersForm handles a page's replay or purge button: the form's
// group and ids (none: every dead letter there), then back to the page.
func (u *ui) deadLettersForm(w http.ResponseWriter, r *http.Request) {
	topic, action := r.PathValue("topic"), r.PathValue("action")
	if !u.cfg.Writable {
		u.pageError(w, r, ErrReadOnly)
		return
	}
	if err := r.ParseForm(); err != nil {
		u.pageError(w, r, fmt.Errorf("%w: %v", errBadInput, err))
		return
	}
	ids, err := parseIDs(r.PostForm["id"])
	if err != nil {
		u.pageError(w, r, err)
		return
	}
	group := r.PostForm.Get("group")
	n, err := u.deadLetterAction(r.Context(), topic, action, group, ids, r.PostForm.Get("all") == "true")
	if err != nil {
		u.pageError(w, r, err)
		return
	}
	back := u.path("topics", topic)
	if group != "" {
		back = u.path("topics", topic, "groups", group)
	}
	http.Redirect(w, r, back+"?done="+action+"&n="+strconv.FormatInt(n, 10), http.StatusSeeOther)
}

func (u *ui) groupForm(w http.ResponseWriter, r *http.Request) {
	topic, group, action := r.PathValue("topic"), r.PathValue("group"), r.PathValue("action")
	if err := u.groupAction(r.Context(), topic, group, action); err != nil {
		u.pageError(w, r, err)
		return
	}
	http.Redirect(w, r, u.path("topics", topic, "groups", group)+"?done="+action, http.StatusSeeOther)
}

func parseIDs(ss []string) ([]int64, error) {
	ids := make([]int64, 0, len(ss))
	for _, s := range ss {
		id, err := strconv.ParseInt(s, 10, 64)
		if err != nil || id < 1 {
			return nil, fmt.Errorf("%w: %q is not a message id", errBadInput, s)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// clientMessage is what a client is told of err: the error itself for a
// 4xx, which says what was wrong with the request; for a 500 only that it
// failed (the details, which may name tables and queries, go to the log).
func clientMessage(code int, err error) string {
	if code >= 500 {
		return "the request failed; the server's log says why"
	}
	return err.Error()
}

// The JSON API.

func (u *ui) writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func (u *ui) apiError(w http.ResponseWriter, r *http.Request, err error) {
	code := status(err)
	if code == http.StatusInternalServerError {
		u.cfg.Logger.Error("pgoutbox admin UI: a request failed", "path", r.URL.Path, "error", err)
	}
	u.writeJSON(w, code, map[string]string{"error": clientMessage(code, err)})
}

// reply writes v, or the error.
func reply[T any](u *ui, w http.ResponseWriter, r *http.Request, v T, err error) {
	if err != nil {
		u.apiError(w, r, err)
		return
	}
	u.writeJSON(w, http.StatusOK, v)
}

func (u *ui) apiTopics(w http.ResponseWriter, r *http.Request) {
	v, err := u.topics(r.Context())
	reply(u, w, r, v, err)
}

func (u *ui) apiTopic(w http.ResponseWriter, r *http.Request) {
	v, err := u.topic(r.Context(), r.PathValue("topic"))
	reply(u, w, r, v, err)
}

func (u *ui) apiGroups(w http.ResponseWriter, r *http.Request) {
	v, err := u.groups(r.Context(), r.PathValue("topic"))
	reply(u, w, r, v, err)
}

func (u *ui) apiGroup(w http.ResponseWriter, r *http.Request) {
	v, err := u.group(r.Context(), r.PathValue("topic"), r.PathValue("group"))
	reply(u, w, r, v, err)
}

func (u *ui) apiDeadLetters(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	after, limit := int64(0), deadLetterPage
	var err error
	if s := q.Get("after"); s != "" {
		if after, err = strconv.ParseInt(s, 10, 64); err != nil || after < 0 {
			u.apiError(w, r, fmt.Errorf("%w: after=%q is not a message id", errBadInput, s))
			return
		}
	}
	if s := q.Get("limit"); s != "" {
		if limit, err = strconv.Atoi(s); err != nil || limit < 1 || limit > 1000 {
			u.apiError(w, r, fmt.Errorf("%w: limit=%q: 1 to 1000", errBadInput, s))
			return
		}
	}
	v, err := u.deadLetters(r.Context(), r.PathValue("topic"), q.Get("group"), after, limit)
	reply(u, w, r, v, err)
}

// actionRequest is the body of a dead-letter action.
type actionRequest struct {
	Group string  `json:"group"`
	IDs   []int64 `json:"ids"`
	All   bool    `json:"all"` // every dead letter there (with no ids)
}

func (u *ui) apiDeadLettersAction(w http.ResponseWriter, r *http.Request) {
	if !u.cfg.Writable {
		u.apiError(w, r, ErrReadOnly)
		return
	}
	var req actionRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		u.apiError(w, r, fmt.Errorf("%w: body: %v", errBadInput, err))
		return
	}
	for _, id := range req.IDs {
		if id < 1 {
			u.apiError(w, r, fmt.Errorf("%w: %d is not a message id", errBadInput, id))
			return
		}
	}
	action := r.PathValue("action")
	n, err := u.deadLetterAction(r.Context(), r.PathValue("topic"), action, req.Group, req.IDs, req.All)
	reply(u, w, r, map[string]int64{action + "ed": n}, err)
}

func (u *ui) apiGroupAction(w http.ResponseWriter, r *http.Request) {
	action := r.PathValue("action")
	err := u.groupAction(r.Context(), r.PathValue("topic"), r.PathValue("group"), action)
	reply(u, w, r, map[string]string{"done": action}, err)
}

func (u *ui) apiRouters(w http.ResponseWriter, r *http.Request) {
	u.writeJSON(w, http.StatusOK, u.routers())
}
