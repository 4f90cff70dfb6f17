package sqlq

// The SQL of a topic between two tracking modes.

// A topic whose tracking mode changed stores messages written under
// several modes. Each row says which by the columns it carries:
// required_bits (Bitmap), required_count (Counter), or neither (Offset);
// mixedDone judges a row o by its own (for Offset rows, the watermark wm,
// NULL when no group is ACTIVE or PAUSED, and the claims of the DEAD
// groups: the statement begins withDeadClaims).
func mixedDone(wm string) string {
	return `CASE WHEN o.required_bits IS NOT NULL THEN ` + bitmapDone("o", "positions") + `
                       WHEN o.required_count IS NOT NULL THEN ` + counterDone("o", "positions") + `
                       ELSE (` + wm + `::pg_snapshot IS NULL OR pg_visible_in_snapshot(o.xid, ` + wm + `::pg_snapshot))
                            AND NOT ` + owedToDead("o") + ` END`
}

// mixedCleanup is the cleanup of a topic whose tracking mode changed, with
// offsetCleanup's parameters (@topic, @below, @watermark, @limit, and
// @now, @retention_us and @zero_subscription_us for retention): each row
// goes by its own record, as bitmapCleanup, counterCleanup or
// offsetCleanup would delete it.
var mixedCleanup = withDeadClaims + `, ` + positionsCTE + `, gone AS (
    DELETE FROM {{schema}}.outbox_published WHERE id IN (
        SELECT o.id FROM {{schema}}.outbox_published AS o
        WHERE o.topic = @topic AND o.xid < @below::text::xid8 AND o.status = 'PUBLISHED'
              AND CASE WHEN o.required_bits IS NOT NULL
                       THEN ` + bitmapDone("o", "positions") + ` AND (o.required_bits <> 0 OR ` + pastZeroFloor + `)
                       WHEN o.required_count IS NOT NULL
                       THEN ` + counterDone("o", "positions") + ` AND (o.required_count > 0 OR ` + pastZeroFloor + `)
                       WHEN @watermark::pg_snapshot IS NULL THEN ` + pastZeroFloor + ` AND NOT ` + owedToDead("o") + `
                       ELSE pg_visible_in_snapshot(o.xid, @watermark::pg_snapshot) AND NOT ` + owedToDead("o") + ` END` +
	retention + `
        ORDER BY o.xid, o.id LIMIT @limit FOR UPDATE SKIP LOCKED)
    RETURNING id
), dedupe AS (
    DELETE FROM {{schema}}.outbox_consumer_groups WHERE message_id IN (SELECT id FROM gone)
)
SELECT count(*) FROM gone`

// modeChangeOver ends topic @topic's mode change once no message written
// before it is stored. Run it holding the topic's lock in shared mode (a
// later change waits for it).
const modeChangeOver = `
UPDATE {{schema}}.outbox_topics AS t SET mode_changed_below = NULL
WHERE t.topic = @topic AND t.mode_changed_below IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM {{schema}}.outbox_published AS o
                      WHERE o.topic = t.topic AND o.xid < t.mode_changed_below)`

// retentionFrontier is the xid of topic @topic's first row (in xid order)
// below @below written at or after @cutoff: the rows before it were
// written earlier, so a cleanup that needs rows older than @cutoff scans
// no further. NULL: none.
const retentionFrontier = `
SELECT o.xid::text FROM {{schema}}.outbox_published AS o
WHERE o.topic = @topic AND o.xid < @below::text::xid8 AND o.created_at >= @cutoff::timestamptz
ORDER BY o.xid, o.id LIMIT 1`

// snapshotXmax is the current snapshot's xmax (every committed row sorts
// below it), and the database's time.
const snapshotXmax = `SELECT pg_snapshot_xmax(pg_current_snapshot())::text, now()`

// upsertWatermark records @watermark (pg_snapshot text) as topic @topic's
// watermark.
const upsertWatermark = `
INSERT INTO {{schema}}.outbox_topic_watermarks (topic, watermark) VALUES (@topic, @watermark::pg_snapshot)
ON CONFLICT (topic) DO UPDATE SET watermark = excluded.watermark, updated_at = now()`
