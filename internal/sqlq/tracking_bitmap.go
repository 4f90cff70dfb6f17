package sqlq

import (
	"strconv"
	"strings"

	"github.com/pgoutbox/pgoutbox/internal/ident"
)

// The SQL of the Bitmap tracking mode.

// A group has finished a message when its committed position has passed
// the message and it holds no pending retry of it (passedBy), or when it
// recorded finishing it in a row (message, subscription) of
// outbox_consumer_groups (recordedBy): a handler that acked in its own
// transaction (Group.AckTx) records it so that its batch, read again after
// a takeover, skips the message, and an operator's force-complete records
// what the group never read. Finishing a batch writes nothing per message,
// in every mode: no completion writes, locks or versions the message row,
// so groups completing the same messages never wait for each other (a
// frozen member's open completion used to hold the row locks every other
// group's completion needed), a held xmin leaves no dead versions of
// message rows behind, and a fan-out to Bitmap and Counter groups costs
// what it costs Offset groups. Rows written before records existed
// (done_bits, completed_count) keep their own record, which the checks
// below still read.

// completeRecords records that subscription @sub finished the messages
// @message_ids. A redelivered message is recorded once.
const completeRecords = `
INSERT INTO {{schema}}.outbox_consumer_groups (message_id, subscription_id)
SELECT unnest(@message_ids::bigint[]), @sub
ON CONFLICT DO NOTHING`

// recordedBy is true when subscription sub recorded finishing row alias.
func recordedBy(alias, sub string) string {
	return `EXISTS (SELECT 1 FROM {{schema}}.outbox_consumer_groups AS c
                      WHERE c.message_id = ` + alias + `.id AND c.subscription_id = ` + sub + perRow + `)`
}

// passedBy is true when the subscription of alias s (its offsets row
// alias f) finished row alias o by its position: its committed position
// (see committedOf) has passed the row, and it holds no pending retry of
// it (a dead letter with a copy of the message is done with it). A row in
// one of its open batches, parked in its retry table (an ordered group's
// queue, a scheduled message, one taken ahead for its priority) or in the
// range of a pending backfill is not passed.
func passedBy(o, s, f string) string {
	return `pg_visible_in_snapshot(` + o + `.xid, ` + committedOf(s, f) + `)
             AND NOT EXISTS (SELECT 1 FROM {{schema}}.outbox_group_retries AS pr
                             WHERE pr.subscription_id = ` + s + `.id AND pr.message_id = ` + o + `.id AND pr.payload IS NULL)`
}

// finishedBy is true when subscription sub finished row alias, by its
// position or by a record.
func finishedBy(alias, sub string) string {
	return `(` + recordedBy(alias, sub) + `
          OR EXISTS (SELECT 1 FROM {{schema}}.outbox_topic_subscriptions AS s
                     JOIN {{schema}}.outbox_subscription_offsets AS f ON f.subscription_id = s.id
                     WHERE s.id = ` + sub + ` AND ` + passedBy(alias, "s", "f") + `))`
}

// bitmapForget drops a DEAD group (@bit, the mask of its bit; subscription
// @sub) from up to @limit rows of topic @topic it had not finished. The
// row conditions are repeated outside the subquery so that a completion
// committed while the update waited for a row is seen.
var bitmapForget = `
UPDATE {{schema}}.outbox_published AS o SET required_bits = o.required_bits & ~@bit::bigint
WHERE o.id IN (
    SELECT o.id FROM {{schema}}.outbox_published AS o
    WHERE o.topic = @topic AND o.status = 'PUBLISHED' AND o.required_bits & @bit <> 0 AND o.done_bits & @bit = 0
          AND NOT ` + finishedBy("o", "@sub") + `
    ORDER BY o.id LIMIT @limit)
  AND o.required_bits & @bit <> 0 AND o.done_bits & @bit = 0 AND NOT ` + recordedBy("o", "@sub")

// bitmapStrip removes a CANCELLED group's bit (@bit, its mask) from up to
// @limit rows of topic @topic, required or done: its completions no
// longer matter, and the bit can go to another group once no row has it.
const bitmapStrip = `
UPDATE {{schema}}.outbox_published
SET required_bits = required_bits & ~@bit::bigint, done_bits = done_bits & ~@bit::bigint
WHERE id IN (
    SELECT id FROM {{schema}}.outbox_published
    WHERE topic = @topic AND (required_bits | done_bits) & @bit <> 0
    ORDER BY id LIMIT @limit)
  AND (required_bits | done_bits) & @bit <> 0`

// retention: rows older than the topic's retention (@retention_us
// microseconds before now, @now; and, for rows nobody was subscribed to,
// older than the zero-subscription floor, see pastZeroFloor), with no
// pending retry of a subscribed group, and out of reach of every pending
// backfill (a group that came back, or subscribed with Backfill, may still
// be raised on them). Cleanup runs under the topic's lock in shared mode
// (see lockTopicShared), so a subscription change that starts a backfill
// waits for cleanups in progress and later ones see it.
const retention = `
      AND o.created_at < coalesce(@now::timestamptz, now()) - @retention_us * interval '1 microsecond'
      AND NOT EXISTS (SELECT 1 FROM {{schema}}.outbox_group_retries AS r
                      JOIN {{schema}}.outbox_topic_subscriptions AS s ON s.id = r.subscription_id
                      WHERE r.message_id = o.id AND r.payload IS NULL AND ` + holdsClaims + `)
      AND NOT EXISTS (SELECT 1 FROM {{schema}}.outbox_subscription_offsets AS b
                      JOIN {{schema}}.outbox_topic_subscriptions AS s ON s.id = b.subscription_id
                      WHERE s.topic = o.topic AND ` + holdsClaims + `
                            AND b.backfill_from IS NOT NULL AND NOT pg_visible_in_snapshot(o.xid, b.backfill_from))`

