package conformance

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/testlog"
	"github.com/pgoutbox/pgoutbox/maintenance"
	"github.com/pgoutbox/pgoutbox/outbox"
)

type scenario struct {
	name   string
	groups bool // consumer-group lifecycle scenarios
	run    func(*testing.T, *Subject)
}

var scenarios = []scenario{
	{"StartWhileProducersCommitOutOfOrder", false, startWhileProducing},
	{"TwoInstancesOnSeparatePools", false, twoInstances},
	{"MemberKilledMidBatch", false, killedMidBatch},
	{"PoisonMessageCrashesProcess", false, poisonMessage},
	{"HungHandlerDoesNotStallTheRest", false, hungHandler},
	{"StopAndStartDoNotRedeliver", false, stopStart},
	{"StopOutlivedByAHandler", false, stopOutlivedByHandler},
	{"CancelUnstartedGroupBesideLiveOnes", true, cancelUnstarted},
	{"DeadGroupResurrectsAfterFreeze", true, resurrectAfterFreeze},
	{"DeadGroupResurrectsByStart", true, resurrectByStart},
	{"ForgetRacesCompletionOfThreeGroups", true, forgetRacesCompletion},
	{"PauseAndResumeTwoInstances", true, pauseResume},
	{"XidsCrossAPowerOfTen", true, xidsCrossAPowerOfTen},
	{"LongTransactionsElsewhere", false, longTransactions},
	{"BackfillBesideNewMessagesAndAKill", true, backfillBesideNew},
	{"TrackingModeChangesUnderLoad", true, modeChangesUnderLoad},
	{"AckInTxExactlyOnceThroughKills", false, exactlyOnceThroughKills},
	{"SlowHandlersSpreadOverProcesses", false, workSpreads},
	{"FrozenMemberHoldsNoOtherGroupBack", true, frozenMember},
	{"KilledOwnerComesBackAtOnce", false, killedOwnerComesBackAtOnce},
	{"FrozenOwnerKeepsItsLeases", false, frozenOwnerKeepsItsLeases},
	{"RestartedWithTheSameInstanceID", false, restartedWithTheSameID},
}

// Run runs every scenario that applies to s, each in a database of its own.
func Run(t *testing.T, s *Subject) {
	all := scenarios
	if s.Router {
		all = append(slices.Clone(scenarios), routerOnly...)
	}
	for _, sc := range all {
		if sc.groups && !s.Groups {
			continue
		}
		if sc.groups && s.Router && !routerLifecycleSubjects[s.Name] {
			continue // see routerLifecycleSubjects
		}
		if s.Router && sc.name == "PoisonMessageCrashesProcess" {
			continue // a message cannot crash a router: its handler is the receiver
		}
		if s.Router && sc.name == "BackfillBesideNewMessagesAndAKill" {
			continue // a group source runs the group's own backfill: the group subjects cover it
		}
		if s.Router && sc.name == "AckInTxExactlyOnceThroughKills" {
			continue // a receiver's effects are beyond the router's transaction
		}
		if s.Router && sc.name == "StopOutlivedByAHandler" {
			continue // a router's handler is an HTTP call, which returns when Stop cancels it
		}
		if s.Router && sc.name == "RestartedWithTheSameInstanceID" {
			continue // a router's sources make their own ids: the group subjects cover it
		}
		if sc.name == "FrozenOwnerKeepsItsLeases" && !frozenOwnerSubjects[s.Name] {
			continue // half a minute of waiting each: one subject per path keeps a lease the same way
		}
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			sc.run(t, s)
		})
	}
}

// routerLifecycleSubjects are the router subjects that run the consumer
// group lifecycle scenarios (DEAD and back, forgetting, pause, cancel, a
// mode change). A router's GroupSource runs a consumer group: the
// lifecycle is the group's, and each tracking mode's part of it runs in
// the group subjects; what the router adds to it (its holds, its calls in
// flight across a change) is the same in every mode, so one mode covers it.
var routerLifecycleSubjects = map[string]bool{"router-bitmap": true}

// frozenOwnerSubjects run FrozenOwnerKeepsItsLeases: a QUEUE topic's
// consumers, an ordered consumer group and a router's group source. Every
// path holds its leases with the same lease keeper.
var frozenOwnerSubjects = map[string]bool{"queue": true, "offset-ordered": true, "router-bitmap": true}

// ExecModes are pgx's query exec modes: every statement must work in each
// (PgBouncer's transaction pooling needs exec, simple_protocol or
// cache_describe).
var ExecModes = []string{"cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol"}

// core are the scenarios run in every exec mode and through PgBouncer.
var core = map[string]bool{"StartWhileProducersCommitOutOfOrder": true, "TwoInstancesOnSeparatePools": true,
	"MemberKilledMidBatch": true, "HungHandlerDoesNotStallTheRest": true, "StopAndStartDoNotRedeliver": true,
	"CancelUnstartedGroupBesideLiveOnes": true, "PauseAndResumeTwoInstances": true}

// RunExecModes runs the core scenarios over s with every pool in each of
// the given pgx query exec modes.
func RunExecModes(t *testing.T, s *Subject, modes []string) { runModes(t, s, modes, false) }

// PgBouncerExecModes are the exec modes that work through PgBouncer's
// transaction pooling (before PgBouncer 1.21, which tracks prepared
// statements, the default cache_statement does not).
var PgBouncerExecModes = []string{"exec", "simple_protocol", "cache_describe"}

// RunThroughPgBouncer runs the core scenarios over s with every pool going
// through a PgBouncer in transaction pooling mode, in each exec mode that
// works there. LISTEN does not work through it: consumers find messages by
// polling.
func RunThroughPgBouncer(t *testing.T, s *Subject) { runModes(t, s, PgBouncerExecModes, true) }

func runModes(t *testing.T, s *Subject, modes []string, pgbouncer bool) {
	for _, mode := range modes {
		sm := *s
		sm.ExecMode, sm.PgBouncer = mode, pgbouncer
		t.Run(mode, func(t *testing.T) {
			for _, sc := range scenarios {
				if !core[sc.name] || (sc.groups && !s.Groups) {
					continue
				}
				t.Run(sc.name, func(t *testing.T) {
					t.Parallel()
					sc.run(t, &sm)
				})
			}
		})
	}
}

// shortRetention lets cleanup delete finished messages at once, so a
// message that a group was required to read but is not required on is
// deleted (and lost) as soon as the other groups finished it.
func shortRetention(tc *outbox.TopicConfig) {
	tc.Retention = time.Microsecond
	tc.ZeroSubscriptionRetention = time.Microsecond
}

