package adminui

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

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

// blockedPage is the most blocked message groups a page lists per topic
// or group, and an API call by default.
const blockedPage = outbox.DefaultBlockedGroupsPage

// blocked reads every ordered topic's and group's blocked message groups.
func (u *ui) blocked(ctx context.Context) ([]admin.Blocked, error) {
	bs, err := get(&u.cache, "blocked", func() ([]admin.Blocked, error) { return u.cfg.Admin.Blocked(ctx, blockedPage) })
	out := make([]admin.Blocked, len(bs))
	for i, b := range bs {
		out[i] = b
		out[i].BlockedGroup = u.redactBlocked(b.Topic, b.BlockedGroup)
	}
	return out, err
}

// topicBlocked reads the blocked message groups of a topic, up to limit
// of each of its groups (admin.Admin.TopicBlocked), through Config.Redact.
func (u *ui) topicBlocked(ctx context.Context, topic string, limit int) ([]admin.Blocked, error) {
	bs, err := get(&u.cache, fmt.Sprintf("topicblocked\x00%s\x00%d", topic, limit), func() ([]admin.Blocked, error) {
		return u.cfg.Admin.TopicBlocked(ctx, topic, limit)
	})
	out := make([]admin.Blocked, len(bs))
	for i, b := range bs {
		out[i] = b
		out[i].BlockedGroup = u.redactBlocked(b.Topic, b.BlockedGroup)
	}
	return out, err
}

// blockedGroups reads a QUEUE topic's blocked message groups (group ""),
// or a group's.
func (u *ui) blockedGroups(ctx context.Context, topic, group string, limit int) ([]outbox.BlockedGroup, error) {
	key := fmt.Sprintf("blocked\x00%s\x00%s\x00%d", topic, group, limit)
	bs, err := get(&u.cache, key, func() ([]outbox.BlockedGroup, error) {
		return u.cfg.Admin.BlockedGroups(ctx, topic, group, limit)
	})
	out := make([]outbox.BlockedGroup, len(bs))
	for i, b := range bs {
		out[i] = u.redactBlocked(topic, b)
	}
	return out, err
}

// redactBlocked passes a blocked message group's name and last error,
// which may hold personal data as a dead letter's do, through
// Config.Redact as the head's dead letter.
func (u *ui) redactBlocked(topic string, b outbox.BlockedGroup) outbox.BlockedGroup {
	if u.cfg.Redact == nil {
		return b
	}
	d := u.cfg.Redact(outbox.DeadLetter{Delivery: outbox.Delivery{ID: b.HeadID, Topic: topic, Group: b.Group},
		LastError: b.LastError})
	b.Group, b.LastError = d.Group, d.LastError
	return b
}

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
		n, err = u.cfg.Admin.DiscardDeadLetters(ctx, topic, group, ids...)
	default:
		return 0, fmt.Errorf("%w: unknown action %q (replay or purge)", errBadInput, action)
	}
	if err != nil && n > 0 { // the others were done: say so
		err = fmt.Errorf("%s %d; %w", pastTense[action], n, err)
	}
	return n, err
}

// pastTense names what an action did.
var pastTense = map[string]string{"replay": "replayed", "purge": "purged", "pause": "paused", "resume": "resumed",
	"cancel": "cancelled", "remove": "removed", "resurrect": "resurrected", "force-complete": "force-completed", "mode": "mode changed"}

// destructive are the group actions a page asks to confirm: they cannot
// be undone.
var destructive = map[string]string{
	"cancel":         "Cancel the subscription for good: the group stops receiving messages, and its instances stop. It cannot be resumed.",
	"remove":         "Delete the group's subscription and everything it holds (retries, dead letters, position). Its instances stop.",
	"force-complete": "Mark every message the group has not finished that is older than the given age as finished: they are never delivered to it.",
}

// groupParams are what a group action takes besides the names.
type groupParams struct {
	// Backfill (resurrect): deliver what the group missed while DEAD
	// (default true).
	Backfill *bool `json:"backfill,omitempty"`
	// OlderThanSeconds (force-complete, required): the age past which
	// unfinished messages are marked finished.
	OlderThanSeconds float64 `json:"older_than_seconds,omitempty"`
}

