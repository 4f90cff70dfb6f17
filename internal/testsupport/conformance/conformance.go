// Package conformance is pgoutbox's delivery conformance suite: one set of
// scenarios that every delivery path (QUEUE consumers, consumer groups in
// each tracking mode, and the paths built on them) must pass.
//
// Each scenario runs real consumers against a real PostgreSQL, with real
// faults: producers committing out of order and rolling back, a process
// killed or frozen mid-batch, a poison message that crashes its process, a
// handler that hangs, groups cancelled, paused, declared DEAD and coming
// back. What was committed is recorded by the producers; what was handled
// is recorded by the handlers in a ledger table in the database (so child
// processes record too). Every scenario then checks, per group and per
// message: delivered or dead-lettered, never neither; no rolled-back
// message delivered; duplicates only after a lease expired (a message
// handled twice with Attempt 1 both times is a bug).
package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/maintenance"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/router"
)

// Payload is what the suite's producers send.
type Payload struct {
	Seq int `json:"seq"`
}

// Env is one scenario's world: a private database, a client, a producer
// and the configured topic.
type Env struct {
	DB       *pgtest.DB
	Client   *outbox.Client
	Producer *outbox.Producer
	Topic    outbox.TopicConfig
	Subject  *Subject

	receiver *receiver // router subjects

	mu     sync.Mutex
	seq    int
	sent   map[int64]int  // id -> seq of committed messages
	groups map[int]string // seq -> message group (ordered subjects)
}