// pastZeroFloor: row o is older than the zero-subscription floor
// (@zero_subscription_us microseconds before now, @now), as every cleanup
// asks of the rows no group required.
const pastZeroFloor = `o.created_at < coalesce(@now::timestamptz, now()) - @zero_subscription_us * interval '1 microsecond'`

// withPositions begins a statement about topic @topic whose rows are judged
// by bitmapDone or counterDone: positions is, for each group of the
// topic, its committed position (see committedOf), read once for the
// statement rather than once per row and group.
var withPositions = `WITH ` + positionsCTE

var positionsCTE = `positions AS MATERIALIZED (` + positionsOfTopic + `@topic)`

// positionsOfTopic, followed by a topic, selects each group of the topic
// with its bit and committed position (id, bit, snap).
var positionsOfTopic = `
    SELECT s.id, s.bit, ` + committedOf("s", "f") + ` AS snap
    FROM {{schema}}.outbox_topic_subscriptions AS s
    JOIN {{schema}}.outbox_subscription_offsets AS f ON f.subscription_id = s.id
    WHERE s.topic = `

// bitmapDone is true for row alias of a Bitmap topic when every required
// group finished it: each required bit is a done bit, or belongs to a
// group whose committed position (in positions, see withPositions) passed
// the message and that holds no pending retry of it, or that recorded
// finishing it.
func bitmapDone(alias, positions string) string {
	a := alias + "."
	return a + `required_bits & ~(coalesce(` + a + `done_bits, 0)
        | (coalesce((SELECT bit_or(1::bigint << p.bit) FROM ` + positions + ` AS p
                     WHERE p.bit IS NOT NULL AND pg_visible_in_snapshot(` + a + `xid, p.snap)), 0)
           & ~coalesce((SELECT bit_or(1::bigint << s.bit) FROM {{schema}}.outbox_group_retries AS r
                        JOIN {{schema}}.outbox_topic_subscriptions AS s ON s.id = r.subscription_id
                        WHERE r.message_id = ` + a + `id AND r.payload IS NULL AND s.bit IS NOT NULL), 0))
        | coalesce((SELECT bit_or(1::bigint << s.bit) FROM {{schema}}.outbox_consumer_groups AS c
                    JOIN {{schema}}.outbox_topic_subscriptions AS s ON s.id = c.subscription_id
                    WHERE c.message_id = ` + a + `id AND s.bit IS NOT NULL), 0)) = 0`
}

// FinishedByAll is, for tests and tools, the condition on row alias of
// schema's outbox_published that cleanup deletes Bitmap and Counter rows
// by: every group its record requires has finished it.
func FinishedByAll(schema, alias string) string {
	return strings.NewReplacer("{{schema}}", ident.Quote(schema)).Replace(
		`CASE WHEN ` + alias + `.required_bits IS NOT NULL THEN ` + bitmapDone(alias, "("+positionsOfTopic+alias+".topic)") +
			` ELSE ` + counterDone(alias, "("+positionsOfTopic+alias+".topic)") + ` END`)
}

// FinishedBy is, for tests and tools, the condition on row alias of
// schema's outbox_published that subscription sub finished it.
func FinishedBy(schema, alias string, sub int64) string {
	return strings.NewReplacer("{{schema}}", ident.Quote(schema)).Replace(finishedBy(alias, strconv.FormatInt(sub, 10)))
}

// bitmapCleanup deletes up to @limit rows of topic @topic below xid
// @below that every required group finished and that retention lets go
// (see retention and pastZeroFloor), in (topic, xid) index order,
// skipping rows another cleanup holds, with their records; it returns how
// many it deleted. Finishing is never undone (a group's
// committed position only moves forward, and it never parks a message it
// has passed; it only adds records; a forget only drops required bits), so
// a row found done stays done and needs no re-check under its lock.
var bitmapCleanup = withPositions + `, gone AS (
DELETE FROM {{schema}}.outbox_published WHERE id IN (
    SELECT o.id FROM {{schema}}.outbox_published AS o
    WHERE o.topic = @topic AND o.xid < @below::text::xid8 AND o.status = 'PUBLISHED'
          AND ` + bitmapDone("o", "positions") + `
          AND (o.required_bits <> 0 OR ` + pastZeroFloor + `)` +
	retention + `
    ORDER BY o.xid, o.id LIMIT @limit FOR UPDATE SKIP LOCKED)
RETURNING id
), dedupe AS (
    DELETE FROM {{schema}}.outbox_consumer_groups WHERE message_id IN (SELECT id FROM gone)
)
SELECT count(*) FROM gone`
