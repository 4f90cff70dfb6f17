package sqlq

// The SQL of the Offset tracking mode and of partition drops.

// partitionHeld is true when topic @topic may still need a message with an
// xid in [@lo, @hi), a range no transaction writes into any more, sealed
// (seen so) at @sealed: the topic's retention (@retention_us, or the
// zero-subscription floor @zero_subscription_us, the longer, in
// microseconds) has not passed since (by @now), a group holding claims
// has a pending retry of one of them or a backfill that may read them, or
// done (by mode) says a group has not finished one. It reads the retries
// and backfills of the topic and, in Bitmap and Counter mode, the topic's
// messages in the range until it finds an unfinished one; in Offset mode,
// those the slowest group and the DEAD ones may not have finished.
func partitionHeld(done string) string {
	return withDeadClaims + `, ` + positionsCTE + `
SELECT @sealed::timestamptz > coalesce(@now::timestamptz, now())
                              - greatest(@retention_us::bigint, @zero_subscription_us::bigint) * interval '1 microsecond'
    OR EXISTS (SELECT 1 FROM {{schema}}.outbox_group_retries AS r
               JOIN {{schema}}.outbox_topic_subscriptions AS s ON s.id = r.subscription_id
               JOIN {{schema}}.outbox_published AS o ON o.id = r.message_id
               WHERE s.topic = @topic AND r.payload IS NULL AND ` + holdsClaims + `
                     AND o.xid >= @lo::text::xid8 AND o.xid < @hi::text::xid8)
    OR EXISTS (SELECT 1 FROM {{schema}}.outbox_subscription_offsets AS b
               JOIN {{schema}}.outbox_topic_subscriptions AS s ON s.id = b.subscription_id
               WHERE s.topic = @topic AND ` + holdsClaims + `
                     AND b.backfill_from IS NOT NULL AND pg_snapshot_xmin(b.backfill_from) < @hi::text::xid8)
    OR ` + done
}

// unfinishedInRange is partitionHeld's done for Bitmap and Counter mode:
// a message of the range that finished is false for.
func unfinishedInRange(finished string) string {
	return `EXISTS (SELECT 1 FROM {{schema}}.outbox_published AS o
               WHERE o.topic = @topic AND o.xid >= @lo::text::xid8 AND o.xid < @hi::text::xid8
                     AND NOT coalesce(` + finished + `, false))`
}

// beforeWatermark is partitionHeld's done for Offset mode: a message of
// the range that the watermark @watermark (the least committed position
// of the ACTIVE and PAUSED groups; NULL when there is none) does not see,
// or that a DEAD group owes (see deadClaims). Every xid below a snapshot's
// xmin is visible in it, so only the rows from there on are read: those
// written after the slowest group's position, and those between a DEAD
// group's position and its death.
const beforeWatermark = `EXISTS (SELECT 1 FROM {{schema}}.outbox_published AS o
               WHERE o.topic = @topic AND o.xid >= greatest(@lo::text::xid8, pg_snapshot_xmin(@watermark::pg_snapshot))
                     AND o.xid < @hi::text::xid8 AND NOT pg_visible_in_snapshot(o.xid, @watermark::pg_snapshot))
    OR EXISTS (SELECT 1 FROM dead AS d CROSS JOIN LATERAL (
                   SELECT 1 FROM {{schema}}.outbox_published AS o
                   WHERE o.topic = @topic AND o.xid >= greatest(@lo::text::xid8, pg_snapshot_xmin(d.done))
                         AND o.xid < least(@hi::text::xid8, pg_snapshot_xmax(d.upto))
                         AND pg_visible_in_snapshot(o.xid, d.upto) AND NOT pg_visible_in_snapshot(o.xid, d.done)
                   LIMIT 1) AS owed)`

// offsetCleanup deletes up to @limit rows of topic @topic below xid
// @below that every ACTIVE and PAUSED group has passed (visible in the
// watermark @watermark, their least committed position; with no such
// group, @watermark NULL, past the zero-subscription floor, see
// pastZeroFloor), that no DEAD group owes and that retention lets go.
var offsetCleanup = withDeadClaims + `
DELETE FROM {{schema}}.outbox_published WHERE id IN (
    SELECT o.id FROM {{schema}}.outbox_published AS o
    WHERE o.topic = @topic AND o.xid < @below::text::xid8 AND o.status = 'PUBLISHED'
          AND CASE WHEN @watermark::pg_snapshot IS NULL
                   THEN ` + pastZeroFloor + `
                   ELSE pg_visible_in_snapshot(o.xid, @watermark::pg_snapshot) END
          AND NOT ` + owedToDead("o") +
	retention + `
    ORDER BY o.xid, o.id LIMIT @limit FOR UPDATE SKIP LOCKED)`
