package conformance

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/router"
)

// Router subjects deliver through the router to an HTTP receiver on
// loopback: the receiver is the handler, and a message counts as handled
// when the receiver answered 2xx. The receiver does not see attempts, so
// the "no second first attempt" rule does not apply; duplicates are counted.

// RouterSubjects are the router's delivery paths: a QueueSource (of an
// unordered and of an ordered topic), and a GroupSource in each tracking
// mode (router's own tests run one of an ordered topic).
var RouterSubjects = []*Subject{
	{Name: "router-queue", Semantics: outbox.Queue, Router: true, Start: startRouter},
	{Name: "router-queue-ordered", Semantics: outbox.Queue, Ordered: true, Router: true, Start: startRouter},
	{Name: "router-bitmap", Semantics: outbox.PubSub, Tracking: outbox.Bitmap, Groups: true, Router: true, Start: startRouter},
	{Name: "router-counter", Semantics: outbox.PubSub, Tracking: outbox.Counter, Groups: true, Router: true, Start: startRouter},
	{Name: "router-offset", Semantics: outbox.PubSub, Tracking: outbox.Offset, Groups: true, Router: true, Start: startRouter},
}

// receiver is the endpoint router subjects deliver to.
type receiver struct {
	e   *Env
	srv *httptest.Server
	url string

	mu        sync.Mutex
	behaviour Behaviour // set by the scenario
}

func (e *Env) startReceiver(t testing.TB) {
	r := &receiver{e: e}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.srv.Close)
	r.url = r.srv.URL + "/hook"
	e.receiver = r
}

func (r *receiver) setBehaviour(b Behaviour) {
	if b == nil {
		return
	}
	r.mu.Lock()
	r.behaviour = b
	r.mu.Unlock()
}