// groupAction runs action on a group; force-complete returns how many
// messages it completed.
func (u *ui) groupAction(ctx context.Context, topic, group, action string, p groupParams) (int64, error) {
	if !u.cfg.Writable {
		return 0, ErrReadOnly
	}
	defer u.cache.clear()
	a := u.cfg.Admin
	switch action {
	case "pause":
		return 0, a.PauseGroup(ctx, topic, group)
	case "resume":
		return 0, a.ResumeGroup(ctx, topic, group)
	case "cancel":
		return 0, a.CancelGroup(ctx, topic, group)
	case "remove":
		return 0, a.RemoveGroup(ctx, topic, group)
	case "resurrect":
		return 0, a.ResurrectGroup(ctx, topic, group, p.Backfill == nil || *p.Backfill)
	case "force-complete":
		if !(p.OlderThanSeconds > 0) {
			return 0, fmt.Errorf("%w: force-complete needs older_than_seconds above 0", errBadInput)
		}
		return a.ForceComplete(ctx, topic, group, time.Duration(p.OlderThanSeconds*float64(time.Second)))
	}
	return 0, fmt.Errorf("%w: unknown action %q (pause, resume, cancel, remove, resurrect or force-complete)", errBadInput, action)
}

// changeMode changes a PUB_SUB topic's tracking mode.
func (u *ui) changeMode(ctx context.Context, topic, mode string) error {
	if !u.cfg.Writable {
		return ErrReadOnly
	}
	defer u.cache.clear()
	return u.cfg.Admin.ChangeMode(ctx, topic, outbox.TrackingMode(strings.ToUpper(mode)))
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
	data["Done"] = u.takeFlash(w, r)
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

// The banner after an action (post, redirect, get): the action's
// response sets a cookie saying what it did, and the page it redirects to
// shows it once and clears it. A reload shows no banner, and a link
// cannot make one (it was a query parameter: "?done=purge&n=999999" said
// "purged 999999 dead letters").
const flashCookie = "pgoutbox_done"

// setFlash records what an action did for the next page: a known action
// and, for dead letters, how many.
func (u *ui) setFlash(w http.ResponseWriter, action string, n int64) {
	http.SetCookie(w, &http.Cookie{Name: flashCookie, Value: action + "." + strconv.FormatInt(n, 10),
		Path: u.path(), MaxAge: 60, HttpOnly: true, SameSite: http.SameSiteStrictMode})
}

// takeFlash returns the banner of the action the request comes from, if
// any, and clears it.
func (u *ui) takeFlash(w http.ResponseWriter, r *http.Request) string {
	c, err := r.Cookie(flashCookie)
	if err != nil {
		return ""
	}
	http.SetCookie(w, &http.Cookie{Name: flashCookie, Path: u.path(), MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	return doneMessage(c.Value)
}

// doneMessage is the banner of a flash value: built from a known action
// and a count, so it says nothing else.
func doneMessage(v string) string {
	action, count, _ := strings.Cut(v, ".")
	n, err := strconv.ParseInt(count, 10, 64)
	switch action {
	case "replay", "purge":
		if err == nil && n >= 0 {
			return fmt.Sprintf("%s %d dead letters", pastTense[action], n)
		}
	case "pause", "resume", "cancel", "remove", "resurrect", "mode":
		return pastTense[action]
	case "force-complete":
		if err == nil && n >= 0 {
			return fmt.Sprintf("force-completed %d messages", n)
		}
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
	blocked, err := u.blocked(r.Context())
	if err != nil {
		u.pageError(w, r, err)
		return
	}
	clusters, err := u.clusters(r.Context())
	if err != nil {
		u.pageError(w, r, err)
		return
	}
	u.render(w, r, "topics", http.StatusOK, map[string]any{"Title": "Topics", "Topics": topics, "Blocked": blocked,
		"Routers": u.routers(), "Clusters": clusters})
}

func (u *ui) topicPage(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("topic")
	t, err := u.topic(r.Context(), name)
	if err != nil {
		u.pageError(w, r, err)
		return
	}
	data := map[string]any{"Title": name, "Topic": t, "TopicName": name, "GroupName": "", "Ordered": t.Ordered,
		"Charts": u.charts(name, "")}
	if t.Semantics == outbox.PubSub {
		data["Groups"], err = u.groups(r.Context(), name)
		if err == nil && t.Ordered {
			data["Blocked"], err = u.topicBlocked(r.Context(), name, blockedPage)
		}
	} else {
		data["DeadLetters"], err = u.deadLetters(r.Context(), name, "", 0, deadLetterPage)
		if err == nil {
			data["Blocked"], err = u.blockedGroups(r.Context(), name, "", blockedPage)
		}
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
	t, err := u.topic(r.Context(), topic)
	if err != nil {
		u.pageError(w, r, err)
		return
	}
	var blocked []outbox.BlockedGroup
	if t.Ordered {
		if blocked, err = u.blockedGroups(r.Context(), topic, group, blockedPage); err != nil {
			u.pageError(w, r, err)
			return
		}
	}
	u.render(w, r, "group", http.StatusOK, map[string]any{"Title": group + " on " + topic, "Health": h, "DeadLetters": dls,
		"TopicName": topic, "GroupName": group, "Ordered": t.Ordered, "Blocked": blocked, "Charts": u.charts(topic, group)})
}

// messagePage answers, for ?id=, which groups finished a message of the
// topic and where the others stand (admin.Admin.MessageGroups).
func (u *ui) messagePage(w http.ResponseWriter, r *http.Request) {
	topic := r.PathValue("topic")
	id, err := messageID(r.URL.Query().Get("id"))
	if err != nil {
		u.pageError(w, r, err)
		return
	}
	gs, err := u.messageGroups(r.Context(), topic, id)
	if err != nil {
		u.pageError(w, r, err)
		return
	}
	u.render(w, r, "message", http.StatusOK, map[string]any{"Title": fmt.Sprintf("message %d of %s", id, topic),
		"TopicName": topic, "ID": id, "Groups": gs})
}

// checksPage shows what waits longer than ?older_than= (a Go duration,
// default an hour), what the log keeps, and the consistency check.
func (u *ui) checksPage(w http.ResponseWriter, r *http.Request) {
	olderThan := DefaultStuckBound
	if v := r.URL.Query().Get("older_than"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			u.pageError(w, r, fmt.Errorf("%w: older than %q is not a duration such as 15m", errBadInput, v))
			return
		}
		olderThan = d
	}
	ctx := r.Context()
	stuck, err := get(&u.cache, "stuck\x00"+olderThan.String(), func() (admin.Stuck, error) { return u.cfg.Admin.Stuck(ctx, olderThan) })
	if err != nil {
		u.pageError(w, r, err)
		return
	}
	storage, err := get(&u.cache, "storage", func() (admin.Storage, error) { return u.cfg.Admin.Storage(ctx) })
	if err != nil {
		u.pageError(w, r, err)
		return
	}
	check, err := get(&u.cache, "check", func() ([]consumergroup.Inconsistency, error) { return u.cfg.Admin.Inconsistencies(ctx) })
	if err != nil {
		u.pageError(w, r, err)
		return
	}
	u.render(w, r, "checks", http.StatusOK, map[string]any{"Title": "Checks", "Stuck": stuck, "OlderThan": olderThan.String(),
		"Storage": storage, "Inconsistencies": check})
}

// messageID reads a message id.
func messageID(v string) (int64, error) {
	id, err := strconv.ParseInt(v, 10, 64)
	if err != nil || id <= 0 {
		return 0, fmt.Errorf("%w: %q is not a message id", errBadInput, v)
	}
	return id, nil
}

// messageGroups reads where each group stands with a message (never
// cached: it is one indexed read); last errors go through Config.Redact
// as the message's dead letter.
func (u *ui) messageGroups(ctx context.Context, topic string, id int64) ([]admin.MessageGroup, error) {
	gs, err := u.cfg.Admin.MessageGroups(ctx, topic, id)
	for i, g := range gs {
		if u.cfg.Redact != nil && g.LastError != "" {
			gs[i].LastError = u.cfg.Redact(outbox.DeadLetter{Delivery: outbox.Delivery{ID: id, Topic: topic},
				LastError: g.LastError}).LastError
		}
	}
	return gs, err
}

// historyView is a topic's or group's charts in the JSON API.
type historyView struct {
	EverySeconds float64  `json:"every_seconds"`
	SpanSeconds  float64  `json:"span_seconds"`
	Series       []Series `json:"series"`
}

// apiHistory serves a topic's or group's readings (404 without a
// History, or for a topic or group it has not read).
func (u *ui) apiHistory(w http.ResponseWriter, r *http.Request) {
	h := u.cfg.History
	if h == nil {
		u.apiError(w, r, fmt.Errorf("%w: charts are off (Config.History is not set)", outbox.ErrNotFound))
		return
	}
	series := h.Of(r.PathValue("topic"), r.PathValue("group"))
	if len(series) == 0 {
		u.apiError(w, r, fmt.Errorf("%w: no readings of %q", outbox.ErrNotFound, r.PathValue("topic")+"/"+r.PathValue("group")))
		return
	}
	u.writeJSON(w, http.StatusOK, historyView{EverySeconds: h.cfg.Every.Seconds(), SpanSeconds: h.cfg.Span.Seconds(), Series: series})
}

// deadLettersForm handles a page's replay or purge button: the form's
// group and ids (none: every dead letter there), then back to the page.
// A purge first shows what it would delete and asks to confirm (a form
// that posts again with confirm=yes).
func (u *ui) deadLettersForm(w http.ResponseWriter, r *http.Request) {
	topic, action := r.PathValue("topic"), r.PathValue("action")
	if !u.cfg.Writable {
		u.pageError(w, r, ErrReadOnly)
		return
	}
	if err := parseForm(w, r); err != nil {
		u.pageError(w, r, err)
		return
	}
	ids, err := parseIDs(r.PostForm["id"])
	if err != nil {
		u.pageError(w, r, err)
		return
	}
	group, all := r.PostForm.Get("group"), r.PostForm.Get("all") == "true"
	back := u.path("topics", topic)
	if group != "" {
		back = u.path("topics", topic, "groups", group)
	}
	if action == "purge" && r.PostForm.Get("confirm") != "yes" {
		u.confirmPurge(w, r, topic, group, ids, all, back)
		return
	}
	n, err := u.deadLetterAction(r.Context(), topic, action, group, ids, all)
	if err != nil {
		u.pageError(w, r, err)
		return
	}
	u.setFlash(w, action, n)
	http.Redirect(w, r, back, http.StatusSeeOther)
}

// confirmPurge shows what a purge would delete, with a button that
// purges and a link back, once the request names dead letters of a topic
// or group that exists.
func (u *ui) confirmPurge(w http.ResponseWriter, r *http.Request, topic, group string, ids []int64, all bool, back string) {
	if len(ids) > 0 && all {
		u.pageError(w, r, fmt.Errorf("%w: give ids or all, not both", errBadInput))
		return
	}
	if len(ids) == 0 && !all {
		u.pageError(w, r, fmt.Errorf("%w: no dead letter named (give ids, or all to take every one)", errBadInput))
		return
	}
	if _, err := u.cfg.Admin.DeadLetters(r.Context(), topic, group, 0, 1); err != nil { // the names exist
		u.pageError(w, r, err)
		return
	}
	u.render(w, r, "confirm", http.StatusOK, map[string]any{"Title": "Purge dead letters?", "TopicName": topic,
		"GroupName": group, "IDs": ids, "All": all, "Back": back})
}

func (u *ui) groupForm(w http.ResponseWriter, r *http.Request) {
	topic, group, action := r.PathValue("topic"), r.PathValue("group"), r.PathValue("action")
	if err := parseForm(w, r); err != nil {
		u.pageError(w, r, err)
		return
	}
	var p groupParams
	if v := r.PostForm.Get("older_than"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			u.pageError(w, r, fmt.Errorf("%w: older than %q: %v", errBadInput, v, err))
			return
		}
		p.OlderThanSeconds = d.Seconds()
	}
	if v := r.PostForm.Get("backfill"); v != "" {
		b := v == "yes"
		p.Backfill = &b
	}
	if why, ok := destructive[action]; ok && r.PostForm.Get("confirm") != "yes" {
		if _, err := u.cfg.Admin.Group(r.Context(), topic, group); err != nil { // the names exist
			u.pageError(w, r, err)
			return
		}
		u.render(w, r, "confirmgroup", http.StatusOK, map[string]any{"Title": "Confirm", "TopicName": topic, "GroupName": group,
			"Action": action, "Why": why, "OlderThan": r.PostForm.Get("older_than"), "Back": u.path("topics", topic, "groups", group)})
		return
	}
	n, err := u.groupAction(r.Context(), topic, group, action, p)
	if err != nil {
		u.pageError(w, r, err)
		return
	}
	u.setFlash(w, action, n)
	back := u.path("topics", topic, "groups", group)
	if action == "remove" {
		back = u.path("topics", topic)
	}
	http.Redirect(w, r, back, http.StatusSeeOther)
}

// modeForm changes a topic's tracking mode, once confirmed.
func (u *ui) modeForm(w http.ResponseWriter, r *http.Request) {
	topic := r.PathValue("topic")
	if err := parseForm(w, r); err != nil {
		u.pageError(w, r, err)
		return
	}
	mode := r.PostForm.Get("mode")
	if r.PostForm.Get("confirm") != "yes" {
		if _, err := u.cfg.Admin.Topic(r.Context(), topic); err != nil {
			u.pageError(w, r, err)
			return
		}
		u.render(w, r, "confirmmode", http.StatusOK, map[string]any{"Title": "Confirm", "TopicName": topic, "Mode": strings.ToUpper(mode),
			"Back": u.path("topics", topic)})
		return
	}
	if err := u.changeMode(r.Context(), topic, mode); err != nil {
		u.pageError(w, r, err)
		return
	}
	u.setFlash(w, "mode", 0)
	http.Redirect(w, r, u.path("topics", topic), http.StatusSeeOther)
}

// maxBody is the largest request body an action takes: a form or a JSON
// body naming dead letters (1 MiB holds some 50,000 ids).
const maxBody = 1 << 20

// errTooLarge is the error of a request body over maxBody.
var errTooLarge = errors.New("adminui: request body too large")

// bodyError is the error of reading a request body: errTooLarge past
// maxBody, else bad input.
func bodyError(err error) error {
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return fmt.Errorf("%w: more than %d bytes", errTooLarge, tooLarge.Limit)
	}
	return fmt.Errorf("%w: body: %v", errBadInput, err)
}

// parseForm parses a posted form of at most maxBody bytes.
func parseForm(w http.ResponseWriter, r *http.Request) error {
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	if err := r.ParseForm(); err != nil {
		return bodyError(err)
	}
	return nil
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
	if limit, err = queryLimit(q, limit); err != nil {
		u.apiError(w, r, err)
		return
	}
	v, err := u.deadLetters(r.Context(), r.PathValue("topic"), q.Get("group"), after, limit)
	reply(u, w, r, v, err)
}

// queryLimit reads a list's ?limit= (1 to 1000), def when it has none.
func queryLimit(q url.Values, def int) (int, error) {
	s := q.Get("limit")
	if s == "" {
		return def, nil
	}
	limit, err := strconv.Atoi(s)
	if err != nil || limit < 1 || limit > 1000 {
		return 0, fmt.Errorf("%w: limit=%q: 1 to 1000", errBadInput, s)
	}
	return limit, nil
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
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		u.apiError(w, r, bodyError(err))
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
	reply(u, w, r, map[string]int64{pastTense[action]: n}, err)
}

func (u *ui) apiGroupAction(w http.ResponseWriter, r *http.Request) {
	action := r.PathValue("action")
	var p groupParams
	if err := decodeOptional(w, r, &p); err != nil {
		u.apiError(w, r, err)
		return
	}
	n, err := u.groupAction(r.Context(), r.PathValue("topic"), r.PathValue("group"), action, p)
	out := map[string]any{"done": action}
	if action == "force-complete" {
		out["completed"] = n
	}
	reply(u, w, r, out, err)
}

// apiMode changes a topic's tracking mode: {"mode": "counter"}.
func (u *ui) apiMode(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Mode string `json:"mode"`
	}
	if err := decodeOptional(w, r, &req); err != nil {
		u.apiError(w, r, err)
		return
	}
	err := u.changeMode(r.Context(), r.PathValue("topic"), req.Mode)
	reply(u, w, r, map[string]string{"done": "mode", "mode": strings.ToUpper(req.Mode)}, err)
}

// apiStuck lists the QUEUE topics and groups whose oldest waiting
// message is older than ?older_than_seconds= (default an hour; see
// admin.Admin.Stuck).
func (u *ui) apiStuck(w http.ResponseWriter, r *http.Request) {
	olderThan, err := stuckBound(r.URL.Query().Get("older_than_seconds"))
	if err != nil {
		u.apiError(w, r, err)
		return
	}
	v, err := u.cfg.Admin.Stuck(r.Context(), olderThan)
	reply(u, w, r, v, err)
}

// DefaultStuckBound is how long a message waits before the stuck list
// shows it, when the request does not say.
const DefaultStuckBound = time.Hour

// stuckBound reads a bound in seconds ("" is DefaultStuckBound).
func stuckBound(v string) (time.Duration, error) {
	if v == "" {
		return DefaultStuckBound, nil
	}
	secs, err := strconv.ParseFloat(v, 64)
	if err != nil || secs < 0 || math.IsInf(secs, 0) || math.IsNaN(secs) {
		return 0, fmt.Errorf("%w: older_than_seconds %q is not a number of seconds", errBadInput, v)
	}
	return time.Duration(secs * float64(time.Second)), nil
}

// apiCheck lists the stored messages whose completion records do not add
// up (admin.Admin.Inconsistencies; an empty list when all do).
func (u *ui) apiCheck(w http.ResponseWriter, r *http.Request) {
	v, err := u.cfg.Admin.Inconsistencies(r.Context())
	if v == nil {
		v = []consumergroup.Inconsistency{}
	}
	reply(u, w, r, v, err)
}

// apiStorage says what the message log keeps (admin.Admin.Storage).
func (u *ui) apiStorage(w http.ResponseWriter, r *http.Request) {
	v, err := u.cfg.Admin.Storage(r.Context())
	reply(u, w, r, v, err)
}

// decodeOptional decodes a JSON body into v when there is one; an empty
// body leaves v as it is.
func decodeOptional(w http.ResponseWriter, r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return bodyError(err)
	}
	return nil
}

