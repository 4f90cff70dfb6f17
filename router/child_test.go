package router_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/childproc"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/router"
)

// childEnv, when set to a childSpec (JSON), makes the test binary a router
// process instead (see runChild): tests kill it.
const childEnv = "PGOUTBOX_ROUTER_CHILD"

// childSpec describes a router running in a process of its own: one pool
// P delivering to Host, fed by a GroupSource of Group (Queue false) or a
// QueueSource (Queue true) on topic hooks.
type childSpec struct {
	DSN, Schema, Host string
	Group, Instance   string
	Queue             bool
	Concurrency       int
	BatchSize         int
	RequestTimeout    time.Duration
	// Shared names the routers that share pool P's limits (none: its
	// own), RatePerMinute its rate limit.
	Shared        string
	RatePerMinute int
}

// routerProcess is what a child runs: the router spec describes, started,
// logging to logger (nil: slog's default). Tests run the same in their
// own process as a survivor.
func routerProcess(ctx context.Context, pool *pgxpool.Pool, spec childSpec, logger *slog.Logger) (*router.Router, error) {
	client, err := outbox.NewClient(pool, outbox.Config{Schema: spec.Schema, Logger: logger})
	if err != nil {
		return nil, err
	}
	cfg := router.Config{AllowedHosts: []string{spec.Host}, MaxAttempts: 1, Logger: logger,
		RequestTimeout: spec.RequestTimeout, FastFailDelay: 50 * time.Millisecond,
		Pools: []router.PoolConfig{{Code: "P", Concurrency: spec.Concurrency, RateLimitPerMinute: spec.RatePerMinute}}}
	if spec.Shared != "" {
		cfg.Shared = &router.SharedLimits{Client: client, Name: spec.Shared, Instance: spec.Instance}
	}
	rt, err := router.New(cfg)
	if err != nil {
		return nil, err
	}
	var src router.Source
	if spec.Queue {
		src, err = router.NewQueueSource(router.QueueSourceConfig{Client: client, Topic: "hooks",
			BatchSize: spec.BatchSize, PollInterval: 20 * time.Millisecond})
	} else {
		src, err = router.NewGroupSource(router.GroupSourceConfig{Pool: pool, Group: consumergroup.Config{Client: client,
			Topic: "hooks", Group: spec.Group, InstanceID: spec.Instance, BatchSize: spec.BatchSize,
			PollInterval: 20 * time.Millisecond}})
	}
	if err != nil {
		return nil, err
	}
	rt.AddSource(src)
	return rt, rt.Start(ctx)
}

// runChild runs the router the spec (JSON) describes until it is killed.
func runChild(raw string) {
	var spec childSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, spec.DSN)
	if err == nil {
		_, err = routerProcess(ctx, pool, spec, nil)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "router child:", err)
		os.Exit(2)
	}
	fmt.Println("ready")
	select {} // until killed
}

// startChild runs a router process for spec (see runChild); it is killed
// when the test ends.
func startChild(t *testing.T, spec childSpec) *childproc.Child {
	t.Helper()
	return childproc.Start(t, childEnv, spec)
}