// cleaner runs Cleanup for the topic every few milliseconds until the
// test ends, beside two maintenance services that add and drop small
// partitions of messages all along (every subject's: each reads the log).
// When the test ends, neither service has logged an error, and, if the
// log was empty when the cleaner started, they added partitions and
// dropped some (see churnPartitions).
func (e *Env) cleaner(t testing.TB) {
	g, err := e.NewGroup(e.DB.Pool, Spec{Group: "cleaner"})
	require.NoError(t, err)
	churn := e.churnPartitions(t)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			_, _ = g.Cleanup(ctx, 1000)
			time.Sleep(5 * time.Millisecond)
		}
	})
	var logs testlog.Buffer
	var services []*maintenance.Service
	for range 2 {
		svc, err := maintenance.New(e.DB.Pool, maintenance.Config{Client: e.Client, Logger: logs.Logger(),
			DeadGroupInterval: time.Hour, CleanupInterval: time.Hour, SubscriptionCleanupInterval: time.Hour,
			PartitionInterval: 100 * time.Millisecond, PartitionSize: 500, RowCleanupDelay: time.Millisecond})
		require.NoError(t, err)
		require.NoError(t, svc.Start(ctx))
		services = append(services, svc)
	}
	t.Cleanup(func() {
		if churn != nil {
			// A scenario that held the xmin back lets go at its end: the
			// partitions it held are dropped then. A partition is dropped
			// only once every transaction id below its end has finished,
			// in the whole cluster: a transaction another test holds open
			// (a frozen process's, 15 s) holds it too, however long this
			// scenario has been done.
			churn.wait(t, 2*time.Minute, services[0], &logs)
		}
		cancel()
		wg.Wait()
		for _, svc := range services {
			require.NoError(t, svc.Stop(context.Background()))
		}
		require.Empty(t, logs.Lines("level=ERROR"), "the maintenance services failed")
	})
}

// partitionChurn follows the range partitions of the message log.
type partitionChurn struct {
	e       *Env
	first   string          // the partition the scenario's first messages go to
	initial map[string]bool // the partitions when the cleaner started
}

// churnPartitions, while the message log is empty, makes the range
// partition that new messages go to end 1,000 transaction ids from now
// and drops those after it: the migrations' partitions span 10,000, more
// than a scenario writes, so the maintenance services beside the cleaner
// would add none and drop none. Then they add partitions of their
// PartitionSize as transactions move on, and drop those whose messages
// are done: the first to go is the one the scenario's first messages went
// to. It returns what follows the partitions, or nil when the log holds
// messages: it leaves the partitions as they are then.
func (e *Env) churnPartitions(t testing.TB) *partitionChurn {
	ctx := context.Background()
	parent, partitions := e.DB.Table("outbox_published"), e.DB.Table("outbox_partitions")
	var first string
	err := pgx.BeginFunc(ctx, e.DB.Pool, func(tx pgx.Tx) error {
		// A maintenance service's step in flight commits first, and the
		// services skip theirs until this commits: a partition one of
		// them records meanwhile would not be seen here and, attached
		// after this commits, could stand far ahead of the next xid with
		// nothing between (the services beside the cleaner then add none,
		// and the scenario waits in vain). The partition lock comes
		// before the table's, as in the services' steps.
		if _, err := tx.Exec(ctx, sqlq.ForPartitions(e.DB.Schema).AwaitLock); err != nil {
			return err
		}
		// Writers in flight commit first: their rows count.
		if _, err := tx.Exec(ctx, `LOCK TABLE `+parent+` IN ACCESS EXCLUSIVE MODE`); err != nil {
			return err
		}
		var stored bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+parent+`)`).Scan(&stored); err != nil || stored {
			return err
		}
		// The partition holding the next transaction id (or the first
		// after it) spans from that id, or earlier, to 1,000 past it.
		rows, err := tx.Query(ctx, `
SELECT id, least(lo, pg_snapshot_xmax(pg_current_snapshot()))::text,
       (pg_snapshot_xmax(pg_current_snapshot())::text::numeric + 1000)::text
FROM `+partitions+` WHERE hi > pg_snapshot_xmax(pg_current_snapshot()) ORDER BY lo`)
		if err != nil {
			return err
		}
		type part struct {
			ID     int64
			Lo, Hi string
		}
		parts, err := pgx.CollectRows(rows, pgx.RowToStructByPos[part])
		if err != nil || len(parts) == 0 {
			return err
		}
		var stmts []string
		for i, p := range parts {
			table := e.DB.Table(fmt.Sprintf("outbox_published_p%d", p.ID))
			stmts = append(stmts, `DROP TABLE `+table)
			if i > 0 {
				stmts = append(stmts, fmt.Sprintf(`DELETE FROM %s WHERE id = %d`, partitions, p.ID))
				continue
			}
			first = fmt.Sprintf("outbox_published_p%d", p.ID)
			stmts = append(stmts,
				fmt.Sprintf(`UPDATE %s SET lo = '%s', hi = '%s' WHERE id = %d`, partitions, p.Lo, p.Hi, p.ID),
				fmt.Sprintf(`CREATE TABLE %s PARTITION OF %s FOR VALUES FROM ('%s') TO ('%s')`, table, parent, p.Lo, p.Hi))
		}
		for _, stmt := range stmts {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return err
			}
		}
		return nil
	})
	require.NoError(t, err, "make the log's partitions small")
	if first == "" {
		return nil
	}
	c := &partitionChurn{e: e, first: first}
	c.initial, err = c.list()
	require.NoError(t, err)
	return c
}