// newEnv makes a database, configures s's topic with the scenario's
// changes and creates the ledger.
func newEnv(t *testing.T, s *Subject, topic func(*outbox.TopicConfig)) *Env {
	t.Helper()
	db := pgtest.NewDB(t)
	if s.PgBouncer { // every pool of the scenario goes through it
		db.DSN = pgtest.PgBouncer(t, db)
		db.Pool = pgtest.NewPool(t, db.DSN)
	}
	if s.ExecMode != "" { // every pool of the scenario uses the mode
		db.DSN = withParam(db.DSN, "default_query_exec_mode", s.ExecMode)
		db.Pool = pgtest.NewPool(t, db.DSN)
	}
	client, err := outbox.NewClient(db.Pool, outbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	producer, err := outbox.NewProducer(outbox.ProducerConfig{Schema: db.Schema, AllowUnconfiguredTopics: true})
	require.NoError(t, err)
	tc := outbox.TopicConfig{Name: "conformance", Semantics: s.Semantics, Tracking: s.Tracking,
		MaxAttempts: 5, BackoffInitial: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond, Lease: time.Second}
	if s.Ordered {
		// Skipping, not blocking: scenarios dead-letter poison messages and
		// expect the rest of the topic delivered.
		tc.Ordered, tc.OrderedDeadLetters = true, outbox.SkipDeadLetters
	}
	if topic != nil {
		topic(&tc)
	}
	require.NoError(t, client.ConfigureTopic(context.Background(), tc))
	_, err = db.Pool.Exec(context.Background(), `
CREATE TABLE `+db.Table("conformance_ledger")+` (
    grp        text        NOT NULL,
    message_id bigint      NOT NULL,
    seq        int         NOT NULL,
    attempt    int         NOT NULL,
    instance   text        NOT NULL,
    handled_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE `+db.Table("conformance_started")+` (message_id bigint NOT NULL)`)
	require.NoError(t, err)
	// Every scenario runs beside a maintenance service, as production does
	// (pgoutbox.Client runs one), working at a quick pace.
	maint, err := maintenance.New(db.Pool, maintenance.Config{Client: client, DeadGroupInterval: 300 * time.Millisecond,
		CleanupInterval: 500 * time.Millisecond, SubscriptionCleanupInterval: time.Second, BatchSize: 200})
	require.NoError(t, err)
	require.NoError(t, maint.Start(context.Background()))
	t.Cleanup(func() { _ = maint.Stop(context.Background()) })
	e := &Env{DB: db, Client: client, Producer: producer, Topic: tc.WithDefaults(), Subject: s, sent: map[int64]int{}, groups: map[int]string{}}
	if s.Router {
		e.startReceiver(t)
	}
	return e
}

// withParam adds a connection parameter to a postgres:// URL.
func withParam(dsn, key, value string) string {
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	return dsn + sep + key + "=" + value
}

// record writes a handling to the ledger. Handlers call it before they
// return nil, so the ledger holds exactly the successful handlings.
func record(ctx context.Context, db outbox.Executor, schema, group, instance string, d *outbox.Delivery) error {
	p, err := outbox.Decode[Payload](d)
	if err != nil {
		return outbox.Permanent(err)
	}
	_, err = db.Exec(context.WithoutCancel(ctx), `INSERT INTO `+quote(schema)+`.conformance_ledger (grp, message_id, seq, attempt, instance)
VALUES ($1, $2, $3, $4, $5)`, group, d.ID, p.Seq, d.Attempt, instance)
	return err
}

func quote(s string) string { return pgx.Identifier{s}.Sanitize() }

// Behaviour shapes a handler: it runs before the handling is recorded; a
// non-nil error is the handler's result (and nothing is recorded).
type Behaviour func(ctx context.Context, d *outbox.Delivery, seq int) error

// Handler returns a handler that records every successful handling of
// group by instance in the ledger, after b (which may be nil).
func (e *Env) Handler(group, instance string, b Behaviour) outbox.Handler {
	return func(ctx context.Context, d *outbox.Delivery) error {
		if b != nil {
			p, err := outbox.Decode[Payload](d)
			if err != nil {
				return outbox.Permanent(err)
			}
			if err := b(ctx, d, p.Seq); err != nil {
				return err
			}
		}
		return record(ctx, e.DB.Pool, e.DB.Schema, group, instance, d)
	}
}

// Sent is the outcome of a producer run.
type Sent struct {
	Committed  []int64
	RolledBack []int64
	// CommitStarted is when each committed message's Commit was called.
	CommitStarted map[int64]time.Time
}

// ProduceOptions shape a producer run.
type ProduceOptions struct {
	Workers  int           // concurrent producers (8)
	Messages int           // total messages, committed or not
	PerTx    int           // messages per transaction (1..PerTx, random)
	Hold     time.Duration // each transaction stays open up to this long (random) before it ends
	Rollback int           // one transaction in Rollback rolls back (0: none)
	Pause    time.Duration // pause between transactions of one producer
}

// Produce runs producers until o.Messages were written (committed or
// rolled back) or ctx ends. Transactions hold random times open, so they
// commit in a different order than they took their ids.
func (e *Env) Produce(ctx context.Context, o ProduceOptions) (*Sent, error) {
	o.Workers = max(o.Workers, 1)
	o.PerTx = max(o.PerTx, 1)
	out := &Sent{CommitStarted: map[int64]time.Time{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	var errs []error
	budget := make(chan struct{}, o.Messages)
	for range o.Messages {
		budget <- struct{}{}
	}
	close(budget)
	for w := range o.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			for ctx.Err() == nil {
				n := 1 + rng.IntN(o.PerTx)
				taken := 0
				for range n {
					if _, ok := <-budget; !ok {
						break
					}
					taken++
				}
				if taken == 0 {
					return
				}
				ids, started, rolledBack, err := e.produceTx(ctx, rng, taken, o)
				mu.Lock()
				if err != nil {
					if ctx.Err() == nil {
						errs = append(errs, err)
					}
				} else if rolledBack {
					out.RolledBack = append(out.RolledBack, ids...)
				} else {
					out.Committed = append(out.Committed, ids...)
					for _, id := range ids {
						out.CommitStarted[id] = started
					}
				}
				mu.Unlock()
				if o.Pause > 0 {
					time.Sleep(o.Pause)
				}
			}
		}()
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// ProduceAsync runs Produce in the background; the returned function
// waits for it and fails the test on producer errors.
func (e *Env) ProduceAsync(t testing.TB, o ProduceOptions) func() *Sent {
	var sent *Sent
	var err error
	done := make(chan struct{})
	go func() { defer close(done); sent, err = e.Produce(context.Background(), o) }()
	return func() *Sent {
		t.Helper()
		<-done
		require.NoError(t, err, "producers")
		return sent
	}
}

func (e *Env) produceTx(ctx context.Context, rng *rand.Rand, n int, o ProduceOptions) ([]int64, time.Time, bool, error) {
	tx, err := e.DB.Pool.Begin(ctx)
	if err != nil {
		return nil, time.Time{}, false, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	ids, seqs, err := e.sendIn(ctx, tx, n, false)
	if err != nil {
		return nil, time.Time{}, false, err
	}
	if o.Hold > 0 {
		time.Sleep(time.Duration(rng.Int64N(int64(o.Hold))))
	}
	if o.Rollback > 0 && rng.IntN(o.Rollback) == 0 {
		return ids, time.Time{}, true, tx.Rollback(ctx)
	}
	started := time.Now()
	if err := tx.Commit(ctx); err != nil {
		return nil, time.Time{}, false, err
	}
	e.committed(ids, seqs)
	return ids, started, false, nil
}

// sendIn sends n messages with the next sequence numbers in tx. On an
// ordered subject they go to the OrderedGroups groups in turn, or, when
// held (the transaction will stay open while others send), to a group of
// their own: a send to an ordered group waits for the group's open
// transactions.
func (e *Env) sendIn(ctx context.Context, tx pgx.Tx, n int, held bool) (ids []int64, seqs []int, err error) {
	msgs := make([]outbox.Message, n)
	seqs = make([]int, n)
	e.mu.Lock()
	for i := range msgs {
		e.seq++
		seqs[i] = e.seq
		p, _ := json.Marshal(Payload{Seq: e.seq})
		msgs[i] = outbox.Message{Topic: e.Topic.Name, Payload: p}
		if e.Subject.Ordered {
			msgs[i].Group = fmt.Sprintf("k%d", e.seq%OrderedGroups)
			if held {
				msgs[i].Group = "held"
			}
			e.groups[e.seq] = msgs[i].Group
		}
		if e.receiver != nil {
			msgs[i].Headers = map[string]string{router.HeaderPool: "P", router.HeaderTarget: e.receiver.url}
		}
	}
	e.mu.Unlock()
	ids, err = e.Producer.SendBatch(ctx, tx, msgs)
	return ids, seqs, err
}

// committed records messages whose transaction committed.
func (e *Env) committed(ids []int64, seqs []int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, id := range ids {
		e.sent[id] = seqs[i]
	}
}

// committedCount is how many messages were committed so far.
func (e *Env) committedCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.sent)
}

// OpenTx sends n messages in a transaction on a connection of its own and
// leaves it open; commit commits it and returns the messages' ids.
func (e *Env) OpenTx(t testing.TB, n int) (commit func() []int64) {
	t.Helper()
	ctx := context.Background()
	tx, err := e.ownConn(t).Begin(ctx)
	require.NoError(t, err)
	ids, seqs, err := e.sendIn(ctx, tx, n, true)
	require.NoError(t, err)
	return func() []int64 {
		require.NoError(t, tx.Commit(ctx))
		e.committed(ids, seqs)
		return ids
	}
}

// HoldXmin opens a REPEATABLE READ transaction with an xid on a
// connection of its own, which keeps PostgreSQL from reclaiming any row
// version written after it began (like a report or a session left idle in
// transaction elsewhere in the database); release commits it.
func (e *Env) HoldXmin(t testing.TB) (release func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := e.ownConn(t).BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT pg_current_xact_id()`)
	require.NoError(t, err)
	return func() { require.NoError(t, tx.Commit(ctx)) }
}

// ownConn opens a connection outside the scenario's pools, closed when
// the test ends.
func (e *Env) ownConn(t testing.TB) *pgx.Conn {
	t.Helper()
	conn, err := pgx.ConnectConfig(context.Background(), e.DB.Pool.Config().ConnConfig)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// Send commits n messages in one transaction and returns their ids.
func (e *Env) Send(t testing.TB, n int) []int64 {
	t.Helper()
	s, err := e.Produce(context.Background(), ProduceOptions{Workers: 1, Messages: n, PerTx: n})
	require.NoError(t, err)
	return s.Committed
}

// Handled returns, per message id, the attempts with which group handled it.
func (e *Env) Handled(t testing.TB, group string) map[int64][]int {
	t.Helper()
	rows, err := e.DB.Pool.Query(context.Background(),
		`SELECT message_id, attempt FROM `+e.DB.Table("conformance_ledger")+` WHERE grp = $1 ORDER BY handled_at`, group)
	require.NoError(t, err)
	out := map[int64][]int{}
	var id int64
	var attempt int
	_, err = pgx.ForEachRow(rows, []any{&id, &attempt}, func() error { out[id] = append(out[id], attempt); return nil })
	require.NoError(t, err)
	return out
}

// DeadLettered returns the ids group dead-lettered.
func (e *Env) DeadLettered(t testing.TB, group string) map[int64]bool {
	t.Helper()
	var rows pgx.Rows
	var err error
	rows, err = e.DB.Pool.Query(context.Background(), `
SELECT r.message_id FROM `+e.DB.Table("outbox_group_retries")+` AS r
JOIN `+e.DB.Table("outbox_topic_subscriptions")+` AS s ON s.id = r.subscription_id
WHERE s.topic = $1 AND s.group_name = $2 AND r.status = 'DEAD_LETTER'`, e.Topic.Name, e.groupName(group))
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	out := map[int64]bool{}
	for _, id := range ids {
		out[id] = true
	}
	return out
}

// WaitDelivered waits until group handled or dead-lettered every id.
func (e *Env) WaitDelivered(t testing.TB, group string, ids []int64, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		missing := e.missing(t, group, ids)
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			first := missing[:min(len(missing), 10)]
			t.Fatalf("group %q: %d of %d messages neither delivered nor dead-lettered after %v (first: %v)\n%s",
				group, len(missing), len(ids), timeout, first, e.explain(group, first))
		}
		time.Sleep(50 * time.Millisecond) // each look reads every record so far
	}
}

func (e *Env) missing(t testing.TB, group string, ids []int64) []int64 {
	handled, dead := e.Handled(t, group), e.DeadLettered(t, group)
	var missing []int64
	for _, id := range ids {
		if len(handled[id]) == 0 && !dead[id] {
			missing = append(missing, id)
		}
	}
	return missing
}

// OrderedGroups is how many message groups an ordered subject's messages
// are spread over.
const OrderedGroups = 8

// checkOrder asserts, for an ordered subject, that group handled each
// message group's messages in id order (which is their commit order: see
// TopicConfig.Ordered), counting each message's first successful handling.
func (e *Env) checkOrder(t testing.TB, group string) {
	t.Helper()
	rows, err := e.DB.Pool.Query(context.Background(), `
SELECT message_id, seq FROM (
    SELECT DISTINCT ON (message_id) message_id, seq, handled_at FROM `+e.DB.Table("conformance_ledger")+`
    WHERE grp = $1 ORDER BY message_id, handled_at) AS first
ORDER BY handled_at`, group)
	require.NoError(t, err)
	last := map[string]int64{}
	var inversions []string
	var id int64
	var seq int
	e.mu.Lock()
	defer e.mu.Unlock()
	_, err = pgx.ForEachRow(rows, []any{&id, &seq}, func() error {
		g := e.groups[seq]
		if id < last[g] {
			inversions = append(inversions, fmt.Sprintf("%s: %d after %d", g, id, last[g]))
		}
		last[g] = max(last[g], id)
		return nil
	})
	require.NoError(t, err)
	require.Empty(t, inversions, "group %q: messages of a message group handled out of order", group)
}

// Report is what Check found for one group.
type Report struct {
	Delivered, DeadLettered, Duplicates int
}

// Check asserts the suite's per-message rules for group: every id of
// want delivered or dead-lettered, no id of rolledBack delivered, and no
// message handled twice with Attempt 1 (a duplicate without a lease expiry).
func (e *Env) Check(t testing.TB, group string, want, rolledBack []int64) Report {
	t.Helper()
	handled, dead := e.Handled(t, group), e.DeadLettered(t, group)
	var r Report
	var missing, ghosts, firstTwice []int64
	for _, id := range want {
		switch {
		case len(handled[id]) > 0:
			r.Delivered++
		case dead[id]:
			r.DeadLettered++
		default:
			missing = append(missing, id)
		}
	}
	for _, id := range rolledBack {
		if len(handled[id]) > 0 {
			ghosts = append(ghosts, id)
		}
	}
	for id, attempts := range handled {
		r.Duplicates += len(attempts) - 1
		if firsts := len(slices.DeleteFunc(slices.Clone(attempts), func(a int) bool { return a != 1 })); firsts > 1 {
			firstTwice = append(firstTwice, id)
		}
	}
	slices.Sort(missing)
	slices.Sort(firstTwice)
	require.Empty(t, missing, "group %q: committed messages neither delivered nor dead-lettered", group)
	require.Empty(t, ghosts, "group %q: rolled-back messages delivered", group)
	require.Empty(t, firstTwice, "group %q: messages handled twice as first attempts (a duplicate without a lease expiry)", group)
	if e.Subject.Ordered {
		e.checkOrder(t, group)
	}
	t.Logf("group %q: %d delivered, %d dead-lettered, %d duplicates", group, r.Delivered, r.DeadLettered, r.Duplicates)
	return r
}

// CheckNoDuplicates asserts that group handled no message twice.
func (e *Env) CheckNoDuplicates(t testing.TB, group string) {
	t.Helper()
	var dups []string
	for id, attempts := range e.Handled(t, group) {
		if len(attempts) > 1 {
			dups = append(dups, fmt.Sprintf("%d%v", id, attempts))
		}
	}
	require.Empty(t, dups, "group %q: messages handled more than once", group)
}

// explain describes where the messages ids stand for group: their rows,
// the group's retries of them, its position and open batches. A failing
// scenario prints it, so a loss can be told from a delay.
func (e *Env) explain(group string, ids []int64) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var b strings.Builder
	dump := func(title, q string, args ...any) {
		rows, err := e.DB.Pool.Query(ctx, q, args...)
		if err != nil {
			fmt.Fprintf(&b, "%s: %v\n", title, err)
			return
		}
		defer rows.Close()
		fmt.Fprintf(&b, "%s:\n", title)
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				fmt.Fprintf(&b, "  %v\n", err)
				return
			}
			fmt.Fprintf(&b, "  %v\n", vals)
		}
	}
	group = e.groupName(group)
	sub := `(SELECT id FROM ` + e.DB.Table("outbox_topic_subscriptions") + ` WHERE topic = $1 AND group_name = $2)`
	dump("subscriptions (id, group, status, bit, forget_pending)", `SELECT id, group_name, subscription_status, bit, forget_pending FROM `+
		e.DB.Table("outbox_topic_subscriptions")+` WHERE topic = $1 ORDER BY id`, e.Topic.Name)
	dump("rows (id, xid, required_bits, done_bits, required_ids, required_count, completed_count)",
		`SELECT id, xid::text, required_bits, done_bits, required_ids, required_count, completed_count FROM `+
			e.DB.Table("outbox_published")+` WHERE id = ANY($1) ORDER BY id`, ids)
	dump("retries (message_id, status, attempts, lease_owner, lease_until, lease_expiries, last_error)",
		`SELECT message_id, status, attempts, lease_owner, lease_until, lease_expiries, last_error FROM `+
			e.DB.Table("outbox_group_retries")+` WHERE subscription_id = `+sub+` AND message_id = ANY($3) ORDER BY message_id`,
		e.Topic.Name, group, ids)
	dump("position (position, pair_cur, resume_xid, resume_id, backfill_from, backfill_left)",
		`SELECT position::text, pair_cur::text, resume_xid::text, resume_id, backfill_from::text, backfill_left FROM `+
			e.DB.Table("outbox_subscription_offsets")+` WHERE subscription_id = `+sub, e.Topic.Name, group)
	dump("open batches (id, prev, cur, after, last, member, lease_until)",
		`SELECT id, prev::text, cur::text, after_xid::text || '/' || after_id, last_xid::text || '/' || last_id, member, lease_until FROM `+
			e.DB.Table("outbox_group_batches")+` WHERE subscription_id = `+sub+` ORDER BY id`, e.Topic.Name, group)
	dump("ledger of these ids (group, id, attempt, instance)", `SELECT grp, message_id, attempt, instance FROM `+
		e.DB.Table("conformance_ledger")+` WHERE message_id = ANY($1) ORDER BY message_id`, ids)
	return b.String()
}
