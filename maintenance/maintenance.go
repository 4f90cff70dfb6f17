// Package maintenance runs what keeps a pgoutbox schema healthy for months,
// in the background, from any process that has a client (one that only
// produces included): it declares DEAD the consumer groups whose
// heartbeats stopped and forgets the groups that left, deletes the PUB_SUB
// messages every group finished, caps how long any message is kept,
// expires dead letters and idempotency keys, and deletes old CANCELLED and
// DEAD subscriptions.
//
// pgoutbox.Client runs one; create one with New for a service that uses
// the outbox and consumergroup packages directly. Any number of services
// may run at once, in one process or many: each job takes its rows FOR
// UPDATE SKIP LOCKED or under a transaction-scoped lock, and every step is
// idempotent (nothing holds a session-level lock, so it works through
// PgBouncer's transaction pooling).
//
// Each job is a loop: a pass, then a jittered sleep of its interval. A
// pass works in batches (BatchSize rows), each statement bounded by
// StatementTimeout; a statement that times out makes the job's batches ten
// times smaller until a pass succeeds again.
package maintenance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/ident"
	"github.com/pgoutbox/pgoutbox/internal/ratelog"
	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/internal/startstop"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// Service runs the maintenance jobs between Start and Stop.
type Service struct {
	cfg     Config
	pool    *pgxpool.Pool
	groups  *consumergroup.Maintainer
	q       *sqlq.Maintenance
	pq      *sqlq.Partitions
	logger  *slog.Logger
	events  *ratelog.Log // failures, at most once per LogInterval
	daily   *ratelog.Log // warnings about DEAD groups due for deletion and messages the retention cap took, by the client's clock
	metrics *metrics
	jobs    []*job

	orphanCursor atomic.Int64 // where the sweep of Counter dedupe rows goes on

	life startstop.Base
}

// New returns a service for the schema of cfg.Client, working through
// pool. Start runs it.
func New(pool *pgxpool.Pool, cfg Config) (*Service, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if pool == nil {
		return nil, fmt.Errorf("%w: maintenance: nil pool", outbox.ErrInvalidConfig)
	}
	schema, err := ident.Schema(cfg.Client.Schema())
	if err != nil {
		return nil, err
	}
	groups, err := consumergroup.NewMaintainer(pool, cfg.Client)
	if err != nil {
		return nil, err
	}
	logger := cfg.Logger.With(slog.String("component", "pgoutbox.maintenance"))
	s := &Service{cfg: cfg, pool: pool, groups: groups, q: sqlq.ForMaintenance(schema), pq: sqlq.ForPartitions(schema), logger: logger,
		events: ratelog.New(logger, cfg.Client.LogInterval(), time.Now), daily: ratelog.New(logger, 24*time.Hour, clientTime(cfg.Client)),
		metrics: newMetrics(cfg.MeterProvider)}
	s.jobs = []*job{
		{name: "dead-groups", every: cfg.DeadGroupInterval, pass: s.deadGroups},
		{name: "cleanup", every: cfg.CleanupInterval, pass: s.cleanup},
		{name: "subscriptions", every: cfg.SubscriptionCleanupInterval, pass: s.subscriptions},
		{name: "partitions", every: cfg.PartitionInterval, pass: s.partitions, startNow: true},
	}
	for _, j := range s.jobs {
		j.batch = cfg.BatchSize
	}
	return s, nil
}

// Start runs the jobs in the background and returns. Each job's first
// pass comes after a random part of its interval, so that instances
// started together do not work in step. Start on a running service fails
// with outbox.ErrAlreadyStarted; a stopped one starts again.
func (s *Service) Start(ctx context.Context) error {
	run, done, err := s.life.StartInit(ctx, "maintenance")
	if err != nil {
		return err
	}
	var tasks startstop.Tasks
	for _, j := range s.jobs {
		tasks.Go(func() { s.loop(run, j) })
	}
	go func() { tasks.Wait(); done() }()
	s.logger.Info("pgoutbox: maintenance started", slog.Duration("dead_group_interval", s.cfg.DeadGroupInterval),
		slog.Duration("cleanup_interval", s.cfg.CleanupInterval))
	return nil
}

// Stop ends the jobs (a statement in flight is cancelled) and waits for
// them until ctx ends. Safe on a service never started.
func (s *Service) Stop(ctx context.Context) error {
	stopped, ok := s.life.StopInit()
	if !ok {
		return nil
	}
	return startstop.Wait(ctx, stopped)
}

// RunOnce runs a pass of every job now, in order (dead groups, cleanup,
// subscriptions, partitions), and returns what they did. It is what the jobs run on
// their own; call it from a script, a test, or an operator's command.
func (s *Service) RunOnce(ctx context.Context) (Report, error) {
	var r Report
	var errs []error
	for _, j := range s.jobs {
		errs = append(errs, s.runPass(ctx, j, &r))
	}
	return r, errors.Join(errs...)
}