// list returns the log's range partitions.
func (c *partitionChurn) list() (map[string]bool, error) {
	rows, err := c.e.DB.Pool.Query(context.Background(), `
SELECT p.relname::text FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhrelid
WHERE i.inhparent = $1::regclass AND p.relname <> 'outbox_published_default'`, c.e.DB.Table("outbox_published"))
	if err != nil {
		return nil, err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	out := make(map[string]bool, len(names))
	for _, n := range names {
		out[n] = true
	}
	return out, nil
}

// addedAndDropped reports whether the log has a partition it did not
// have when the cleaner started, and the partition the scenario's first
// messages went to is gone.
func (c *partitionChurn) addedAndDropped() bool {
	now, err := c.list()
	if err != nil {
		return false
	}
	added := false
	for p := range now {
		added = added || !c.initial[p]
	}
	return added && !now[c.first]
}

// wait waits until the maintenance services added partitions and dropped
// some. When they have not within timeout, it logs why before failing:
// the partitions and the transaction ids, the transactions of the whole
// cluster that keep the first partition open, and what holds the
// partitions no transaction writes into any more (a pass of svc), and
// the warnings the services logged.
func (c *partitionChurn) wait(t testing.TB, timeout time.Duration, svc *maintenance.Service, logs *testlog.Buffer) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !c.addedAndDropped() {
		if time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		ctx := context.Background()
		pool := c.e.DB.Pool
		var parts, clock string
		_ = pool.QueryRow(ctx, `SELECT string_agg(format('p%s [%s, %s)', id, lo, hi), ', ' ORDER BY lo) FROM `+
			c.e.DB.Table("outbox_partitions")).Scan(&parts)
		_ = pool.QueryRow(ctx, `SELECT format('next xid %s, oldest running %s',
  pg_snapshot_xmax(pg_current_snapshot()), pg_snapshot_xmin(pg_current_snapshot()))`).Scan(&clock)
		t.Logf("partitions: %s; %s (the first: %s)", parts, clock, c.first)
		rows, err := pool.Query(ctx, `
SELECT format('%s pid %s (%s, %s) xid %s for %s: %s', datname, pid, application_name, state,
              backend_xid, now() - xact_start, left(query, 200))
FROM pg_stat_activity WHERE backend_xid IS NOT NULL ORDER BY xact_start`)
		if err == nil {
			held, _ := pgx.CollectRows(rows, pgx.RowTo[string])
			for _, h := range held {
				t.Logf("transaction with an xid: %s", h)
			}
		}
		r, err := svc.RunOnce(ctx)
		t.Logf("a maintenance pass: kept %v, dropped %v, error %v", r.PartitionsKept, r.PartitionsDropped, err)
		for _, line := range logs.Lines("level=WARN") {
			t.Logf("the maintenance services warned: %s", line)
		}
		t.Fatalf("timed out after %v waiting for the maintenance services to add partitions and drop some", timeout)
	}
}

// startWhileProducing: 8 producers commit out of order (and roll back
// some) while an instance starts (a group registers FromNow). Every message
// committed after Start returned reaches it; none rolled back does.
func startWhileProducing(t *testing.T, s *Subject) {
	e := newEnv(t, s, shortRetention)
	if s.Groups {
		e.StartInstance(t, e.DB.Pool, Spec{Group: "g1"}, nil)
	}
	e.cleaner(t)
	wait := e.ProduceAsync(t, ProduceOptions{Workers: 8, Messages: 1500, PerTx: 3, Hold: 4 * time.Millisecond, Rollback: 10})
	time.Sleep(150 * time.Millisecond)
	late := "g2"
	if !s.Groups {
		late = "g1"
	}
	e.StartInstance(t, e.DB.Pool, Spec{Group: late}, nil)
	started := time.Now()
	sent := wait()
	var must []int64
	for _, id := range sent.Committed {
		if sent.CommitStarted[id].After(started) {
			must = append(must, id)
		}
	}
	require.NotEmpty(t, must, "no transaction committed after the start")
	e.WaitDelivered(t, late, must, 60*time.Second)
	e.Check(t, late, must, sent.RolledBack)
	if s.Groups {
		e.WaitDelivered(t, "g1", sent.Committed, 60*time.Second)
		e.Check(t, "g1", sent.Committed, sent.RolledBack)
	}
}

// longTransactions: a transaction holds the database's xmin back and a
// producer transaction stays open while hundreds of others commit out of
// order, cleanup running. Those others are delivered while both are open;
// the long one's messages once it commits (its xid was in progress in
// every snapshot the consumer read meanwhile); each message once.
func longTransactions(t *testing.T, s *Subject) {
	e := newEnv(t, s, shortRetention)
	e.StartInstance(t, e.DB.Pool, Spec{Group: "g1"}, nil)
	e.cleaner(t)
	release := e.HoldXmin(t)
	commitLong := e.OpenTx(t, 5)
	sent, err := e.Produce(context.Background(), ProduceOptions{Workers: 8, Messages: 600, PerTx: 3, Hold: 4 * time.Millisecond, Rollback: 10})
	require.NoError(t, err)
	e.WaitDelivered(t, "g1", sent.Committed, 60*time.Second)
	long := commitLong()
	e.WaitDelivered(t, "g1", long, 30*time.Second)
	release()
	e.Check(t, "g1", append(sent.Committed, long...), sent.RolledBack)
}

// twoInstances: every group runs two instances, each on a pool of its own
// (two processes), while producers commit out of order.
func twoInstances(t *testing.T, s *Subject) {
	e := newEnv(t, s, shortRetention)
	groups := []string{"g1"}
	if s.Groups {
		groups = append(groups, "g2")
	}
	for _, g := range groups {
		for _, i := range []string{"a", "b"} {
			e.StartInstance(t, e.instancePool(t), Spec{Group: g, Instance: g + "-" + i, BatchSize: 20}, nil)
		}
	}
	e.cleaner(t)
	sent := e.ProduceAsync(t, ProduceOptions{Workers: 8, Messages: 2000, PerTx: 3, Hold: 3 * time.Millisecond, Rollback: 10})()
	for _, g := range groups {
		e.WaitDelivered(t, g, sent.Committed, 60*time.Second)
		e.Check(t, g, sent.Committed, sent.RolledBack)
	}
}

// modeChangesUnderLoad: two groups run two instances each (each on a pool
// of its own) while producers commit out of order, cleanup deletes what
// is finished at once and partitions are dropped; meanwhile the topic's
// tracking mode changes twice, through the other two modes. Every group
// receives every message once, and once all is delivered, cleanup deletes
// every message (each was recorded as completed) and the change ends.
func modeChangesUnderLoad(t *testing.T, s *Subject) {
	e := newEnv(t, s, shortRetention)
	groups := []string{"g1", "g2"}
	for _, g := range groups {
		for _, i := range []string{"a", "b"} {
			e.StartInstance(t, e.instancePool(t), Spec{Group: g, Instance: g + "-" + i, BatchSize: 20}, nil)
		}
	}
	e.cleaner(t)
	const messages = 2000
	wait := e.ProduceAsync(t, ProduceOptions{Workers: 8, Messages: messages, PerTx: 3, Hold: 3 * time.Millisecond, Rollback: 10})
	ctx := context.Background()
	for _, mode := range []outbox.TrackingMode{outbox.Bitmap, outbox.Counter, outbox.Offset} {
		if mode == s.Tracking {
			continue
		}
		at := e.committedCount() + messages/4
		pgtest.Eventually(t, 30*time.Second, "more messages sent", func() bool { return e.committedCount() >= at })
		require.NoError(t, e.Client.ChangeTrackingMode(ctx, e.Topic.Name, mode))
	}
	require.Less(t, e.committedCount(), messages*9/10, "the producers were still sending after the last change")
	sent := wait()
	for _, g := range groups {
		e.WaitDelivered(t, g, sent.Committed, 60*time.Second)
		e.Check(t, g, sent.Committed, sent.RolledBack)
	}
	pgtest.Eventually(t, 60*time.Second, "cleanup deleting every message and ending the change", func() bool {
		tc, err := e.Client.Topic(ctx, e.Topic.Name)
		require.NoError(t, err)
		var stored bool
		require.NoError(t, e.DB.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+e.DB.Table("outbox_published")+` WHERE topic = $1)`,
			e.Topic.Name).Scan(&stored))
		return !stored && !tc.ModeChanging
	})
}

