package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/childproc"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// Subject is a delivery path under test.
type Subject struct {
	Name      string
	Semantics outbox.Semantics
	Tracking  outbox.TrackingMode
	// Ordered: the topic is ordered (TopicConfig.Ordered, skipping dead
	// letters), its messages spread over OrderedGroups message groups,
	// and every check also asserts each group's order.
	Ordered bool
	// Groups: consumer groups on a PUB_SUB topic (the group lifecycle
	// scenarios apply).
	Groups bool
	// Router: delivery through the router to an HTTP receiver (see
	// RouterSubjects).
	Router bool
	// ExecMode, when set, is the pgx query exec mode of every pool the
	// scenario opens (see RunExecModes).
	ExecMode string
	// PgBouncer: every pool of the scenario goes through a PgBouncer in
	// transaction pooling mode (see RunThroughPgBouncer).
	PgBouncer bool
	// Start starts one consumer instance with handler h on pool.
	Start func(ctx context.Context, e *Env, pool *pgxpool.Pool, spec Spec, h outbox.Handler) (Instance, error)
}

// Spec configures one consumer instance. Zero fields take the suite's
// defaults (see withDefaults).
type Spec struct {
	Group             string // the consumer group; for QUEUE subjects only the ledger's name
	Instance          string
	Concurrency       int
	BatchSize         int
	PollInterval      time.Duration
	HeartbeatInterval time.Duration
	HeartbeatTimeout  time.Duration
	HandlerTimeout    time.Duration // consumer groups only (QUEUE handlers end with their lease)
	Start             consumergroup.SubscriptionOptions
	Logger            *slog.Logger
	Target            string        // router subjects: the receiver's URL (set by the suite)
	RequestTimeout    time.Duration // router subjects: each HTTP attempt's bound (1 s)
}

func (s Spec) withDefaults() Spec {
	if s.Group == "" {
		s.Group = "g1"
	}
	if s.Instance == "" {
		s.Instance = s.Group + "-i"
	}
	if s.Concurrency == 0 {
		s.Concurrency = 4
	}
	if s.BatchSize == 0 {
		s.BatchSize = 50
	}
	if s.PollInterval == 0 {
		s.PollInterval = 20 * time.Millisecond
	}
	if s.HeartbeatInterval == 0 {
		s.HeartbeatInterval = time.Second
	}
	if s.HeartbeatTimeout == 0 {
		s.HeartbeatTimeout = time.Minute
	}
	if s.RequestTimeout == 0 {
		s.RequestTimeout = time.Second
	}
	if s.Start.Position == "" {
		s.Start = consumergroup.FromNow()
	}
	return s
}

// Instance is a running consumer instance.
type Instance interface {
	Stop(ctx context.Context) error
}

// GroupInstance is an instance of a consumer group.
type GroupInstance struct{ *consumergroup.Group }

// Subjects are the delivery paths of packages outbox and consumergroup.
var Subjects = []*Subject{
	{Name: "queue", Semantics: outbox.Queue, Start: startQueue},
	{Name: "queue-ordered", Semantics: outbox.Queue, Ordered: true, Start: startQueue},
	{Name: "bitmap", Semantics: outbox.PubSub, Tracking: outbox.Bitmap, Groups: true, Start: startGroup},
	{Name: "counter", Semantics: outbox.PubSub, Tracking: outbox.Counter, Groups: true, Start: startGroup},
	{Name: "offset", Semantics: outbox.PubSub, Tracking: outbox.Offset, Groups: true, Start: startGroup},
	// Ordered groups take the same path in every tracking mode but for the
	// completion record, which the unordered subjects cover: the suite
	// runs them in Offset mode (consumergroup's ordered tests run every
	// mode).
	{Name: "offset-ordered", Semantics: outbox.PubSub, Tracking: outbox.Offset, Groups: true, Ordered: true, Start: startGroup},
}

