package migrations_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// Migration 18 moves every QUEUE topic to the log with what it held in
// flight: pending messages (one due later), a message that failed and
// waits for its retry (its attempts kept), one leased by a consumer of
// the earlier release (taken back at once, its attempt counted), an
// ordered topic's messages (their order kept), a topic that held messages
// without a configuration, and dead letters (listed, with their payload,
// and replayable). A send of the earlier release written after the
// migration reaches the new consumers too. None is lost.
func TestQueueTopicsMoveToTheLog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := migrations.Config{Schema: "q18"}
	db := atVersion(t, cfg, 17, `
INSERT INTO outbox_topics (topic, semantics, retention, max_attempts, backoff_initial, backoff_max, lease_duration)
VALUES ('jobs', 'QUEUE', '0', 5, '10ms', '20ms', '30s');
INSERT INTO outbox_topics (topic, semantics, retention, max_attempts, backoff_initial, backoff_max, lease_duration, ordered, ordered_dead_letters)
VALUES ('steps', 'QUEUE', '0', 5, '10ms', '20ms', '30s', true, 'BLOCK');
INSERT INTO outbox (id, topic, payload, correlation_id) VALUES (1, 'jobs', '{"n":1}', 'c1');
INSERT INTO outbox (id, topic, payload, correlation_id, available_at) VALUES (2, 'jobs', '{"n":2}', 'c2', now() + interval '300 milliseconds');
INSERT INTO outbox (id, topic, payload, correlation_id, attempts, last_error, available_at) VALUES (3, 'jobs', '{"n":3}', 'c3', 2, 'boom', now());
INSERT INTO outbox (id, topic, payload, correlation_id, attempts, lease_owner, available_at) VALUES (4, 'jobs', '{"n":4}', 'c4', 1, 'old-release', now() + interval '1 hour');
INSERT INTO outbox (id, topic, payload, correlation_id, message_group, ordered) VALUES (5, 'steps', '{"n":5}', 'c5', 'k', true);
INSERT INTO outbox (id, topic, payload, correlation_id, message_group, ordered) VALUES (6, 'steps', '{"n":6}', 'c6', 'k', true);
INSERT INTO outbox (id, topic, payload, correlation_id, message_group, ordered) VALUES (7, 'steps', '{"n":7}', 'c7', 'k', true);
INSERT INTO outbox (id, topic, payload, correlation_id) VALUES (8, 'unconfigured', '{"n":8}', 'c8');
INSERT INTO outbox_dead_letters (id, topic, payload, headers, correlation_id, priority, attempts, last_error, created_at, dead_lettered_at, xid)
VALUES (9, 'jobs', '{"n":9}', '{"h":"v"}', 'c9', 0, 5, 'poison', now(), now(), pg_current_xact_id());
SELECT setval('outbox_id_seq', 9)`)
	migrateTo(t, db.Pool, cfg, 18)

	var left int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM q18.outbox) + (SELECT count(*) FROM q18.outbox_dead_letters)`).Scan(&left))
	require.Zero(t, left, "the queue tables are empty")
	client, err := outbox.NewClient(db.Pool, outbox.Config{Schema: "q18"})
	require.NoError(t, err)
	for _, topic := range []string{"jobs", "steps", "unconfigured"} {
		tc, err := client.Topic(ctx, topic)
		require.NoError(t, err)
		require.True(t, tc.Configured, topic)
		require.Equal(t, outbox.Offset, tc.Tracking, "%s is on the log", topic)
	}

	// A send of the earlier release, after the migration.
	_, err = db.Pool.Exec(ctx, `INSERT INTO q18.outbox (topic, payload, correlation_id) VALUES ('jobs', '{"n":10}', 'c10')`)
	require.NoError(t, err)

	var mu sync.Mutex
	attempts := map[int64][]int{}
	var order []int64
	handler := func(ctx context.Context, d *outbox.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		attempts[d.ID] = append(attempts[d.ID], d.Attempt)
		if d.Topic == "steps" {
			order = append(order, d.ID)
		}
		return nil
	}
	var groups []*consumergroup.Group
	for _, topic := range []string{"jobs", "steps", "unconfigured"} {
		g, err := consumergroup.New(db.Pool, consumergroup.Config{Topic: topic, Group: sqlq.QueueGroup, Client: client,
			PollInterval: 20 * time.Millisecond})
		require.NoError(t, err)
		require.NoError(t, g.AddConsumer("new-release", handler, nil))
		require.NoError(t, g.Start(ctx, consumergroup.FromBeginning(false)))
		t.Cleanup(func() { _ = g.Stop(context.Background()) })
		groups = append(groups, g)
	}
	pgtest.Eventually(t, 20*time.Second, "every moved message delivered", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for id := int64(1); id <= 10; id++ {
			if id != 9 && len(attempts[id]) == 0 {
				return false
			}
		}
		return true
	})
	mu.Lock()
	require.Equal(t, []int{1}, attempts[1])
	require.Equal(t, []int{3}, attempts[3], "the retried message keeps its attempts")
	require.Equal(t, []int{2}, attempts[4], "the leased message is taken back, its attempt counted")
	require.Equal(t, []int64{5, 6, 7}, order, "the ordered topic keeps its order")
	require.Equal(t, []int{1}, attempts[10], "the earlier release's send")
	require.Empty(t, attempts[9], "a dead letter is not delivered")
	mu.Unlock()

	dead, err := groups[0].DeadLetters(ctx, 0, 10)
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.EqualValues(t, 9, dead[0].ID)
	require.Equal(t, 5, dead[0].Attempt)
	require.Equal(t, "poison", dead[0].LastError)
	require.JSONEq(t, `{"n":9}`, string(dead[0].Payload))
	require.Equal(t, map[string]string{"h": "v"}, dead[0].Headers)
	n, err := groups[0].ReplayDeadLetters(ctx, 9)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	pgtest.Eventually(t, 10*time.Second, "the replayed dead letter delivered", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(attempts[9]) == 1
	})
	var later bool
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT available_at > created_at + interval '250 milliseconds' FROM q18.outbox_published WHERE id = 2`).Scan(&later))
	require.True(t, later, "the message due later keeps its time")
}