// Report says what a pass of the jobs did.
type Report struct {
	// DeadGroups are the groups declared DEAD, as "topic/group".
	DeadGroups []string
	// Deleted counts the rows deleted, by table.
	Deleted map[string]int64
	// DroppedUnread counts, per "topic/group", the messages the retention
	// cap deleted before the group finished them.
	DroppedUnread map[string]int64
	// RemovedGroups are the subscriptions deleted, as "topic/group".
	RemovedGroups []string
	// PartitionsCreated counts the partitions of outbox_published added.
	PartitionsCreated int
	// PartitionsDropped are the partitions dropped (their tables' names).
	PartitionsDropped []string
	// PartitionsKept maps a partition whose transactions have all ended
	// but that was kept to a topic that still holds one of its messages
	// (unfinished by a group, or within the topic's retention).
	PartitionsKept map[string]string
}

func (r *Report) deleted(table string, n int64) {
	if n == 0 {
		return
	}
	if r.Deleted == nil {
		r.Deleted = map[string]int64{}
	}
	r.Deleted[table] += n
}

// job is one kind of maintenance, run every interval.
type job struct {
	name  string
	every time.Duration
	pass  func(ctx context.Context, j *job, r *Report) error
	// startNow runs the first pass at Start (partitions must be ahead
	// of the writers), not after a random part of the interval.
	startNow bool

	mu    sync.Mutex
	batch int // shrinks after a statement timed out, grows back after a good pass
	last  JobStatus
}

func (j *job) batchSize() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.batch
}

// loop runs j until ctx ends.
func (s *Service) loop(ctx context.Context, j *job) {
	wait := time.Duration(rand.Int64N(int64(j.every))) // staggered start
	if j.startNow {
		wait = 0
	}
	for {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		var r Report
		if err := s.runPass(ctx, j, &r); err != nil && ctx.Err() == nil {
			s.events.Log(slog.LevelError, "job-failed|"+j.name, "pgoutbox: maintenance job failed; it runs again next interval",
				slog.String("job", j.name), slog.Any("error", err))
		}
		s.logReport(j, r)
		wait = jittered(j.every)
	}
}

// runPass runs one pass of j, timing it, and adjusts its batch size: ten
// times smaller after a statement timed out, back up (doubling) after a
// pass that went well.
func (s *Service) runPass(ctx context.Context, j *job, r *Report) error {
	start := time.Now()
	err := j.pass(ctx, j, r)
	took := time.Since(start)
	s.metrics.duration(ctx, j.name, took)
	j.mu.Lock()
	defer j.mu.Unlock()
	if ctx.Err() == nil { // a pass cut off by Stop says nothing of the job
		j.last.record(err, took, j.every, time.Now())
		if st := j.last; st.FallingBehind() {
			s.events.Log(slog.LevelWarn, "job-behind|"+j.name, "pgoutbox: a maintenance job is falling behind: its passes fail or take longer than its interval",
				slog.String("job", j.name), slog.Int("passes", st.Behind), slog.Time("since", st.BehindSince),
				slog.Duration("last_pass", took), slog.Duration("interval", j.every))
		}
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
		j.batch = max(j.batch/10, 10)
		s.logger.Warn("pgoutbox: a maintenance statement timed out; smaller batches from now on",
			slog.String("job", j.name), slog.Int("batch_size", j.batch))
	case err == nil:
		j.batch = min(j.batch*2, s.cfg.BatchSize)
	}
	return err
}

// drain runs f with the job's batch size, each call bounded by the
// statement timeout, until a call deletes fewer rows than it may, pausing
// between calls. It returns how many rows the calls deleted.
func (s *Service) drain(ctx context.Context, j *job, f func(ctx context.Context, limit int) (int64, error)) (int64, error) {
	var total int64
	for {
		limit := j.batchSize()
		stmt, cancel := context.WithTimeout(ctx, s.cfg.StatementTimeout)
		n, err := f(stmt, limit)
		cancel()
		total += n
		if err != nil || n < int64(limit) {
			return total, err
		}
		if !sleep(ctx, jittered(s.cfg.BatchPause)) {
			return total, ctx.Err()
		}
	}
}

func (s *Service) logReport(j *job, r Report) {
	attrs := []slog.Attr{slog.String("job", j.name)}
	for table, n := range r.Deleted {
		attrs = append(attrs, slog.Int64("deleted_"+table, n))
	}
	if len(r.RemovedGroups) > 0 {
		attrs = append(attrs, slog.Any("removed_groups", r.RemovedGroups))
	}
	if r.PartitionsCreated > 0 {
		attrs = append(attrs, slog.Int("partitions_created", r.PartitionsCreated))
	}
	if len(r.PartitionsDropped) > 0 {
		attrs = append(attrs, slog.Any("partitions_dropped", r.PartitionsDropped))
	}
	if len(attrs) > 1 {
		s.logger.LogAttrs(context.Background(), slog.LevelInfo, "pgoutbox: maintenance pass", attrs...)
	}
}

// clientTime is client's clock (the one the jobs judge ages by), or the
// process's when it has none.
func clientTime(client *outbox.Client) func() time.Time {
	return func() time.Time {
		if t := client.Now(); t != nil {
			return *t
		}
		return time.Now()
	}
}

// jittered is d ±10%.
func jittered(d time.Duration) time.Duration {
	return d + time.Duration(rand.Int64N(int64(d)/5+1)) - d/10
}

// sleep waits d, reporting false when ctx ends first.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
