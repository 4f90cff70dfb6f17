package router_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/router"
)

// settled records how the router settled one message.
type settled struct {
	kind      string // ack, nack, dead
	delay     time.Duration
	attempted bool
	reason    string
}

// recorder is a Settler that records outcomes, standing in for a source
// so router behaviour can be checked message by message.
type recorder struct {
	mu   sync.Mutex
	got  map[string][]settled
	wait map[string]chan struct{}
}

func newRecorder() *recorder {
	return &recorder{got: map[string][]settled{}, wait: map[string]chan struct{}{}}
}

type recSettler struct {
	r  *recorder
	id string
}

func (s recSettler) add(v settled) error {
	s.r.mu.Lock()
	defer s.r.mu.Unlock()
	s.r.got[s.id] = append(s.r.got[s.id], v)
	if ch, ok := s.r.wait[s.id]; ok {
		close(ch)
		delete(s.r.wait, s.id)
	}
	return nil
}
func (s recSettler) Ack(context.Context) error { return s.add(settled{kind: "ack"}) }
func (s recSettler) Nack(_ context.Context, r router.Retry) error {
	return s.add(settled{kind: "nack", delay: time.Until(r.At).Round(time.Second), attempted: r.Attempted, reason: r.Reason})
}
func (s recSettler) DeadLetter(_ context.Context, reason string) error {
	return s.add(settled{kind: "dead", reason: reason})
}

func (r *recorder) msg(id, delivery, target, group string) *router.Message {
	return &router.Message{ID: id, DeliveryID: delivery, Target: target, Group: group, Pool: "P",
		Payload: []byte(`{"id":"` + id + `"}`), Settle: recSettler{r: r, id: delivery}}
}

// outcome waits for delivery's first settlement.
func (r *recorder) outcome(t *testing.T, delivery string) settled {
	t.Helper()
	r.mu.Lock()
	if got := r.got[delivery]; len(got) > 0 {
		r.mu.Unlock()
		return got[0]
	}
	ch := make(chan struct{})
	r.wait[delivery] = ch
	r.mu.Unlock()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("delivery %s never settled", delivery)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.got[delivery][0]
}

// deliver routes message id (delivery id/1, in a group of its own) to
// target through rt and waits for its settlement.
func (r *recorder) deliver(t *testing.T, rt *router.Router, target, id string) settled {
	t.Helper()
	rt.Route(context.Background(), []*router.Message{r.msg(id, id+"/1", target, id)})
	return r.outcome(t, id+"/1")
}

func (r *recorder) all(delivery string) []settled {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]settled(nil), r.got[delivery]...)
}

// endpoint is a loopback HTTP server with a programmable handler.
func endpoint(t *testing.T, h http.HandlerFunc) (*httptest.Server, string) {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	return srv, u.Host
}

func newRouter(t *testing.T, cfg router.Config) *router.Router {
	t.Helper()
	if cfg.Pools == nil {
		cfg.Pools = []router.PoolConfig{{Code: "P", Concurrency: 10}}
	}
	if cfg.RetryBackoff == nil {
		cfg.RetryBackoff = func(int) time.Duration { return time.Millisecond }
	}
	r, err := router.New(cfg)
	require.NoError(t, err)
	require.NoError(t, r.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = r.Stop(ctx)
	})
	return r
}

// fillPool fills rt's pool P (concurrency 1, so a capacity of
// max(1×20, 50) = 50; rt's GroupShare must let one group fill it) with 50
// messages of one group to target, whose receiver holds them: one in
// flight, 49 queued.
func fillPool(t *testing.T, rt *router.Router, rec *recorder, target string) {
	t.Helper()
	var msgs []*router.Message
	for i := range 50 {
		msgs = append(msgs, rec.msg(fmt.Sprint(i), fmt.Sprintf("%d/1", i), target, "g"))
	}
	rt.Route(context.Background(), msgs)
	pgtest.Eventually(t, 5*time.Second, "one in flight, 49 queued", func() bool {
		p := rt.Pools()[0]
		return p.InFlight == 1 && p.Queued == 49
	})
}

func hasWarning(r *router.Router, code string, sev router.Severity) bool {
	for _, w := range r.Warnings() {
		if w.Code == code && w.Severity == sev {
			return true
		}
	}
	return false
}

var _ = fmt.Sprint
