// Package adminui is an embeddable web UI for operators, with a JSON API
// under it: topics with their backlog, consumer groups with their state
// and lag, the message groups ordered topics and groups are held back on,
// dead letters (replay and purge), and router pools and warnings.
// NewHandler returns an http.Handler to mount under Prefix:
//
//	ui, err := adminui.NewHandler(adminui.Config{Admin: client.Admin(), Prefix: "/pgoutbox"})
//	mux.Handle("/pgoutbox/", requireOperator(ui)) // your authentication
//
// The UI is read-only unless Config.Writable is set. It has no
// authentication of its own: wrap it in your middleware, which sees every
// request, reads and actions alike (actions are POSTs). Actions are
// refused when they come from another origin (http.CrossOriginProtection),
// so a page elsewhere cannot make an operator's browser replay or purge.
// A page's purge button asks for confirmation first. After an action the
// page it returns to says once what it did (a banner set by the action's
// response, not by the address, so a link cannot fake one and a reload
// does not repeat it). Message payloads and headers can hold personal data: they are shown only
// with Config.ShowPayloads, through Config.Redact when set.
//
// Every read is bounded (see package admin), and what it read is kept for
// Config.CacheFor, so a page stays fast beside millions of stored messages
// and many operators; an action clears the cache.
//
// The JSON API, under Prefix+"/api":
//
//	GET  /api/topics                              topics and their backlog
//	GET  /api/topics/{topic}                      one topic
//	GET  /api/topics/{topic}/groups               its groups' health
//	GET  /api/topics/{topic}/groups/{group}       one group's health
//	GET  /api/topics/{topic}/history              its charts' readings (Config.History)
//	GET  /api/topics/{topic}/groups/{group}/history
//	GET  /api/topics/{topic}/dead-letters         ?group=&after=&limit=
//	GET  /api/topics/{topic}/blocked              ?group=&limit= blocked message groups
//	GET  /api/blocked                             every ordered topic's and group's
//	GET  /api/topics/{topic}/messages/{id}/groups which groups finished a message, where the others stand
//	POST /api/topics/{topic}/dead-letters/replay  {"group": "", "ids": [], "all": false}
//	POST /api/topics/{topic}/dead-letters/purge   {"group": "", "ids": [], "all": false}
//	POST /api/topics/{topic}/groups/{group}/pause (and /resume, /cancel, /remove)
//	POST /api/topics/{topic}/groups/{group}/resurrect       {"backfill": true}
//	POST /api/topics/{topic}/groups/{group}/force-complete  {"older_than_seconds": 3600}
//	POST /api/topics/{topic}/mode                 {"mode": "counter"} change the tracking mode
//	GET  /api/stuck                               ?older_than_seconds= (default 3600) what waits longer
//	GET  /api/check                               stored messages whose completion records do not add up
//	GET  /api/storage                             what the message log keeps (admin.Admin.Storage)
//	GET  /api/routers                             pools and warnings (Config.Routers)
//	GET  /api/routers/shared                      every router name's leader and permits (admin.Admin.Routers)
//
// A dead-letter action takes the ids, or "all": true for every one there
// (never an empty list alone); it answers {"replayed": n} or {"purged":
// n}. A group action answers {"done": action} (force-complete adds
// {"completed": n}); the pages ask to confirm cancel, remove,
// force-complete, a mode change and a purge. Pausing a paused group, or
// resuming an active one, succeeds. The blocked message groups of an
// ordered topic are a QUEUE topic's or each of a PUB_SUB topic's groups',
// or with group= one consumer group's (see admin.Admin.BlockedGroups);
// their names and last errors go through Config.Redact as dead letters'
// do.
//
// Every document has one shape, the one the pgoutbox command writes with
// --json: the MarshalJSON of the type the admin package returns
// (admin.Topic, consumergroup.Health, admin.Blocked, admin.DeadLetterView,
// admin.MessageGroup, admin.Stuck, consumergroup.Inconsistency,
// admin.Storage). Keys are snake_case, durations are seconds with a
// _seconds suffix, and times are RFC 3339. docs/admin.md shows each. Errors
// are JSON {"error": "..."} with a 4xx status for bad input (400),
// unknown names (404), a refused action (403), a forbidden state change
// (409) or a body over 1 MiB (413).
package adminui

import (
	"cmp"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/router"
)

