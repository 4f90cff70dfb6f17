package sqlq

import (
	"strings"

	"github.com/pgoutbox/pgoutbox/internal/ident"
)

// Admin is the SQL of package admin: reads across topics and groups whose
// counts stop at a limit, so none of them scans a backlog.
type Admin struct {
	TopicNames, TopicStored, TopicGroups string
	MessageGroups, MessageStored         string
	Partitions, TopicStorage             string
	Watermark, SentBetween               string
}

// ForAdmin returns the statements for schema (already validated).
func ForAdmin(schema string) *Admin {
	r := strings.NewReplacer("{{schema}}", ident.Quote(schema))
	return &Admin{
		TopicNames:  r.Replace(topicNames),
		TopicStored: r.Replace(topicStored),
		TopicGroups: r.Replace(topicGroups),

		MessageGroups: r.Replace(messageGroups),
		MessageStored: r.Replace(messageStored),
		Partitions:    r.Replace(partitionCount),
		TopicStorage:  r.Replace(topicStorage),
		Watermark:     watermark,
		SentBetween:   r.Replace(sentBetween),
	}
}

// topicNames lists the configured topics and, so that every stored
// message can be found, the topics that hold messages without a
// configuration (sent by an earlier release to a topic it did not
// configure). Those are found by a loose index scan of the log's
// (topic, …) index: one probe per distinct topic, never a read of the
// messages.
const topicNames = `
WITH RECURSIVE stored AS (
    (SELECT topic FROM {{schema}}.outbox_published ORDER BY topic LIMIT 1)
    UNION ALL
    SELECT (SELECT o.topic FROM {{schema}}.outbox_published AS o WHERE o.topic > q.topic ORDER BY o.topic LIMIT 1)
    FROM stored AS q WHERE q.topic IS NOT NULL
)
SELECT topic FROM {{schema}}.outbox_topics
UNION
SELECT topic FROM stored WHERE topic IS NOT NULL
ORDER BY topic`

// partitionCount counts the log's partitions (the catalog only).
const partitionCount = `
SELECT count(*) FROM pg_inherits WHERE inhparent = '{{schema}}.outbox_published'::regclass`

// topicStorage reads what topic @topic keeps in the log: its messages,
// counted up to @limit (an index scan of the (topic, xid, id) index that
// stops there), the age in seconds of its oldest message (in commit
// order: one index probe per partition), and how many of its groups hold
// messages back (ACTIVE or PAUSED: none on a PUB_SUB topic means nobody
// reads what it keeps).
const topicStorage = `
SELECT (SELECT count(*) FROM (SELECT 1 FROM {{schema}}.outbox_published WHERE topic = @topic LIMIT @limit) AS s),
       (SELECT extract(epoch FROM clock_timestamp() - created_at)::float8
        FROM {{schema}}.outbox_published WHERE topic = @topic ORDER BY xid, id LIMIT 1),
       (SELECT count(*) FROM {{schema}}.outbox_topic_subscriptions
        WHERE topic = @topic AND subscription_status IN ('ACTIVE', 'PAUSED'))`

// watermark reads the server's commit watermark: every transaction whose
// id is below it has ended, so what it wrote is there for good (or never
// will be). A transaction held open holds it back.
const watermark = `SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint`

// sentBetween counts topic @topic's messages written by transactions with
// ids from @from up to @to (excluded), two watermarks: each message
// counted once over a series of them. An index range scan of the (topic,
// xid, id) index that stops at @limit.
const sentBetween = `
SELECT count(*) FROM (
    SELECT 1 FROM {{schema}}.outbox_published
    WHERE topic = @topic AND xid >= @from::bigint::text::xid8 AND xid < @to::bigint::text::xid8
    LIMIT @limit) AS s`

// topicStored: topic @topic holds messages.
const topicStored = `
SELECT EXISTS (SELECT 1 FROM {{schema}}.outbox_published WHERE topic = @topic)`

// topicGroups lists the groups subscribed to topic @topic, cancelled ones
// last.
const topicGroups = `
SELECT group_name FROM {{schema}}.outbox_topic_subscriptions WHERE topic = @topic
ORDER BY subscription_status = 'CANCELLED', group_name`

// messageGroups says, for stored message @message_id of PUB_SUB topic @topic, where
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
WHERE o.topic = @topic AND o.id = @message_id
ORDER BY s.group_name`

// messageStored: message @message_id of topic @topic is stored.
const messageStored = `SELECT EXISTS (SELECT 1 FROM {{schema}}.outbox_published WHERE topic = @topic AND id = @message_id)`