func subjectNamed(name string) *Subject {
	for _, s := range append(Subjects, RouterSubjects...) {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// startQueue starts a consumer of a QUEUE topic, through the client's
// API: a member of the topic's one group (spec.Group names only the
// ledger's).
func startQueue(ctx context.Context, e *Env, pool *pgxpool.Pool, spec Spec, h outbox.Handler) (Instance, error) {
	client, err := pgoutbox.NewClient(ctx, pool, pgoutbox.Config{Schema: e.DB.Schema, Logger: spec.Logger, NoMaintenance: true})
	if err != nil {
		return nil, err
	}
	c, err := client.NewConsumer(ctx, outbox.ConsumerConfig{Topic: e.Topic.Name, Handler: h, Concurrency: spec.Concurrency,
		BatchSize: spec.BatchSize, PollInterval: spec.PollInterval, ID: spec.Instance})
	if err != nil {
		return nil, err
	}
	return c, c.Start(ctx)
}

// groupName is the consumer group that a ledger's group name stands for.
func (e *Env) groupName(group string) string {
	if e.Subject.Semantics == outbox.Queue { // its consumers are the members of the topic's group
		return sqlq.QueueGroup
	}
	return group
}

// NewGroup returns an instance of spec's group on pool, not started.
func (e *Env) NewGroup(pool *pgxpool.Pool, spec Spec) (*consumergroup.Group, error) {
	spec = spec.withDefaults()
	return consumergroup.New(pool, consumergroup.Config{Topic: e.Topic.Name, Group: e.groupName(spec.Group), Schema: e.DB.Schema,
		InstanceID: spec.Instance, BatchSize: spec.BatchSize, Concurrency: spec.Concurrency, PollInterval: spec.PollInterval,
		HeartbeatInterval: spec.HeartbeatInterval, HeartbeatTimeout: spec.HeartbeatTimeout, HandlerTimeout: spec.HandlerTimeout,
		Logger: spec.Logger})
}

func startGroup(ctx context.Context, e *Env, pool *pgxpool.Pool, spec Spec, h outbox.Handler) (Instance, error) {
	g, err := e.NewGroup(pool, spec)
	if err != nil {
		return nil, err
	}
	if err := g.AddConsumer(spec.Instance, h, nil); err != nil {
		return nil, err
	}
	return GroupInstance{g}, g.Start(ctx, spec.Start)
}

// StartInstance starts an instance of the subject in this process and
// stops it when the test ends.
func (e *Env) StartInstance(t testing.TB, pool *pgxpool.Pool, spec Spec, b Behaviour) Instance {
	t.Helper()
	spec = spec.withDefaults()
	if e.receiver != nil {
		e.receiver.setBehaviour(b)
		spec.Target = e.receiver.url
	}
	in, err := e.Subject.Start(context.Background(), e, pool, spec, e.Handler(spec.Group, spec.Instance, b))
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = in.Stop(ctx)
	})
	return in
}

// ---------------------------------------------------------------- child processes

const childEnv = "PGOUTBOX_CONFORMANCE_CHILD"

// ChildSpec is what a child process runs: one instance of a subject.
type ChildSpec struct {
	DSN, Schema, Subject, Topic string
	Spec                        Spec
	// Slow is how long each handling takes.
	Slow time.Duration
	// CrashOnSeq makes the process exit at once (status 3) when it
	// handles the message with this seq.
	CrashOnSeq int
	// AckInTx: the handler records its handling in the ledger and acks
	// the message in one transaction (Client.AckTx, Group.AckTx), Slow
	// spent inside it.
	AckInTx bool
	// Hang: the handler records in conformance_started that it started
	// and never finishes (until its context ends).
	Hang bool
}

// IsChild reports whether this test binary was started as a child process
// of the suite; TestMain then calls ChildMain instead of running tests.
func IsChild() bool { return os.Getenv(childEnv) != "" }