// DefaultCacheFor is how long a read is kept by default.
const DefaultCacheFor = 2 * time.Second

// Config configures the UI.
type Config struct {
	// Admin reads and steers the topics and groups. Required.
	Admin *admin.Admin
	// Prefix is the path the handler is mounted under ("" or "/x", no
	// trailing slash).
	Prefix string
	// Writable enables actions: replaying and purging dead letters,
	// pausing and resuming groups.
	Writable bool
	// ShowPayloads shows dead letters' payloads and headers.
	ShowPayloads bool
	// Redact, when set, is applied to every dead letter shown with its
	// payload, and returns what to show (mask fields, drop headers).
	Redact func(outbox.DeadLetter) outbox.DeadLetter
	// Routers are shown with their pools and warnings.
	Routers []*router.Router
	// History, when set and running, draws each topic's and group's
	// charts over its span (see History), and serves them in the JSON
	// API.
	History *History
	// CacheFor is how long a read is reused; negative: never. Defaults
	// to DefaultCacheFor.
	CacheFor time.Duration
	// Logger receives server errors. Defaults to slog.Default().
	Logger *slog.Logger
}

//go:embed templates/*.html static/*
var assets embed.FS

// ErrReadOnly is the error of an action on a UI that is not Writable.
var ErrReadOnly = errors.New("adminui: read-only: actions are not enabled")

// errBadInput marks a malformed request.
var errBadInput = errors.New("adminui: bad request")

// ui serves the pages and the API.
type ui struct {
	cfg   Config
	pages map[string]*template.Template
	cache cache
}

// NewHandler returns the UI's handler.
func NewHandler(cfg Config) (http.Handler, error) {
	if cfg.Admin == nil {
		return nil, fmt.Errorf("%w: adminui: Admin is nil", outbox.ErrInvalidConfig)
	}
	if cfg.Prefix != "" && (!strings.HasPrefix(cfg.Prefix, "/") || strings.HasSuffix(cfg.Prefix, "/")) {
		return nil, fmt.Errorf("%w: adminui: Prefix %q must start with / and not end with one", outbox.ErrInvalidConfig, cfg.Prefix)
	}
	cfg.CacheFor = cmp.Or(cfg.CacheFor, DefaultCacheFor)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	u := &ui{cfg: cfg, pages: map[string]*template.Template{}, cache: cache{entries: map[string]cached{}, ttl: cfg.CacheFor}}
	funcs := template.FuncMap{"path": u.path, "age": age, "count": cfg.Admin.FormatCount, "join": strings.Join,
		"routerTitle": routerTitle,
		"modes":       func() []string { return []string{string(outbox.Bitmap), string(outbox.Counter), string(outbox.Offset)} }}
	for _, page := range []string{"topics", "topic", "group", "checks", "message", "confirm", "confirmgroup", "confirmmode", "error"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(assets, "templates/layout.html", "templates/"+page+".html")
		if err != nil {
			return nil, fmt.Errorf("adminui: templates: %w", err)
		}
		u.pages[page] = t
	}
	static, err := fs.Sub(assets, "static")
	if err != nil {
		return nil, err
	}

	mux := http.NewServeMux()
	p := cfg.Prefix
	mux.Handle("GET "+p+"/static/", http.StripPrefix(p+"/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET "+p+"/{$}", u.topicsPage)
	mux.HandleFunc("GET "+p+"/topics/{topic}", u.topicPage)
	mux.HandleFunc("GET "+p+"/topics/{topic}/groups/{group}", u.groupPage)
	mux.HandleFunc("GET "+p+"/topics/{topic}/message", u.messagePage)
	mux.HandleFunc("GET "+p+"/checks", u.checksPage)
	mux.HandleFunc("POST "+p+"/topics/{topic}/dead-letters/{action}", u.deadLettersForm)
	mux.HandleFunc("POST "+p+"/topics/{topic}/groups/{group}/{action}", u.groupForm)
	mux.HandleFunc("POST "+p+"/topics/{topic}/mode", u.modeForm)

	mux.HandleFunc("GET "+p+"/api/topics", u.apiTopics)
	mux.HandleFunc("GET "+p+"/api/topics/{topic}", u.apiTopic)
	mux.HandleFunc("GET "+p+"/api/topics/{topic}/groups", u.apiGroups)
	mux.HandleFunc("GET "+p+"/api/topics/{topic}/groups/{group}", u.apiGroup)
	mux.HandleFunc("GET "+p+"/api/topics/{topic}/history", u.apiHistory)
	mux.HandleFunc("GET "+p+"/api/topics/{topic}/groups/{group}/history", u.apiHistory)
	mux.HandleFunc("GET "+p+"/api/topics/{topic}/dead-letters", u.apiDeadLetters)
	mux.HandleFunc("POST "+p+"/api/topics/{topic}/dead-letters/{action}", u.apiDeadLettersAction)
	mux.HandleFunc("POST "+p+"/api/topics/{topic}/groups/{group}/{action}", u.apiGroupAction)
	mux.HandleFunc("POST "+p+"/api/topics/{topic}/mode", u.apiMode)
	mux.HandleFunc("GET "+p+"/api/check", u.apiCheck)
	mux.HandleFunc("GET "+p+"/api/stuck", u.apiStuck)
	mux.HandleFunc("GET "+p+"/api/storage", u.apiStorage)
	mux.HandleFunc("GET "+p+"/api/topics/{topic}/blocked", u.apiTopicBlocked)
	mux.HandleFunc("GET "+p+"/api/blocked", u.apiBlocked)
	mux.HandleFunc("GET "+p+"/api/topics/{topic}/messages/{id}/groups", u.apiMessageGroups)
	mux.HandleFunc("GET "+p+"/api/routers", u.apiRouters)
	mux.HandleFunc("GET "+p+"/api/routers/shared", u.apiClusters)

	// Actions (every POST) from another origin are refused before they
	// reach a handler, and no page may be framed by another (a framed
	// page's buttons could be clicked through a decoy).
	protected := http.NewCrossOriginProtection().Handler(mux)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("X-Frame-Options", "DENY")
		h.Set("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'; form-action 'self'")
		h.Set("X-Content-Type-Options", "nosniff")
		protected.ServeHTTP(w, r)
	}), nil
}