// instancePool opens a small pool of its own for one instance (another
// process), so that many scenarios in parallel stay within the server's
// connection limit.
func (e *Env) instancePool(t testing.TB) *pgxpool.Pool {
	return pgtest.NewPool(t, withParam(e.DB.DSN, "pool_max_conns", "4"))
}

// handledBy counts the ledger rows of instance (for router subjects, which
// cannot tell instances apart at the receiver: all rows).
func (e *Env) handledBy(t testing.TB, instance string) int {
	var n int
	require.NoError(t, e.DB.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM `+e.DB.Table("conformance_ledger")+` WHERE instance = $1 OR $2`, instance, e.Subject.Router).Scan(&n))
	return n
}

// killedMidBatch: a process handling a batch is killed (SIGKILL); another
// instance takes its messages over once their lease expires.
func killedMidBatch(t *testing.T, s *Subject) {
	e := newEnv(t, s, nil)
	child := e.StartChild(t, ChildSpec{Spec: Spec{Group: "g1", Instance: "doomed", Concurrency: 2, BatchSize: 20}, Slow: 30 * time.Millisecond})
	ids := e.Send(t, 200)
	pgtest.Eventually(t, 30*time.Second, "the child handling messages", func() bool { return e.handledBy(t, "doomed") >= 5 })
	child.Kill()
	<-child.Exited()
	e.StartInstance(t, e.DB.Pool, Spec{Group: "g1", Instance: "survivor"}, nil)
	e.WaitDelivered(t, "g1", ids, 60*time.Second)
	e.Check(t, "g1", ids, nil)
}

// poisonMessage: one message crashes every process that handles it. The
// process is restarted each time (a crash loop); the message is
// dead-lettered after the topic's MaxAttempts and the others are
// delivered.
func poisonMessage(t *testing.T, s *Subject) {
	e := newEnv(t, s, func(tc *outbox.TopicConfig) { tc.MaxAttempts = 3 })
	// A handler's time is not what this scenario is about: a handler slowed
	// past the topic's one-second lease by a busy machine would spend an
	// attempt too, and a message beside the poison could run out.
	spec := Spec{Group: "g1", Concurrency: 2, BatchSize: 10, HandlerTimeout: time.Minute}
	e.mu.Lock()
	poison := e.seq + 7
	e.mu.Unlock()
	cs := ChildSpec{Spec: spec, CrashOnSeq: poison, Slow: time.Millisecond}
	restarts := 0
	spec.Instance = "child-0"
	cs.Spec = spec
	child := e.StartChild(t, cs)
	ids := e.Send(t, 30)
	deadline := time.Now().Add(90 * time.Second)
	for len(e.missing(t, "g1", ids)) > 0 {
		require.True(t, time.Now().Before(deadline), "poison scenario did not settle: %d messages missing after %d restarts",
			len(e.missing(t, "g1", ids)), restarts)
		select {
		case <-child.Exited():
			restarts++
			require.LessOrEqual(t, restarts, 12, "the poison message keeps crashing the process")
			cs.Spec.Instance = "child-" + string(rune('a'+restarts))
			child = e.StartChild(t, cs)
		case <-time.After(50 * time.Millisecond):
		}
	}
	r := e.Check(t, "g1", ids, nil)
	require.True(t, e.DeadLettered(t, "g1")[ids[6]], "the poison message is dead-lettered")
	// A crash spends an attempt of every message the process held (like a
	// receive count); a group retries apart from each other the messages
	// that were in flight in two crashes in a row, so only the poison runs
	// out.
	require.Equal(t, 1, r.DeadLettered, "only the poison message is dead-lettered (it crashed %d processes)", restarts)
}

// hungHandler: one message's handler hangs on its first attempt and
// ignores its context. The rest of the group's messages are delivered long
// before that message's lease would end, and the hung message is retried
// and delivered.
func hungHandler(t *testing.T, s *Subject) {
	e := newEnv(t, s, func(tc *outbox.TopicConfig) { tc.Lease = 30 * time.Second })
	release := make(chan struct{})
	var hung atomic.Bool
	hangs := make(chan int64, 1)
	b := func(ctx context.Context, d *outbox.Delivery, seq int) error {
		if d.Attempt <= 1 && hung.CompareAndSwap(false, true) { // (a receiver does not see attempts)
			hangs <- d.ID
			<-release // ignores ctx
		}
		return nil
	}
	spec := Spec{Group: "g1", Concurrency: 4, BatchSize: 50, HandlerTimeout: 300 * time.Millisecond}
	if !s.Groups {
		e = newEnv(t, s, nil) // QUEUE handlers end with their lease (1s)
	}
	e.StartInstance(t, e.DB.Pool, spec, b)
	t.Cleanup(func() { close(release) }) // runs before the instance's Stop
	ids := e.Send(t, 200)
	var hungID int64
	select {
	case hungID = <-hangs:
	case <-time.After(20 * time.Second):
		t.Fatal("no handler hung")
	}
	var others []int64
	for _, id := range ids {
		if id != hungID {
			others = append(others, id)
		}
	}
	// The bound is a third of the group's 30 s lease: had the others waited
	// for the hung handler, they would have waited for its lease to end.
	// It says nothing about the machine's speed.
	e.WaitDelivered(t, "g1", others, 10*time.Second)
	e.WaitDelivered(t, "g1", ids, 30*time.Second)
	e.Check(t, "g1", ids, nil)
	if !s.Router {
		require.Equal(t, []int{2}, e.Handled(t, "g1")[hungID], "the hung message is delivered by its retry")
	}
}

// stopStart: an instance is stopped gracefully in the middle of its work
// and another starts: nothing it finished is handled again, and the next
// instance says nothing is wrong.
func stopStart(t *testing.T, s *Subject) {
	logs := &logRecorder{}
	logger := slog.New(logs)
	// A lease long enough that a loaded machine never lets one run out:
	// this scenario is about stopping, not about lease expiry.
	e := newEnv(t, s, func(tc *outbox.TopicConfig) { tc.Lease = 10 * time.Second })
	slow := func(ctx context.Context, d *outbox.Delivery, seq int) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
			return nil
		}
	}
	a := e.StartInstance(t, e.DB.Pool, Spec{Group: "g1", Instance: "first", Logger: logger}, slow)
	ids := e.Send(t, 300)
	pgtest.Eventually(t, 30*time.Second, "the first instance handling messages", func() bool { return e.handledBy(t, "first") >= 40 })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	_ = a.Stop(ctx) // may cut handlers off: their messages are released
	cancel()
	e.StartInstance(t, e.DB.Pool, Spec{Group: "g1", Instance: "second", Logger: logger}, slow)
	e.WaitDelivered(t, "g1", ids, 60*time.Second)
	e.Check(t, "g1", ids, nil)
	if s.Router {
		return // a call cut off by Stop's deadline may have reached the receiver: duplicates are counted above
	}
	e.CheckNoDuplicates(t, "g1")
	warnings := logs.atLeast(slog.LevelWarn)
	if s.PgBouncer {
		// Through PgBouncer the LISTEN connection has no session of its
		// own, and each client says so once its check of it gives up,
		// 5 s after its first instance started: on a loaded machine
		// that comes before the scenario's end. It is the setup's word,
		// not the stop's.
		warnings = slices.DeleteFunc(warnings, func(w string) bool {
			return strings.Contains(w, "settings give no session of its own")
		})
	}
	require.Empty(t, warnings, "a graceful stop and start logged warnings")
}

// stopOutlivedByHandler: an instance is stopped with a short deadline
// while its handlers run, and they do not return when cancelled: they
// finish their work 5 s later. Stop gives up on them, and another
// instance handles their messages again. That is a duplicate a stop with
// a deadline allows, but not a silent one: the attempt the handler was
// given is spent, so the second delivery says it is attempt 2 (a handler
// keeping its effects idempotent by attempt sees it).
func stopOutlivedByHandler(t *testing.T, s *Subject) {
	// Leases and handler timeouts far longer than the scenario: only
	// Stop ends a handler's call.
	e := newEnv(t, s, func(tc *outbox.TopicConfig) { tc.Lease = 10 * time.Second })
	var started atomic.Int64
	stubborn := func(ctx context.Context, d *outbox.Delivery, seq int) error {
		started.Add(1)
		time.Sleep(5 * time.Second) // ctx is not looked at; Stop gives up on the call after a second
		return nil
	}
	a := e.StartInstance(t, e.DB.Pool, Spec{Group: "g1", Instance: "first", HandlerTimeout: time.Minute}, stubborn)
	ids := e.Send(t, 40)
	pgtest.Eventually(t, 30*time.Second, "the first instance's handlers running", func() bool { return started.Load() > 0 })
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	err := a.Stop(ctx)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded, "Stop returned before handlers that ignore cancellation did")
	e.StartInstance(t, e.DB.Pool, Spec{Group: "g1", Instance: "second"}, nil)
	e.WaitDelivered(t, "g1", ids, 60*time.Second)
	pgtest.Eventually(t, 30*time.Second, "the first instance's handlers finishing their work", func() bool {
		return e.handledBy(t, "first") == int(started.Load())
	})
	r := e.Check(t, "g1", ids, nil)
	require.Equal(t, int(started.Load()), r.Duplicates, "every message whose handler outlived Stop is handled again, and no other")
}

// cancelUnstarted: a Group value that was never started cancels its
// group's subscription beside live groups; the live groups lose nothing
// and the cancelled group pins no message.
func cancelUnstarted(t *testing.T, s *Subject) {
	e := newEnv(t, s, shortRetention)
	ctx := context.Background()
	for _, g := range []string{"g1", "g2"} { // both subscribed, neither running
		in := e.StartInstance(t, e.DB.Pool, Spec{Group: g, Instance: g + "-first"}, nil)
		require.NoError(t, in.Stop(ctx))
	}
	ids := e.Send(t, 200)
	g2, err := e.NewGroup(e.DB.Pool, Spec{Group: "g2", Instance: "admin"})
	require.NoError(t, err)
	require.NoError(t, g2.Cancel(ctx))
	require.NoError(t, g2.Cancel(ctx), "a second Cancel finishes what the first left, or does nothing")
	st, err := g2.State(ctx)
	require.NoError(t, err)
	require.Equal(t, consumergroup.Cancelled, st)

	e.StartInstance(t, e.DB.Pool, Spec{Group: "g1", Instance: "g1-second"}, nil)
	ids = append(ids, e.Send(t, 100)...)
	e.WaitDelivered(t, "g1", ids, 60*time.Second)
	e.Check(t, "g1", ids, nil)

	// Nothing waits for the cancelled group: cleanup empties the topic.
	e.cleaner(t)
	pgtest.Eventually(t, 20*time.Second, "cleanup to delete every message", func() bool {
		var n int
		require.NoError(t, e.DB.Pool.QueryRow(ctx, `SELECT count(*) FROM `+e.DB.Table("outbox_published")).Scan(&n))
		return n == 0
	})
}

// state reads group's subscription state.
func (e *Env) state(t testing.TB, group string) consumergroup.State {
	var st string
	require.NoError(t, e.DB.Pool.QueryRow(context.Background(), `SELECT subscription_status FROM `+
		e.DB.Table("outbox_topic_subscriptions")+` WHERE topic = $1 AND group_name = $2`, e.Topic.Name, group).Scan(&st))
	return consumergroup.State(st)
}

// resurrectAfterFreeze: a group's only process freezes (SIGSTOP) past its
// heartbeat timeout while producers write; another group declares it
// DEAD. When the process continues, the group comes back and receives
// every message: those it owed when it died and those written while it
// was DEAD.
func resurrectAfterFreeze(t *testing.T, s *Subject) {
	e := newEnv(t, s, nil)
	fast := Spec{HeartbeatInterval: 100 * time.Millisecond, HeartbeatTimeout: time.Second}
	g1 := fast
	g1.Group = "g1"
	e.StartInstance(t, e.DB.Pool, g1, nil)
	g2 := fast
	g2.Group, g2.Instance = "g2", "frozen"
	child := e.StartChild(t, ChildSpec{Spec: g2, Slow: time.Millisecond})
	wait := e.ProduceAsync(t, ProduceOptions{Workers: 4, Messages: 1200, PerTx: 2, Hold: 2 * time.Millisecond, Pause: 5 * time.Millisecond})
	time.Sleep(300 * time.Millisecond)
	child.Freeze()
	pgtest.Eventually(t, 20*time.Second, "g2 declared DEAD", func() bool { return e.state(t, "g2") == consumergroup.Dead })
	time.Sleep(500 * time.Millisecond)
	child.Thaw()
	sent := wait()
	e.WaitDelivered(t, "g1", sent.Committed, 60*time.Second)
	e.Check(t, "g1", sent.Committed, nil)
	e.WaitDelivered(t, "g2", sent.Committed, 60*time.Second)
	e.Check(t, "g2", sent.Committed, nil)
}

// resurrectByStart: a group is stopped for longer than its heartbeat
// timeout (a slow deploy) and becomes DEAD; a new instance's Start brings
// it back with everything it owed and everything written meanwhile.
func resurrectByStart(t *testing.T, s *Subject) {
	e := newEnv(t, s, nil)
	fast := Spec{HeartbeatInterval: 100 * time.Millisecond, HeartbeatTimeout: time.Second}
	g1 := fast
	g1.Group = "g1"
	e.StartInstance(t, e.DB.Pool, g1, nil)
	g2 := fast
	g2.Group, g2.Instance = "g2", "before"
	slow := func(ctx context.Context, d *outbox.Delivery, seq int) error {
		time.Sleep(2 * time.Millisecond)
		return nil
	}
	old := e.StartInstance(t, e.DB.Pool, g2, slow)
	ids := e.Send(t, 300)
	pgtest.Eventually(t, 30*time.Second, "g2 handling", func() bool { return e.handledBy(t, "before") >= 20 })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
	_ = old.Stop(ctx)
	cancel()
	ids = append(ids, e.Send(t, 100)...)
	pgtest.Eventually(t, 20*time.Second, "g2 declared DEAD", func() bool { return e.state(t, "g2") == consumergroup.Dead })
	ids = append(ids, e.Send(t, 100)...)
	g2.Instance = "after"
	e.StartInstance(t, e.DB.Pool, g2, nil)
	ids = append(ids, e.Send(t, 50)...)
	e.WaitDelivered(t, "g2", ids, 60*time.Second)
	e.Check(t, "g2", ids, nil)
	e.WaitDelivered(t, "g1", ids, 60*time.Second)
	e.Check(t, "g1", ids, nil)
}

// forgetRacesCompletion: three groups; the second is declared DEAD over
// and over while it completes messages (and comes back each time), and
// cleanup runs all along. The other two groups lose nothing: forgetting
// the second group never counts its completions for them.
func forgetRacesCompletion(t *testing.T, s *Subject) {
	e := newEnv(t, s, shortRetention)
	ctx := context.Background()
	hb := Spec{HeartbeatInterval: 50 * time.Millisecond, HeartbeatTimeout: time.Minute}
	for _, g := range []string{"g1", "g2", "g3"} {
		spec := hb
		spec.Group = g
		var b Behaviour
		switch g {
		case "g2":
			spec.BatchSize = 10 // many small completions for forgetting to race with
		case "g3":
			b = func(ctx context.Context, d *outbox.Delivery, seq int) error {
				time.Sleep(4 * time.Millisecond)
				return nil
			}
		}
		e.StartInstance(t, e.DB.Pool, spec, b)
	}
	e.cleaner(t)
	detector, err := e.NewGroup(e.DB.Pool, Spec{Group: "detector"})
	require.NoError(t, err)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			_, _ = e.DB.Pool.Exec(ctx, `UPDATE `+e.DB.Table("outbox_topic_subscriptions")+`
SET last_heartbeat_at = now() - interval '1 hour' WHERE group_name = 'g2' AND subscription_status = 'ACTIVE'`)
			detector.DetectDeadGroups(ctx)
		}
	}()
	sent := e.ProduceAsync(t, ProduceOptions{Workers: 8, Messages: 1500, PerTx: 3, Hold: 2 * time.Millisecond, Pause: time.Millisecond})()
	close(stop)
	wg.Wait()
	for _, g := range []string{"g1", "g3"} {
		e.WaitDelivered(t, g, sent.Committed, 60*time.Second)
		e.Check(t, g, sent.Committed, nil)
	}
	e.Check(t, "g2", nil, nil) // what it missed while DEAD was deleted: no rule but no double first attempts
}

// pauseResume: Pause and Resume reach every running instance within a
// poll interval, and an instance started while the group is paused
// fetches nothing.
func pauseResume(t *testing.T, s *Subject) {
	e := newEnv(t, s, nil)
	ctx := context.Background()
	spec := Spec{Group: "g1", PollInterval: 50 * time.Millisecond, HeartbeatInterval: 10 * time.Second}
	for _, i := range []string{"a", "b"} {
		spec.Instance = i
		e.StartInstance(t, e.instancePool(t), spec, nil)
	}
	warm := e.Send(t, 10)
	e.WaitDelivered(t, "g1", warm, 30*time.Second)
	admin, err := e.NewGroup(e.DB.Pool, Spec{Group: "g1", Instance: "admin"})
	require.NoError(t, err)
	require.NoError(t, admin.Pause(ctx))
	time.Sleep(3 * spec.PollInterval)
	ids := e.Send(t, 20)
	time.Sleep(10 * spec.PollInterval)
	require.Empty(t, e.handledOf(t, "g1", ids), "paused group handled messages")
	spec.Instance = "c"
	e.StartInstance(t, e.instancePool(t), spec, nil)
	time.Sleep(10 * spec.PollInterval)
	require.Empty(t, e.handledOf(t, "g1", ids), "an instance started while paused handled messages")
	require.NoError(t, admin.Resume(ctx))
	e.WaitDelivered(t, "g1", ids, 3*time.Second)
	e.Check(t, "g1", append(warm, ids...), nil)
}

func (e *Env) handledOf(t testing.TB, group string, ids []int64) []int64 {
	handled := e.Handled(t, group)
	var out []int64
	for _, id := range ids {
		if len(handled[id]) > 0 {
			out = append(out, id)
		}
	}
	return out
}

// logRecorder is a slog.Handler that keeps every record.
type logRecorder struct {
	mu      sync.Mutex
	records []slog.Record
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.records = append(l.records, r)
	return nil
}
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecorder) WithGroup(string) slog.Handler      { return l }

func (l *logRecorder) atLeast(level slog.Level) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, r := range l.records {
		if r.Level >= level {
			out = append(out, r.Level.String()+" "+r.Message)
		}
	}
	return out
}

// xidsCrossAPowerOfTen: the transactions of one snapshot pair have ids on
// both sides of a power of ten (as every database's do, at 10^6 and
// beyond), and the pair holds more than one batch. Every message is
// delivered once: sorting the pair's rows by the text of their ids skipped
// the ones below the power of ten for good here.
func xidsCrossAPowerOfTen(t *testing.T, s *Subject) {
	e := newEnv(t, s, nil)
	ctx := context.Background()
	spec := Spec{Group: "g1", BatchSize: 7}
	first := e.StartInstance(t, e.DB.Pool, spec, nil)
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, first.Stop(stopCtx)) // the group stays subscribed: the messages wait for it
	ids := e.Send(t, 14)
	xids, position := pgtest.XidsAcrossPowerOfTen(t, e.DB.Pool, 5, 9) // five ids below the power of ten, nine from it
	for i, id := range ids {
		_, err := e.DB.Pool.Exec(ctx, `UPDATE `+e.DB.Table("outbox_published")+` SET xid = $2::xid8 WHERE id = $1`, id, xids[i])
		require.NoError(t, err)
	}
	// The group's next pair starts before all of them.
	_, err := e.DB.Pool.Exec(ctx, `UPDATE `+e.DB.Table("outbox_subscription_offsets")+`
SET position = $1::pg_snapshot, pair_cur = NULL, resume_xid = NULL, resume_id = NULL`, position)
	require.NoError(t, err)
	spec.Instance = "g1-after"
	e.StartInstance(t, e.DB.Pool, spec, nil)
	e.WaitDelivered(t, "g1", ids, 30*time.Second)
	e.Check(t, "g1", ids, nil)
	e.CheckNoDuplicates(t, "g1")
}

// backfillBesideNew: 600 messages are stored before a group subscribes
// from the beginning with Backfill; its instance runs in a child process.
// Messages sent after it started are delivered while the backfill still
// reads the old ones (they used to wait for the whole backfill), except in
// an ordered group, where they come after the old messages of their
// message group (Check asserts it). The
// child is killed (SIGKILL) mid-backfill; a new instance resumes the
// backfill from its last checkpoint: every message is delivered, none
// twice but those of the batches in flight at the kill (once their lease
// expired).
func backfillBesideNew(t *testing.T, s *Subject) {
	e := newEnv(t, s, nil)
	old := e.Send(t, 600) // no group yet: kept for the zero-subscription floor
	spec := Spec{Group: "late", Instance: "doomed", Concurrency: 2, BatchSize: 20,
		Start: consumergroup.SubscriptionOptions{Position: consumergroup.StartBeginning, Backfill: true, BackfillBatchSize: 20}}
	child := e.StartChild(t, ChildSpec{Spec: spec, Slow: 5 * time.Millisecond})
	fresh := e.Send(t, 20)
	if !s.Ordered { // an ordered group's new messages wait for the old ones of their message group
		pgtest.Eventually(t, 30*time.Second, "new messages delivered during the backfill", func() bool {
			return len(e.missing(t, "late", fresh)) == 0
		})
	}
	require.Less(t, 600-len(e.missing(t, "late", old)), 600, "the backfill had ended: the test proves nothing")
	pgtest.Eventually(t, 30*time.Second, "the backfill under way", func() bool { return e.handledBy(t, "doomed") >= 150 })
	child.Kill()
	<-child.Exited()
	spec.Instance = "survivor"
	e.StartInstance(t, e.DB.Pool, spec, nil)
	all := append(old, fresh...)
	e.WaitDelivered(t, "late", all, 60*time.Second)
	e.Check(t, "late", all, nil)
	// The end is recorded by the read that finds nothing more, which may
	// come after the last delivery.
	pgtest.Eventually(t, 10*time.Second, "the backfill's end recorded", func() bool {
		var outcome string
		require.NoError(t, e.DB.Pool.QueryRow(context.Background(), `SELECT coalesce(backfill_outcome, '') FROM `+
			e.DB.Table("outbox_subscription_offsets")).Scan(&outcome))
		return outcome == consumergroup.BackfillDone
	})
}

// ExactlyOnceMessagesEnv names the environment variable that sets how
// many messages AckInTxExactlyOnceThroughKills sends (2,000 by default).
const ExactlyOnceMessagesEnv = "PGOUTBOX_EXACTLY_ONCE_MESSAGES"

// exactlyOnceThroughKills: handlers record their effect and ack in one
// transaction, in two processes that are killed (SIGKILL) at random
// moments, mid-transaction among others, and replaced, over and over:
// every message has exactly one effect, and some were redelivered (the
// kills did land while messages were in flight).
func exactlyOnceThroughKills(t *testing.T, s *Subject) {
	n := 2000
	if v, err := strconv.Atoi(os.Getenv(ExactlyOnceMessagesEnv)); err == nil && v > 0 {
		n = v
	}
	e := newEnv(t, s, nil)
	started := 0
	spec := func() ChildSpec {
		started++
		return ChildSpec{Spec: Spec{Group: "g1", Instance: fmt.Sprintf("child-%d", started), Concurrency: 4, BatchSize: 20},
			Slow: 10 * time.Millisecond, AckInTx: true}
	}
	children := []*Child{e.StartChild(t, spec()), e.StartChild(t, spec())}
	ids := e.Send(t, n)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0))
	kills := 0
	deadline := time.Now().Add(5 * time.Minute)
	for len(e.missing(t, "g1", ids)) > 0 && time.Now().Before(deadline) {
		time.Sleep(time.Duration(100+rng.IntN(400)) * time.Millisecond)
		i := rng.IntN(len(children))
		children[i].Kill()
		<-children[i].Exited()
		kills++
		children[i] = e.StartChild(t, spec())
	}
	e.WaitDelivered(t, "g1", ids, 60*time.Second)
	time.Sleep(200 * time.Millisecond) // room for a wrong redelivery to show
	e.CheckNoDuplicates(t, "g1")
	e.Check(t, "g1", ids, nil)
	var redelivered int
	require.NoError(t, e.DB.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM `+e.DB.Table("conformance_ledger")+` WHERE attempt > 1`).Scan(&redelivered))
	t.Logf("%d messages, %d kills, %d handled after a lost attempt", n, kills, redelivered)
	require.GreaterOrEqual(t, kills, 2)
	require.Positive(t, redelivered, "no kill landed while a message was in flight")
}

