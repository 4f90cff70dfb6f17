package sqlq

// The SQL of the Counter tracking mode.

// completeTracked is completeRecords for a topic whose tracking mode
// changed, back in Offset mode: only the messages of @message_ids that
// carry a Bitmap or Counter record get one of the group's (subscription
// @sub).
const completeTracked = `
INSERT INTO {{schema}}.outbox_consumer_groups (message_id, subscription_id)
SELECT o.id, @sub FROM {{schema}}.outbox_published AS o
WHERE o.id = ANY(@message_ids::bigint[]) AND (o.required_count IS NOT NULL OR o.required_bits IS NOT NULL)
ON CONFLICT DO NOTHING`

// counterForgetCandidates locks up to @limit rows of topic @topic that
// still require subscription @sub and that it had not finished when the
// statement began.
// counterForget, a later statement, re-checks them under those locks: a
// completion that committed meanwhile is visible to it. One that commits
// later is not counted (the group is no longer in the row's required ids),
// which is what forgetting the group means.
var counterForgetCandidates = `
SELECT o.id FROM {{schema}}.outbox_published AS o
WHERE o.topic = @topic AND o.status = 'PUBLISHED' AND @sub::bigint = ANY(o.required_ids)
      AND NOT ` + finishedBy("o", "@sub::bigint") + `
ORDER BY o.id LIMIT @limit
FOR UPDATE`

// counterStrip removes a CANCELLED group (subscription @sub) from the
// required groups of up to @limit rows of topic @topic, finished or not: its
// completions no longer matter, and once its subscription is deleted
// nothing could say it finished a row it still required.
const counterStrip = `
UPDATE {{schema}}.outbox_published
SET required_ids = array_remove(required_ids, @sub::bigint), required_count = required_count - 1
WHERE id IN (
    SELECT id FROM {{schema}}.outbox_published
    WHERE topic = @topic AND @sub::bigint = ANY(required_ids)
    ORDER BY id LIMIT @limit)
  AND @sub::bigint = ANY(required_ids)`

// counterForget removes subscription @sub from the required groups of the
// rows @message_ids that counterForgetCandidates locked, re-checking each
// under its lock: a row the group recorded finishing meanwhile keeps it
// (and counts its completion).
const counterForget = `
UPDATE {{schema}}.outbox_published AS o
SET required_ids = array_remove(o.required_ids, @sub::bigint), required_count = o.required_count - 1
WHERE o.id = ANY(@message_ids::bigint[]) AND @sub::bigint = ANY(o.required_ids)
      AND NOT EXISTS (SELECT 1 FROM {{schema}}.outbox_consumer_groups AS c
                      WHERE c.message_id = o.id AND c.subscription_id = @sub)`

// counterDone is true for row alias of a Counter topic when every
// required group finished it: as many of its required ids finished it as
// it requires, by their committed position (in positions, see
// withPositions) with no pending retry of it, or by a record. A row
// without a Counter record (written under another mode, see mixedCleanup)
// is never done by it.
func counterDone(alias, positions string) string {
	a := alias + "."
	return a + `required_count IS NOT NULL
          AND (SELECT count(*) FROM unnest(` + a + `required_ids) AS q(sid)
               LEFT JOIN ` + positions + ` AS p ON p.id = q.sid
               WHERE (pg_visible_in_snapshot(` + a + `xid, p.snap)
                      AND NOT EXISTS (SELECT 1 FROM {{schema}}.outbox_group_retries AS r
                                      WHERE r.subscription_id = q.sid AND r.message_id = ` + a + `id AND r.payload IS NULL))
                  OR ` + recordedBy(alias, "q.sid") + `) >= ` + a + `required_count`
}

// counterCleanup is bitmapCleanup for a Counter topic, with its parameters
// (@topic, @below, @limit, and @now, @retention_us and
// @zero_subscription_us for retention).
var counterCleanup = withPositions + `, gone AS (
    DELETE FROM {{schema}}.outbox_published WHERE id IN (
        SELECT o.id FROM {{schema}}.outbox_published AS o
        WHERE o.topic = @topic AND o.xid < @below::text::xid8 AND o.status = 'PUBLISHED'
              AND ` + counterDone("o", "positions") + `
              AND (o.required_count > 0 OR ` + pastZeroFloor + `)` +
	retention + `
        ORDER BY o.xid, o.id LIMIT @limit FOR UPDATE SKIP LOCKED)
    RETURNING id
), dedupe AS (
    DELETE FROM {{schema}}.outbox_consumer_groups WHERE message_id IN (SELECT id FROM gone)
)
SELECT count(*) FROM gone`