// ChildMain runs the instance a parent asked for, prints "ready" once it
// started, and stops it gracefully on SIGTERM. It never returns.
func ChildMain() {
	var cs ChildSpec
	if err := json.Unmarshal([]byte(os.Getenv(childEnv)), &cs); err != nil {
		fmt.Fprintln(os.Stderr, "child spec:", err)
		os.Exit(2)
	}
	ctx := context.Background()
	dsn := cs.DSN
	if cs.AckInTx { // each handler holds a connection for its transaction
		dsn = withParam(dsn, "pool_max_conns", "12")
	}
	cfg, err := pgtest.PoolConfig(dsn) // waits for a slot on a busy server
	if err != nil {
		fmt.Fprintln(os.Stderr, "child pool:", err)
		os.Exit(2)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child pool:", err)
		os.Exit(2)
	}
	client, err := outbox.NewClient(pool, outbox.Config{Schema: cs.Schema})
	if err != nil {
		os.Exit(2)
	}
	topic, err := client.Topic(ctx, cs.Topic)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child topic:", err)
		os.Exit(2)
	}
	s := subjectNamed(cs.Subject)
	e := &Env{Client: client, Topic: topic, Subject: s}
	e.DB = &pgtest.DB{Pool: pool, Schema: cs.Schema, DSN: cs.DSN}
	spec := cs.Spec.withDefaults()
	started := make(chan struct{})
	var ackTx func(context.Context, pgx.Tx, *outbox.Delivery) error // set before started closes
	h := func(ctx context.Context, d *outbox.Delivery) error {
		p, err := outbox.Decode[Payload](d)
		if err != nil {
			return outbox.Permanent(err)
		}
		if cs.CrashOnSeq != 0 && p.Seq == cs.CrashOnSeq {
			os.Exit(3)
		}
		if cs.Hang {
			if _, err := pool.Exec(ctx, `INSERT INTO `+quote(cs.Schema)+`.conformance_started (message_id) VALUES ($1)`, d.ID); err != nil {
				return err
			}
			<-ctx.Done()
			return ctx.Err()
		}
		if cs.AckInTx {
			<-started
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if err := record(ctx, tx, cs.Schema, spec.Group, spec.Instance, d); err != nil {
					return err
				}
				time.Sleep(cs.Slow)
				return ackTx(ctx, tx, d)
			})
		}
		if cs.Slow > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(cs.Slow):
			}
		}
		return record(ctx, pool, cs.Schema, spec.Group, spec.Instance, d)
	}
	in, err := s.Start(ctx, e, pool, spec, h)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child start:", err)
		os.Exit(2)
	}
	if g, ok := in.(interface {
		AckTx(context.Context, pgx.Tx, *outbox.Delivery) error
	}); ok {
		ackTx = g.AckTx
	} else { // a router: the scenario that acks in the handler's transaction does not run it
		ackTx = func(context.Context, pgx.Tx, *outbox.Delivery) error {
			return errors.New("this instance cannot ack in a transaction")
		}
	}
	close(started)
	fmt.Println("ready")
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	<-sig
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := in.Stop(stopCtx); err != nil {
		fmt.Fprintln(os.Stderr, "child stop:", err)
	}
	pool.Close()
	os.Exit(0)
}

// Child is an instance running in a process of its own: Kill, Freeze
// (SIGSTOP: it holds its connections and leases but does nothing, like a
// process stuck in a long GC pause or a VM that was suspended) and Thaw it.
type Child = childproc.Child

// StartChild starts an instance of the subject in a new process (this test
// binary, see ChildMain) and waits until it runs. The process is killed
// when the test ends.
func (e *Env) StartChild(t testing.TB, cs ChildSpec) *Child {
	t.Helper()
	cs.DSN, cs.Schema, cs.Subject, cs.Topic = e.DB.DSN, e.DB.Schema, e.Subject.Name, e.Topic.Name
	if e.receiver != nil { // the child routes to this process's receiver
		cs.Spec.Target = e.receiver.url
		if slow := cs.Slow; slow > 0 {
			e.receiver.setBehaviour(func(context.Context, *outbox.Delivery, int) error { time.Sleep(slow); return nil })
		}
	}
	return childproc.Start(t, childEnv, cs)
}