// workSpreads: three processes share a backlog of 2,000 slow messages
// (100 ms each), with batches of up to 1,000 (a QUEUE consumer's
// default): ten times what a process's handlers finish in a second, and
// two batches would leave the third process nothing. Work spreads when
// every process stays busy until the backlog is gone: none holds more
// than its handlers finish soon (see pipeline.Window), which would leave
// it working while the others sit idle. So the processes finish within
// 15% of the ideal makespan (every handler slot of every process busy
// from first to last) of one another, and each handles at least a quarter
// of the backlog. The processes' finishing times are compared with each
// other rather than the makespan with the ideal: a busy machine slows all
// three alike. Ordered subjects are left out (their message groups, not
// the processes, bound how much runs at once), and so are router subjects
// (their receiver cannot tell the processes apart; the router's sources
// fetch as the queue and group subjects do).
func workSpreads(t *testing.T, s *Subject) {
	if s.Ordered {
		t.Skip("an ordered topic runs one message per message group at a time")
	}
	if s.Router {
		t.Skip("the receiver cannot tell which process delivered a message")
	}
	const procs, concurrency, n, slow = 3, 10, 2000, 100 * time.Millisecond
	e := newEnv(t, s, nil)
	for i := range procs {
		e.StartChild(t, ChildSpec{Spec: Spec{Group: "g1", Instance: fmt.Sprintf("p%d", i), Concurrency: concurrency,
			BatchSize: 1000}, Slow: slow})
	}
	// Every process is running before the backlog is sent: a loaded
	// machine can take seconds to start one, and the others would have
	// handled everything meanwhile (the suite at twice its parallelism:
	// [984 1006 10] handled).
	e.waitRecordedAlive(t, procs)
	ids := e.Send(t, n)
	e.WaitDelivered(t, "g1", ids, 3*time.Minute)
	e.Check(t, "g1", ids, nil)

	rows, err := e.DB.Pool.Query(context.Background(), `SELECT instance, count(*), max(handled_at) - min(min(handled_at)) OVER ()
FROM `+e.DB.Table("conformance_ledger")+` WHERE grp = 'g1' GROUP BY instance ORDER BY instance`)
	require.NoError(t, err)
	var finished []time.Duration // since the first handling, per process
	var handled []int
	var instance string
	var count int
	var done time.Duration
	_, err = pgx.ForEachRow(rows, []any{&instance, &count, &done}, func() error {
		finished, handled = append(finished, done+slow), append(handled, count)
		return nil
	})
	require.NoError(t, err)
	require.Len(t, finished, procs, "every process handled messages")
	ideal := n * slow / (procs * concurrency)
	makespan, spread := slices.Max(finished), slices.Max(finished)-slices.Min(finished)
	t.Logf("makespan %v, ideal %v (%.2fx); processes finished within %v of one another; handled per process: %v",
		makespan, ideal, float64(makespan)/float64(ideal), spread, handled)
	require.LessOrEqual(t, spread, ideal*15/100, "the processes finished within 15%% of the ideal makespan of one another")
	for i, h := range handled {
		require.GreaterOrEqual(t, h, n/4, "process p%d handled a quarter of the backlog or more", i)
	}
}