// path joins the prefix and parts, each escaped as a path segment.
func (u *ui) path(parts ...string) string {
	var b strings.Builder
	b.WriteString(u.cfg.Prefix)
	for _, p := range parts {
		b.WriteByte('/')
		b.WriteString(url.PathEscape(p))
	}
	if len(parts) == 0 {
		b.WriteByte('/')
	}
	return b.String()
}

// cache keeps reads for a while; an action clears it.
type cache struct {
	mu      sync.Mutex
	ttl     time.Duration
	entries map[string]cached
	gen     uint64 // bumped by clear: a read that began before is not kept
}

type cached struct {
	v  any
	at time.Time
}

// get returns what key holds, or reads it with f.
func get[T any](c *cache, key string, f func() (T, error)) (T, error) {
	if c.ttl <= 0 {
		return f()
	}
	c.mu.Lock()
	e, ok := c.entries[key]
	gen := c.gen
	c.mu.Unlock()
	if ok && time.Since(e.at) < c.ttl {
		return e.v.(T), nil
	}
	v, err := f()
	if err == nil {
		c.mu.Lock()
		if c.gen == gen { // no action since the read began
			c.entries[key] = cached{v: v, at: time.Now()}
		}
		c.mu.Unlock()
	}
	return v, err
}

func (c *cache) clear() {
	c.mu.Lock()
	clear(c.entries)
	c.gen++
	c.mu.Unlock()
}

// status maps an error to an HTTP status.
func status(err error) int {
	switch {
	case errors.Is(err, outbox.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, ErrReadOnly):
		return http.StatusForbidden
	case errors.Is(err, errTooLarge):
		return http.StatusRequestEntityTooLarge
	case errors.Is(err, errBadInput), errors.Is(err, outbox.ErrInvalidTopic), errors.Is(err, outbox.ErrWrongSemantics),
		errors.Is(err, outbox.ErrInvalidConfig), errors.Is(err, consumergroup.ErrInvalidGroup):
		return http.StatusBadRequest
	case errors.Is(err, consumergroup.ErrInvalidTransition):
		return http.StatusConflict
	}
	return http.StatusInternalServerError
}

// routerTitle names router i of n: "Router" when it is the only one,
// else "Router 1 of 2" and so on.
func routerTitle(i, n int) string {
	if n == 1 {
		return "Router"
	}
	return fmt.Sprintf("Router %d of %d", i+1, n)
}

func age(d time.Duration) string {
	if d <= 0 {
		return "0s"
	}
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}
