package pgoutbox_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/maintenance"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// handlings records what a handler saw, by message id.
type handlings struct {
	mu       sync.Mutex
	attempts map[int64][]int
	first    map[int64]time.Time
}

func (h *handlings) add(d *outbox.Delivery) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.attempts[d.ID]) == 0 {
		h.first[d.ID] = time.Now()
	}
	h.attempts[d.ID] = append(h.attempts[d.ID], d.Attempt)
}

func (h *handlings) of(id int64) []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]int(nil), h.attempts[id]...)
}

// A QUEUE topic whose messages live on the log keeps a queue's documented
// behaviours through the client's API: sends with a delay or an
// idempotency key, a snooze, a permanent failure dead-lettered and
// replayed from the admin API, an ack in the handler's transaction. Its
// messages are written to the log only, cleanup deletes them once
// consumed, a new configuration keeps the topic on the log, and its group
// is never declared DEAD nor cancelled.
func TestQueueTopicOnTheLog(t *testing.T) {
	db := pgtest.NewDB(t)
	ctx := context.Background()
	c, err := pgoutbox.NewClient(ctx, db.Pool, pgoutbox.Config{Schema: db.Schema, Maintenance: maintenance.Config{
		CleanupInterval: 50 * time.Millisecond, DeadGroupInterval: 50 * time.Millisecond, RowCleanupDelay: time.Millisecond}})
	require.NoError(t, err)
	tc := outbox.TopicConfig{Name: "jobs", MaxAttempts: 2, BackoffInitial: 10 * time.Millisecond, BackoffMax: 20 * time.Millisecond}
	require.NoError(t, c.ConfigureTopic(context.Background(), tc))
	require.NoError(t, c.ConfigureTopic(ctx, tc), "configured again")
	topic, err := c.Outbox().Topic(ctx, "jobs")
	require.NoError(t, err)
	require.Equal(t, outbox.Offset, topic.Tracking, "a new configuration keeps the topic on the log")

	_, err = db.Pool.Exec(ctx, `CREATE TABLE `+db.Table("effects")+` (message_id bigint PRIMARY KEY)`)
	require.NoError(t, err)
	seen := &handlings{attempts: map[int64][]int{}, first: map[int64]time.Time{}}
	var consumer *pgoutbox.Consumer
	consumer, err = c.NewConsumer(ctx, outbox.ConsumerConfig{Topic: "jobs", PollInterval: 20 * time.Millisecond,
		Handler: func(ctx context.Context, d *outbox.Delivery) error {
			seen.add(d)
			switch d.Headers["do"] {
			case "snooze": // the first time (a snooze spends no attempt)
				if len(seen.of(d.ID)) == 1 {
					return outbox.Snooze(100*time.Millisecond, errors.New("not yet"))
				}
			case "poison":
				if d.Headers["replayed"] == "" && len(seen.of(d.ID)) == 1 {
					return outbox.Permanent(errors.New("cannot handle"))
				}
			case "acktx":
				return pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, `INSERT INTO `+db.Table("effects")+` VALUES ($1)`, d.ID); err != nil {
						return err
					}
					return consumer.AckTx(ctx, tx, d)
				})
			}
			return nil
		}})
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	t.Cleanup(func() { _ = c.Stop(context.Background()) })

	sendOne := func(m outbox.Message) int64 {
		t.Helper()
		var id int64
		require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			var err error
			id, err = c.Send(ctx, tx, m)
			return err
		}))
		return id
	}
	msg := func(headers map[string]string) outbox.Message {
		m, err := outbox.NewMessage("jobs", map[string]string{})
		require.NoError(t, err)
		m.Headers = headers
		return m
	}
	plain := sendOne(msg(nil))
	delayed := msg(nil)
	delayed.Delay = 300 * time.Millisecond
	sentAt := time.Now()
	delayedID := sendOne(delayed)
	keyed := msg(nil)
	keyed.IdempotencyKey = "once"
	keyedID := sendOne(keyed)
	require.Equal(t, keyedID, sendOne(keyed), "a second send with the key returns the first message")
	snoozed := sendOne(msg(map[string]string{"do": "snooze"}))
	poison := sendOne(msg(map[string]string{"do": "poison"}))
	acked := sendOne(msg(map[string]string{"do": "acktx"}))

	pgtest.Eventually(t, 20*time.Second, "every message handled", func() bool {
		for _, id := range []int64{plain, delayedID, keyedID, acked} {
			if len(seen.of(id)) == 0 {
				return false
			}
		}
		return len(seen.of(snoozed)) >= 2
	})
	require.Equal(t, []int{1}, seen.of(keyedID), "the idempotent message is delivered once")
	require.Equal(t, []int{1}, seen.of(acked), "the message acked in its transaction is delivered once")
	require.Equal(t, []int{1, 1}, seen.of(snoozed)[:2], "the snooze spent an attempt")
	var effects int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+db.Table("effects")).Scan(&effects))
	require.Equal(t, 1, effects)
	seen.mu.Lock()
	require.GreaterOrEqual(t, seen.first[delayedID].Sub(sentAt), 300*time.Millisecond, "the delayed message came early")
	seen.mu.Unlock()

	// The poison message is a dead letter of the topic, and a replay
	// delivers it again.
	var dead []outbox.DeadLetter
	pgtest.Eventually(t, 10*time.Second, "the poison message dead-lettered", func() bool {
		dead, err = c.Admin().DeadLetters(ctx, "jobs", "", 0, 0)
		require.NoError(t, err)
		return len(dead) == 1
	})
	require.Equal(t, poison, dead[0].ID)
	st, err := c.Admin().Topic(ctx, "jobs")
	require.NoError(t, err)
	require.EqualValues(t, 1, st.DeadLetters)
	n, err := c.Admin().ReplayDeadLetters(ctx, "jobs", "", poison)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	pgtest.Eventually(t, 10*time.Second, "the replayed message handled", func() bool { return len(seen.of(poison)) == 2 })

	// Nothing went to the queue table, and cleanup empties the log.
	var queued int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+db.Table("outbox")).Scan(&queued))
	require.Zero(t, queued, "a message reached the queue table")
	pgtest.Eventually(t, 20*time.Second, "cleanup deleting the consumed messages", func() bool {
		var stored int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+db.Table("outbox_published")+` WHERE topic = 'jobs'`).Scan(&stored))
		return stored == 0
	})

	// The group outlives its consumers' heartbeats, and cannot be cancelled.
	require.NoError(t, consumer.Stop(ctx))
	_, err = db.Pool.Exec(ctx, `UPDATE `+db.Table("outbox_topic_subscriptions")+` SET last_heartbeat_at = now() - interval '1 day'`)
	require.NoError(t, err)
	g, err := consumergroup.New(db.Pool, consumergroup.Config{Topic: "jobs", Group: sqlq.QueueGroup, Client: c.Outbox()})
	require.NoError(t, err)
	g.DetectDeadGroups(ctx)
	state, err := g.State(ctx)
	require.NoError(t, err)
	require.Equal(t, consumergroup.Active, state)
	require.ErrorIs(t, g.Cancel(ctx), consumergroup.ErrInvalidTransition)
	require.ErrorIs(t, c.Admin().CancelGroup(ctx, "jobs", sqlq.QueueGroup), consumergroup.ErrInvalidGroup)
	m, err := consumergroup.NewMaintainer(db.Pool, c.Outbox())
	require.NoError(t, err)
	require.ErrorIs(t, m.RemoveGroup(ctx, "jobs", sqlq.QueueGroup), consumergroup.ErrInvalidTransition)
	state, err = g.State(ctx)
	require.NoError(t, err)
	require.Equal(t, consumergroup.Active, state)
}