// frozenMember: a member of group b, in a process of its own, is frozen
// (SIGSTOP) for 15 s while it acks messages in its handlers' transactions
// (each holds one open, with what the ack wrote and locked). Group a,
// handling the same messages meanwhile, goes on at its pace: its pickup
// p99 (commit to handling) while b is frozen stays within twice its p99
// before, or within a second. The failure this guards against is
// seconds: a group that waited for another's locks handled nothing until
// the frozen transaction ended (10 s, when the server ended it). On a
// quiet machine the p99 during the freeze is within the twice; beside a
// second copy of the suite it was three times a 66 ms p99 before, the
// machine's load, not the frozen member's. Group b, thawed, loses
// nothing.
func frozenMember(t *testing.T, s *Subject) {
	if s.Router {
		t.Skip("a router's receiver acks nothing in a transaction of ours")
	}
	e := newEnv(t, s, nil)
	b := e.StartChild(t, ChildSpec{Spec: Spec{Group: "b", Instance: "frozen", Concurrency: 4}, AckInTx: true,
		Slow: 20 * time.Millisecond})
	e.StartInstance(t, e.DB.Pool, Spec{Group: "a", Instance: "a"}, nil)
	wait := e.ProduceAsync(t, ProduceOptions{Workers: 1, Messages: 2500, PerTx: 1, Pause: 10 * time.Millisecond})
	time.Sleep(8 * time.Second)
	frozeAt := time.Now()
	b.Freeze()
	time.Sleep(15 * time.Second)
	thawedAt := time.Now()
	b.Thaw()
	sent := wait()
	e.WaitDelivered(t, "a", sent.Committed, time.Minute)
	e.WaitDelivered(t, "b", sent.Committed, 2*time.Minute)
	e.Check(t, "a", sent.Committed, sent.RolledBack)
	e.Check(t, "b", sent.Committed, sent.RolledBack)

	handledAt := map[int64]time.Time{}
	rows, err := e.DB.Pool.Query(context.Background(), `SELECT message_id, min(handled_at) FROM `+
		e.DB.Table("conformance_ledger")+` WHERE grp = 'a' GROUP BY message_id`)
	require.NoError(t, err)
	var id int64
	var at time.Time
	_, err = pgx.ForEachRow(rows, []any{&id, &at}, func() error { handledAt[id] = at; return nil })
	require.NoError(t, err)
	var before, during []time.Duration
	for id, committed := range sent.CommitStarted {
		pickup := handledAt[id].Sub(committed)
		switch {
		case committed.After(frozeAt.Add(-6*time.Second)) && committed.Before(frozeAt):
			before = append(before, pickup)
		case committed.After(frozeAt) && committed.Before(thawedAt):
			during = append(during, pickup)
		}
	}
	require.NotEmpty(t, before)
	require.NotEmpty(t, during)
	p99 := func(d []time.Duration) time.Duration {
		slices.Sort(d)
		return d[len(d)*99/100]
	}
	t.Logf("group a's pickup p99: %v before b froze (%d messages), %v while it was frozen (%d)",
		p99(before), len(before), p99(during), len(during))
	require.LessOrEqual(t, p99(during), max(2*p99(before), time.Second),
		"group a slowed down while a member of group b was frozen")
}