// serve takes the message id and the group from X-Message-Id ("123" from a
// QueueSource, "group:topic/name/123" from a GroupSource).
func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	var p Payload
	if err := json.NewDecoder(req.Body).Decode(&p); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	key := req.Header.Get("X-Message-Id")
	group := "g1"
	parts := strings.Split(key, "/")
	if len(parts) >= 3 {
		group = parts[len(parts)-2]
	}
	id, err := strconv.ParseInt(parts[len(parts)-1], 10, 64)
	if err != nil {
		http.Error(w, "bad message id "+key, http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	b := r.behaviour
	r.mu.Unlock()
	d := &outbox.Delivery{ID: id, Payload: json.RawMessage(`{"seq":` + strconv.Itoa(p.Seq) + `}`)}
	if b != nil {
		if err := b(req.Context(), d, p.Seq); err != nil {
			if s, ok := err.(statusError); ok {
				if s.retryAfter != "" {
					w.Header().Set("Retry-After", s.retryAfter)
				}
				w.WriteHeader(s.status)
				return
			}
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
	}
	if err := record(context.WithoutCancel(req.Context()), r.e.DB.Pool, r.e.DB.Schema, group, "receiver", d); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	_, _ = w.Write([]byte(`{"ack":true}`))
}

// statusError makes the receiver answer with a status (and Retry-After).
type statusError struct {
	status     int
	retryAfter string
}

func (s statusError) Error() string { return http.StatusText(s.status) }

func startRouter(ctx context.Context, e *Env, pool *pgxpool.Pool, spec Spec, _ outbox.Handler) (Instance, error) {
	rt, err := router.New(router.Config{
		Pools:             []router.PoolConfig{{Code: "P", Concurrency: spec.Concurrency}},
		AllowedHosts:      []string{strings.TrimPrefix(strings.TrimSuffix(spec.Target, "/hook"), "http://")},
		RequestTimeout:    spec.RequestTimeout,
		MaxAttempts:       2,
		DefaultRetryDelay: 50 * time.Millisecond,
		FastFailDelay:     50 * time.Millisecond,
		Logger:            spec.Logger,
	})
	if err != nil {
		return nil, err
	}
	var src router.Source
	if e.Subject.Groups {
		src, err = router.NewGroupSource(router.GroupSourceConfig{Pool: pool, Options: spec.Start,
			Group: consumergroup.Config{Topic: e.Topic.Name, Group: spec.Group, Schema: e.DB.Schema, InstanceID: spec.Instance,
				BatchSize: spec.BatchSize, Concurrency: spec.Concurrency, PollInterval: spec.PollInterval,
				HeartbeatInterval: spec.HeartbeatInterval, HeartbeatTimeout: spec.HeartbeatTimeout, Logger: spec.Logger}})
	} else {
		var client *outbox.Client
		if client, err = outbox.NewClient(pool, outbox.Config{Schema: e.DB.Schema}); err != nil {
			return nil, err
		}
		src, err = router.NewQueueSource(router.QueueSourceConfig{Client: client, Topic: e.Topic.Name,
			BatchSize: spec.BatchSize, PollInterval: spec.PollInterval})
	}
	if err != nil {
		return nil, err
	}
	rt.AddSource(src)
	if err := rt.Start(ctx); err != nil {
		return nil, err
	}
	if e.Subject.Groups {
		// Start returns before the source subscribed the group: wait, so
		// that "started" means what it means for the other subjects.
		for e.subscription(ctx, spec.Group) == "" {
			time.Sleep(10 * time.Millisecond)
		}
	}
	return rt, nil
}

// subscription reads group's state ("" when it has none).
func (e *Env) subscription(ctx context.Context, group string) string {
	var st string
	_ = e.DB.Pool.QueryRow(ctx, `SELECT subscription_status FROM `+quote(e.DB.Schema)+`.outbox_topic_subscriptions
WHERE topic = $1 AND group_name = $2`, e.Topic.Name, group).Scan(&st)
	return st
}

// routerOnly are the scenarios of the router paths alone.
var routerOnly = []scenario{
	{"ReceiverFailsTimesOutAndThrottles", false, receiverFailures},
	{"SlowDeliveriesOutliveLeases", false, slowDeliveries},
}

// receiverFailures: the receiver answers 500, 429 (Retry-After) or hangs
// past the request timeout for a share of the calls. Every message is
// delivered or dead-lettered with a reason.
func receiverFailures(t *testing.T, s *Subject) {
	e := newEnv(t, s, func(tc *outbox.TopicConfig) { tc.MaxAttempts = 8 })
	var mu sync.Mutex
	calls := map[int]int{}
	b := func(ctx context.Context, _ *outbox.Delivery, seq int) error {
		mu.Lock()
		calls[seq]++
		n := calls[seq]
		mu.Unlock()
		switch (seq + n) % 7 {
		case 0:
			return statusError{status: http.StatusInternalServerError}
		case 1:
			return statusError{status: http.StatusTooManyRequests, retryAfter: "0"}
		case 2:
			if n == 1 {
				select { // past the router's 1 s request timeout
				case <-ctx.Done():
				case <-time.After(1500 * time.Millisecond):
				}
				return statusError{status: http.StatusServiceUnavailable}
			}
		}
		return nil
	}
	e.StartInstance(t, e.DB.Pool, Spec{Group: "g1", Concurrency: 8}, b)
	ids := e.Send(t, 150)
	e.WaitDelivered(t, "g1", ids, 90*time.Second)
	e.Check(t, "g1", ids, nil)
	for id := range e.DeadLettered(t, "g1") {
		require.NotEmpty(t, e.lastError(t, id), "message %d dead-lettered without a reason", id)
	}
}

// slowDeliveries: deliveries that take longer than the topic's lease
// (1 s) are not taken over meanwhile: nothing is delivered twice.
func slowDeliveries(t *testing.T, s *Subject) {
	e := newEnv(t, s, nil)
	b := func(ctx context.Context, _ *outbox.Delivery, seq int) error {
		if seq%10 == 1 {
			time.Sleep(2500 * time.Millisecond)
		}
		return nil
	}
	// Slower than the lease, well within the request timeout: the
	// deliveries succeed, and only the kept leases keep them single.
	e.StartInstance(t, e.DB.Pool, Spec{Group: "g1", Concurrency: 8, RequestTimeout: 10 * time.Second}, b)
	ids := e.Send(t, 40)
	e.WaitDelivered(t, "g1", ids, 60*time.Second)
	e.Check(t, "g1", ids, nil)
	e.CheckNoDuplicates(t, "g1")
}

// lastError is the reason a message was dead-lettered with.
func (e *Env) lastError(t testing.TB, id int64) string {
	var reason string
	q := `SELECT coalesce(last_error, '') FROM ` + e.DB.Table("outbox_group_retries") + ` WHERE message_id = $1`
	require.NoError(t, e.DB.Pool.QueryRow(context.Background(), q, id).Scan(&reason))
	return reason
}
