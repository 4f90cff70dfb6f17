package sqlq

import (
	"strings"

	"github.com/pgoutbox/pgoutbox/internal/ident"
)

// Admin is the SQL of package admin: reads across topics and groups whose
// counts stop at a limit ($2), so none of them scans a backlog.
type Admin struct {
	TopicNames, TopicStored, QueueStats, TopicGroups string
	MessageGroups, MessageStored                     string
}

// ForAdmin returns the statements for schema (already validated).
func ForAdmin(schema string) *Admin {
	r := strings.NewReplacer("{{schema}}", ident.Quote(schema))
	return &Admin{
		TopicNames:  r.Replace(topicNames),
		TopicStored: r.Replace(topicStored),
		QueueStats:  r.Replace(queueStats),
		TopicGroups: r.Replace(topicGroups),

		MessageGroups: r.Replace(messageGroups),
		MessageStored: r.Replace(messageStored),
	}
}

// topicNames lists the configured topics and, so that every stored
// message can be found, the topics that hold QUEUE messages or dead
// letters without a configuration (sent by a producer that allows
// unconfigured topics, or before sends to them were refused). Those are
// found by a loose index scan of each table's (topic, …) index: one probe
// per distinct topic, never a read of the messages. A PUB_SUB message
// always has its topic's configuration.
const topicNames = `
WITH RECURSIVE queued AS (
    (SELECT topic FROM {{schema}}.outbox ORDER BY topic LIMIT 1)
    UNION ALL
    SELECT (SELECT o.topic FROM {{schema}}.outbox AS o WHERE o.topic > q.topic ORDER BY o.topic LIMIT 1)
    FROM queued AS q WHERE q.topic IS NOT NULL
), dead AS (
    (SELECT topic FROM {{schema}}.outbox_dead_letters ORDER BY topic LIMIT 1)
    UNION ALL
    SELECT (SELECT d.topic FROM {{schema}}.outbox_dead_letters AS d WHERE d.topic > q.topic ORDER BY d.topic LIMIT 1)
    FROM dead AS q WHERE q.topic IS NOT NULL
)
SELECT topic FROM {{schema}}.outbox_topics
UNION
SELECT topic FROM queued WHERE topic IS NOT NULL
UNION
SELECT topic FROM dead WHERE topic IS NOT NULL
ORDER BY topic`

// topicStored: topic $1 holds QUEUE messages or dead letters.
const topicStored = `
SELECT EXISTS (SELECT 1 FROM {{schema}}.outbox WHERE topic = $1)
    OR EXISTS (SELECT 1 FROM {{schema}}.outbox_dead_letters WHERE topic = $1)`

// queueStats measures QUEUE topic $1, each count at most $2: messages
// deliverable now, messages due later (a delay or a retry's backoff) and
// messages leased (a lease's end is its available_at; a row is leased
// while it has a lease owner), dead letters, and when the oldest
// deliverable one became deliverable. It walks the topic's priorities (one
// index probe each, a loose index scan of the claim index) and reads each
// priority's range of the index on either side of now: every read is a
// bounded range scan, never a filter over the topic's whole index. The
// rows due later are told apart from the leased ones among the first $2
// of each priority's range, the soonest due (a lease ends sooner than
// most delays); past that, the two add up to $2.
const queueStats = `
WITH RECURSIVE prio AS (
    (SELECT priority FROM {{schema}}.outbox WHERE topic = $1 ORDER BY priority DESC LIMIT 1)
    UNION ALL
    SELECT (SELECT o.priority FROM {{schema}}.outbox AS o
            WHERE o.topic = $1 AND o.priority < prio.priority ORDER BY o.priority DESC LIMIT 1)
    FROM prio WHERE prio.priority IS NOT NULL
), per AS (
    SELECT (SELECT count(*) FROM (SELECT 1 FROM {{schema}}.outbox AS o
                                  WHERE o.topic = $1 AND o.priority = prio.priority AND o.available_at <= now()
                                  LIMIT $2) AS r) AS ready,
           later.scheduled, later.leased,
           (SELECT min(o.available_at) FROM {{schema}}.outbox AS o
            WHERE o.topic = $1 AND o.priority = prio.priority) AS earliest
    FROM prio,
         LATERAL (SELECT count(*) FILTER (WHERE l.lease_owner IS NULL) AS scheduled,
                         count(*) FILTER (WHERE l.lease_owner IS NOT NULL) AS leased
                  FROM (SELECT o.lease_owner FROM {{schema}}.outbox AS o
                        WHERE o.topic = $1 AND o.priority = prio.priority AND o.available_at > now()
                        ORDER BY o.available_at LIMIT $2) AS l) AS later
    WHERE prio.priority IS NOT NULL
)
SELECT least(coalesce((SELECT sum(ready) FROM per), 0), $2)::bigint,
       least(coalesce((SELECT sum(scheduled) FROM per), 0), $2)::bigint,
       least(coalesce((SELECT sum(leased) FROM per), 0), $2)::bigint,
       (SELECT count(*) FROM (SELECT 1 FROM {{schema}}.outbox_dead_letters WHERE topic = $1 LIMIT $2) AS d),
       (SELECT min(earliest) FROM per WHERE ready > 0),
       now()`