func (u *ui) apiBlocked(w http.ResponseWriter, r *http.Request) {
	v, err := u.blocked(r.Context())
	reply(u, w, r, v, err)
}

func (u *ui) apiTopicBlocked(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit, err := queryLimit(q, blockedPage)
	if err != nil {
		u.apiError(w, r, err)
		return
	}
	topic, group := r.PathValue("topic"), q.Get("group")
	if group == "" {
		v, err := u.topicBlocked(r.Context(), topic, limit)
		reply(u, w, r, v, err)
		return
	}
	bs, err := u.blockedGroups(r.Context(), topic, group, limit)
	v := make([]admin.Blocked, len(bs))
	for i, b := range bs {
		v[i] = admin.Blocked{Topic: topic, ConsumerGroup: group, BlockedGroup: b}
	}
	reply(u, w, r, v, err)
}

// apiMessageGroups answers which groups finished a message (never
// cached: it is one indexed read); last errors go through Config.Redact as
// the message's dead letter.
func (u *ui) apiMessageGroups(w http.ResponseWriter, r *http.Request) {
	id, err := messageID(r.PathValue("id"))
	if err != nil {
		u.apiError(w, r, err)
		return
	}
	gs, err := u.messageGroups(r.Context(), r.PathValue("topic"), id)
	reply(u, w, r, gs, err)
}

// clusters reads what the routers of each name share: their leader and
// the permits each instance holds (admin.Admin.Routers).
func (u *ui) clusters(ctx context.Context) ([]admin.RouterCluster, error) {
	return get(&u.cache, "clusters", func() ([]admin.RouterCluster, error) { return u.cfg.Admin.Routers(ctx) })
}

// apiClusters serves clusters.
func (u *ui) apiClusters(w http.ResponseWriter, r *http.Request) {
	v, err := u.clusters(r.Context())
	reply(u, w, r, v, err)
}

func (u *ui) apiRouters(w http.ResponseWriter, r *http.Request) {
	u.writeJSON(w, http.StatusOK, u.routers())
}