// The topic's group belongs to its QUEUE topic: the admin API shows where
// it stands with a message, no other group reads a QUEUE topic, and no
// PUB_SUB topic takes a group of its name.
func TestQueueGroupBelongsToItsTopic(t *testing.T) {
	db := pgtest.NewDB(t)
	ctx := context.Background()
	c := newClient(t, db)
	require.NoError(t, c.ConfigureTopic(context.Background(), outbox.TopicConfig{Name: "jobs"}))
	require.NoError(t, c.ConfigureTopic(ctx, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub}))
	// Where the topic's group stands with a message: there is one group.
	send(t, c, "jobs", 1, nil)
	var id int64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT id FROM `+db.Table("outbox_published")+` WHERE topic = 'jobs'`).Scan(&id))
	mg, err := c.Admin().MessageGroups(ctx, "jobs", id)
	require.NoError(t, err)
	require.Len(t, mg, 1)
	require.Equal(t, sqlq.QueueGroup, mg[0].ConsumerGroup)
	require.Equal(t, admin.MessagePending, mg[0].State)
	// Its counts: one ready, one due in an hour.
	later, err := outbox.NewMessage("jobs", map[string]int{})
	require.NoError(t, err)
	later.Delay = time.Hour
	_, err = c.Producer().SendBatch(ctx, db.Pool, []outbox.Message{later})
	require.NoError(t, err)
	st, err := c.Admin().Topic(ctx, "jobs")
	require.NoError(t, err)
	require.EqualValues(t, 1, st.Ready)
	require.EqualValues(t, 1, st.Scheduled)
	require.Zero(t, st.Leased+st.DeadLetters)

	h := func(context.Context, *outbox.Delivery) error { return nil }
	for _, tc := range []struct{ topic, group string }{{"jobs", "g1"}, {"events", sqlq.QueueGroup}} {
		g, err := consumergroup.New(db.Pool, consumergroup.Config{Topic: tc.topic, Group: tc.group, Client: c.Outbox()})
		require.NoError(t, err)
		require.NoError(t, g.AddConsumer("m", h, nil))
		require.ErrorIs(t, g.Start(ctx, consumergroup.FromNow()), outbox.ErrWrongSemantics, "group %q of %q", tc.group, tc.topic)
	}
}

// A handler that acks in its transaction while the consumer stops (Stop
// waits for it) finishes: its ack and its effect commit, and Stop returns
// once it has. Stop used to hold the lock AckTx takes, and the two waited
// for each other until Stop's context ended. On the queue table and on the
// log.
func TestStopWaitsForAHandlerThatAcksInItsTransaction(t *testing.T) {
	for _, onLog := range []bool{false, true} {
		t.Run(map[bool]string{false: "table", true: "log"}[onLog], func(t *testing.T) {
			t.Parallel()
			db := pgtest.NewDB(t)
			ctx := context.Background()
			c := newClient(t, db)
			tc := outbox.TopicConfig{Name: "jobs"}
			if onLog {
				require.NoError(t, c.ConfigureTopic(context.Background(), tc))
			} else {
				require.NoError(t, c.ConfigureTopic(ctx, tc))
			}
			_, err := db.Pool.Exec(ctx, `CREATE TABLE `+db.Table("effects")+` (message_id bigint PRIMARY KEY)`)
			require.NoError(t, err)
			handling, stopping := make(chan struct{}), make(chan struct{})
			var consumer *pgoutbox.Consumer
			consumer, err = c.NewConsumer(ctx, outbox.ConsumerConfig{Topic: "jobs", PollInterval: 20 * time.Millisecond,
				Handler: func(ctx context.Context, d *outbox.Delivery) error {
					close(handling)
					<-stopping
					return pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
						if _, err := tx.Exec(ctx, `INSERT INTO `+db.Table("effects")+` VALUES ($1)`, d.ID); err != nil {
							return err
						}
						return consumer.AckTx(ctx, tx, d)
					})
				}})
			require.NoError(t, err)
			require.NoError(t, consumer.Start(ctx))
			send(t, c, "jobs", 1, nil)
			<-handling
			stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			stopped := make(chan error, 1)
			go func() { stopped <- consumer.Stop(stopCtx) }()
			time.Sleep(100 * time.Millisecond) // Stop is waiting for the handler
			close(stopping)
			require.NoError(t, <-stopped)
			var effects int
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+db.Table("effects")).Scan(&effects))
			require.Equal(t, 1, effects)
		})
	}
}

// A producer that allows topics without a configuration, and saw this one
// without, sends to the log once the topic is a QUEUE topic on the log:
// its statement for topics without a configuration writes nothing there,
// and it reads the configuration again.
func TestAProducerThatSawNoConfigurationSendsToTheLog(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	c := newClient(t, db)
	producer, err := outbox.NewProducer(outbox.ProducerConfig{Schema: db.Schema, AllowUnconfiguredTopics: true})
	require.NoError(t, err)
	msg := outbox.Message{Topic: "jobs", Payload: []byte(`{}`)}
	_, err = producer.Send(ctx, db.Pool, msg) // learns that jobs has no configuration
	require.NoError(t, err)
	require.NoError(t, c.ConfigureTopic(context.Background(), outbox.TopicConfig{Name: "jobs"}))
	id, err := producer.Send(ctx, db.Pool, msg)
	require.NoError(t, err)
	var onLog bool
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+db.Table("outbox_published")+` WHERE id = $1)`, id).Scan(&onLog))
	require.True(t, onLog, "the message went to the queue table")
}