// topicGroups lists the groups subscribed to topic $1, cancelled ones
// last.
const topicGroups = `
SELECT group_name FROM {{schema}}.outbox_topic_subscriptions WHERE topic = $1
ORDER BY subscription_status = 'CANCELLED', group_name`

// messageGroups says, for stored message $2 of PUB_SUB topic $1, where
// each consumer group of the topic (but the cancelled ones) stands with it,
// from the group's records and positions alone: its row in the group's
// retry table (a dead letter, a delivery in flight, a retry after a
// failure, or a message waiting its turn or its time); whether the message requires the group (Bitmap: its bit; Counter:
// its id; a row without either, written in Offset mode: every group but a
// DEAD one it was written after); the group's completion record (or done
// bit); its committed position (what it finished: Offset mode, and a
// group that subscribed after the message); its read position (read, its
// batch not finished); else not read yet. No row: the message is not
// stored.
var messageGroups = `
SELECT s.group_name, s.subscription_status,
       CASE WHEN r.status = 'DEAD_LETTER' THEN 'DEAD_LETTER'
            WHEN r.status = 'PROCESSING' THEN 'IN_FLIGHT'
            WHEN r.status = 'RETRY' AND r.failing_since IS NOT NULL THEN 'RETRYING'
            WHEN r.status = 'RETRY' THEN 'PENDING' -- queued behind its message group, or not due yet
            WHEN o.required_bits IS NOT NULL
                 AND (s.bit IS NULL OR o.required_bits & (1::bigint << s.bit) = 0) THEN 'NOT_REQUIRED'
            WHEN o.required_count IS NOT NULL AND NOT s.id = ANY(o.required_ids) THEN 'NOT_REQUIRED'
            WHEN ` + recordedBy("o", "s.id") + `
                 OR (o.required_bits IS NOT NULL AND coalesce(o.done_bits, 0) & (1::bigint << s.bit) <> 0) THEN 'FINISHED'
            WHEN EXISTS (SELECT 1 FROM {{schema}}.outbox_group_set_aside AS t
                         WHERE t.subscription_id = s.id AND t.message_id = o.id) THEN 'FINISHED' -- set aside, and done
            WHEN pg_visible_in_snapshot(o.xid, ` + committedOf("s", "p") + `) THEN 'FINISHED'
            WHEN o.required_bits IS NULL AND o.required_count IS NULL AND s.subscription_status = 'DEAD'
                 AND NOT pg_visible_in_snapshot(o.xid, coalesce(s.dead_upto, pg_current_snapshot())) THEN 'NOT_REQUIRED'
            WHEN pg_visible_in_snapshot(o.xid, p.position) THEN 'IN_FLIGHT'
            ELSE 'PENDING' END,
       coalesce(r.attempts, 0), coalesce(r.last_error, ''),
       CASE WHEN r.status = 'RETRY' AND (r.failing_since IS NOT NULL OR r.available_at > now()) THEN r.available_at END
FROM {{schema}}.outbox_published AS o
JOIN {{schema}}.outbox_topic_subscriptions AS s ON s.topic = o.topic AND s.subscription_status <> 'CANCELLED'
JOIN {{schema}}.outbox_subscription_offsets AS p ON p.subscription_id = s.id
LEFT JOIN {{schema}}.outbox_group_retries AS r ON r.subscription_id = s.id AND r.message_id = o.id
WHERE o.topic = $1 AND o.id = $2
ORDER BY s.group_name`

// messageStored: message $2 of topic $1 is stored.
const messageStored = `SELECT EXISTS (SELECT 1 FROM {{schema}}.outbox_published WHERE topic = $1 AND id = $2)`
