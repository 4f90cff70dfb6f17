package sqlq

// The SQL a consumer group fetches with: snapshot pairs, batches,
// backfills, takeovers, retries and ordered queues.

// lockOffset: the instance that gets the row fetches; the others skip.
// Nobody holds it while handling. The backfill's columns are those of its
// current pair, and whether more are queued.
//
// It also turns JIT compilation off for the rest of the fetch's
// transaction. A fetch's statements read a batch in about a millisecond,
// but the planner estimates a read of the transactions a snapshot had in
// progress at 50 of them, whatever it holds, and its estimates of a
// catch-up read beside 100,000 stored messages passed jit_above_cost: JIT
// then took 86 ms of each 87 ms fetch.
//
// And it has the rest of the transaction's statements planned once per
// connection (a generic plan) instead of for each call. The server plans
// each of a prepared statement's first five calls on a connection for
// its values before it weighs a plan for any values, and planning a
// look's read of the partitioned log (fetchRowsAhead) took 4.5–15 ms a
// call: 18 such calls over a consumer's pool connections, in its first
// 0.3 s of work, held the first messages back by up to 45 ms (W4: p99
// 2.3 ms after that, 8 ms over the whole run). The statements are
// written to be read with a generic plan (see unseenRows); with it, W2
// and W3 drain as fast as before or faster (BENCHMARKS.md).
const lockOffset = `
SELECT position::text, pair_cur::text, resume_xid::text, resume_id,
       coalesce(backfill_lower, backfill_from)::text, backfill_upto::text, backfill_xid::text, backfill_id, backfill_left,
       backfill_total, backfill_done, coalesce(backfill_started_at, now()), backfill_ended_at IS NOT NULL,
       backfill_next IS NOT NULL, ` + lookPlanning + `
FROM {{schema}}.outbox_subscription_offsets
WHERE subscription_id = @sub
FOR UPDATE SKIP LOCKED`

// lookPlanning turns JIT off and has generic plans made for the rest of
// the transaction (see lockOffset); true.
const lookPlanning = `set_config('jit', 'off', true) = 'off' AND set_config('plan_cache_mode', 'force_generic_plan', true) = 'force_generic_plan'`

// LookPlanning gives the rest of a transaction a look's plan settings
// (see lookPlanning), where lockOffset does not begin it: a group's idle
// check, and the readying of connections for its looks.
const LookPlanning = `SELECT ` + lookPlanning

// WithoutJIT turns JIT off for the rest of a transaction: for a read
// whose estimate passes jit_above_cost (a group's health beside 100,000
// unread messages is estimated at 900,000) while it reads a bounded
// number of rows. Compiling it took 2.1 s of a 2.15 s read.
const WithoutJIT = `SELECT set_config('jit', 'off', true)`

// offsetExists tells a locked offsets row (another instance is fetching)
// from a deleted subscription.
const offsetExists = `
SELECT EXISTS (SELECT 1 FROM {{schema}}.outbox_subscription_offsets WHERE subscription_id = @sub)`

// fetchState runs after lockOffset: a state change holds the offsets row
// while it commits, so this read is current until the fetch commits.
// It also reads how the group tracks messages (see trackingState), and
// whether a batch's lease ran out or a retry is due (at @now), so that
// a look with neither runs neither takeExpiredBatch nor claimRetries: two
// round trips of about nine.
var fetchState = `
SELECT s.subscription_status, pg_current_snapshot()::text, ` + trackingState + `,
       ` + aBatchLeaseRanOut("@sub", "@now") + `,
       EXISTS (SELECT 1 FROM {{schema}}.outbox_group_retries
               WHERE subscription_id = @sub AND status = 'RETRY' AND available_at <= coalesce(@now::timestamptz, now()))
FROM {{schema}}.outbox_topic_subscriptions AS s JOIN {{schema}}.outbox_topics AS t ON t.topic = s.topic
WHERE s.id = @sub`

// aBatchLeaseRanOut is true when a batch of subscription sub has a lease
// that ran out before now (a parameter: NULL for the database's time),
// which takeExpiredBatch takes over.
func aBatchLeaseRanOut(sub, now string) string {
	return `EXISTS (SELECT 1 FROM {{schema}}.outbox_group_batches
               WHERE subscription_id = ` + sub + ` AND lease_until < coalesce(` + now + `::timestamptz, now()))`
}

// trackingState is how subscription s of topic t tracks messages: its
// bit (-1: none), the topic's mode, and whether messages written under an
// earlier mode may be stored. A change of the topic's mode changes them.
const trackingState = `coalesce(s.bit, -1) AS bit, coalesce(t.tracking_mode, '') AS tracking_mode,
       t.mode_changed_below IS NOT NULL AS mode_changing`

// catchupRows reads the next rows of a pending backfill: the rows of pair
// (@prev, @cur: the backfill's from and upto) after (@after_xid,
// @after_id), in commit order, of the group's start range (@catchup_all
// every row, or from time @catchup_from or message id @catchup_from_id),
// that the group has not completed (see notCompleted) and that do not wait
// in subscription @sub's retry table.
var catchupRows = nextUnseenRows(`
      AND (@catchup_all::bool OR o.created_at >= @catchup_from::timestamptz OR o.id >= @catchup_from_id::bigint)` +
	notCompleted("o") + `
      AND NOT EXISTS (SELECT 1 FROM {{schema}}.outbox_group_retries AS r
                      WHERE r.subscription_id = @sub::bigint AND r.message_id = o.id` + perRow + `)` +
	notSetAside("o", "@sub::bigint"))

// catchupSize estimates a backfill's size: the rows of its pair (@prev,
// @cur) of @topic, at most @limit.
var catchupSize = `
SELECT count(*) FROM (SELECT 1 FROM (` + unseenRows("o.id", `o.topic = @topic AND o.xid < pg_snapshot_xmax(@cur::pg_snapshot)
          AND pg_visible_in_snapshot(o.xid, @cur::pg_snapshot) AND NOT pg_visible_in_snapshot(o.xid, @prev::pg_snapshot)`,
	"@prev::pg_snapshot", "'0'::xid8", "-1", "@limit") + `) AS u LIMIT @limit) AS r`

// catchupProgress records a catch-up batch: the cursor moves to (@after_xid, @after_id),
// @handed_out more rows are handed out; @ended ends the reading (@outcome says why: DONE, or
// CAPPED at MaxBackfill). @total records the estimated size when not 0.
const catchupProgress = `
UPDATE {{schema}}.outbox_subscription_offsets
SET backfill_xid = coalesce(@after_xid::text::xid8, backfill_xid), backfill_id = coalesce(@after_id, backfill_id),
    backfill_left = backfill_left - @handed_out, backfill_done = backfill_done + @handed_out,
    backfill_total = CASE WHEN @total > 0 THEN @total ELSE backfill_total END,
    backfill_ended_at = CASE WHEN @ended THEN now() ELSE backfill_ended_at END,
    backfill_outcome = CASE WHEN @ended THEN @outcome ELSE backfill_outcome END, updated_at = now()
WHERE subscription_id = @sub`

// finishBackfill drops a backfill whose reading ended once none of its
// batches is open: from then on its rows are no longer kept for it.
const finishBackfill = `
UPDATE {{schema}}.outbox_subscription_offsets
SET backfill_from = NULL, backfill_upto = NULL, backfill_lower = NULL, backfill_next = NULL, updated_at = now()
WHERE subscription_id = @sub AND backfill_ended_at IS NOT NULL AND backfill_upto IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM {{schema}}.outbox_group_batches WHERE subscription_id = @sub AND catchup)`

// cancelBackfill ends the reading of the group's pending backfill (by
// name: @topic, @group_name).
const cancelBackfill = `
UPDATE {{schema}}.outbox_subscription_offsets
SET backfill_ended_at = now(), backfill_outcome = 'CANCELLED', updated_at = now()
WHERE subscription_id = ` + groupSubscription + ` AND backfill_upto IS NOT NULL AND backfill_ended_at IS NULL`

// backfillState reads the group's backfill (by name).
const backfillState = `
SELECT backfill_upto IS NOT NULL AND backfill_ended_at IS NULL, coalesce(backfill_outcome, ''), backfill_done,
       backfill_left, backfill_total, backfill_started_at, backfill_ended_at, now()
FROM {{schema}}.outbox_subscription_offsets WHERE subscription_id = ` + groupSubscription

// unseenRows selects cols (over alias o) of the rows matching where that
// snapshot prev had not seen, after (rxid, rid) in (xid, id) order, at
// most limit of each part ("": all of them, unordered). They are the rows
// of the transactions in progress in prev (its xip list: one index scan
// each) and of those that began after it (one index range scan from its
// xmax). Scanning from prev's xmin instead would read every row written
// since the oldest transaction still open in the database when prev was
// taken, and a transaction held open elsewhere (a report, an idle
// session) makes that ever more: 3,000 rows read and thrown away by each
// fetch a minute into one.
//
// The range scan starts after the later of (rxid, rid) and (xmax, -1), one
// row comparison: with two lower bounds, a generic plan may start the scan
// at the weaker one, the topic's first row (71 ms instead of 0.2 ms beside
// a million stored messages). Every row of the first part sorts before
// every row of the second (an xid in progress in prev is below its xmax).
func unseenRows(cols, where, prev, rxid, rid, limit string) string {
	order := func(by string) string {
		if limit == "" {
			return ""
		}
		return `
    ORDER BY ` + by + ` LIMIT ` + limit
	}
	xmax := `pg_snapshot_xmax(` + prev + `)`
	return `(SELECT ` + cols + `
    FROM (SELECT pg_snapshot_xip(` + prev + `) AS xid) AS x
    CROSS JOIN LATERAL (
        SELECT * FROM {{schema}}.outbox_published AS o
        WHERE o.xid = x.xid AND (o.xid, o.id) > (` + rxid + `, ` + rid + `) AND ` + where + order("o.id") + `) AS o` + order("o.xid, o.id") + `)
UNION ALL
(SELECT ` + cols + ` FROM {{schema}}.outbox_published AS o
    WHERE (o.xid, o.id) > (greatest(` + rxid + `, ` + xmax + `), CASE WHEN ` + rxid + ` >= ` + xmax + ` THEN ` + rid + ` ELSE -1 END)
      AND ` + where + order("o.xid, o.id") + `)`
}

// streamFilter says which rows of a pair belong to the group (over
// alias): rows requiring it (@stream_bit, @stream_sub), or every row
// (@stream_all), or rows from a start time (@stream_from) or message id
// (@stream_from_id). consumergroup's streamArgs binds them.
func streamFilter(alias string) string {
	a := alias + "."
	return `
      AND ((` + a + `required_bits & @stream_bit::bigint <> 0) OR (@stream_sub::bigint = ANY(` + a + `required_ids))
           OR @stream_all::bool OR ` + a + `created_at >= @stream_from::timestamptz OR ` + a + `id >= @stream_from_id::bigint)`
}

// notCompleted excludes rows the group finished: recorded by subscription
// @done_sub, or, on a row written before completions were recorded off the
// row, its done bit @done_bit (Bitmap mode; 0 in the others). The bit test
// is written as "<> bit" on purpose: the planner guesses 0.5% of rows for
// an "= 0" on an expression, which made it sort a whole topic instead of
// reading the (topic, xid, id) index in order (a catch-up read of a
// 300,000-row Counter topic took seconds, not ms).
func notCompleted(alias string) string {
	const bit = `@done_bit::bigint`
	return `
      AND (` + bit + ` = 0 OR coalesce(` + alias + `.done_bits & ` + bit + `, 0) <> ` + bit + `)
      AND NOT ` + recordedBy(alias, `@done_sub::bigint`)
}

// perRow ends a NOT EXISTS that must stay a per-row index probe. Without
// it the planner may turn the test into an anti join against everything the
// group completed or retries, materialized once and compared with every row
// read: a dedupe or retry table analyzed while it was small and grown since
// (a backfill fills it fast) made a 1,000-row catch-up read cost 5,000,000
// comparisons. "OFFSET 0" keeps a subquery from being pulled up into a join.
const perRow = ` OFFSET 0`

// takeExpiredBatch removes one batch of subscription @sub whose lease ran out
// before @now (its instance crashed or hung) and returns what it covered;
// moveBatchToRetries, in the same transaction, then moves its rows to the
// retry table: each has spent an attempt and counts a lease expiry (see
// isSuspect), so a message that crashes its process cannot hold its batch,
// or the group's position, for ever. Two statements,
// not one: the common case (no batch expired) stays a single cheap lookup,
// and the move is planned knowing the batch's bounds (as one statement its
// estimate crossed jit_above_cost, and JIT compiled it on every poll).
const takeExpiredBatch = `
DELETE FROM {{schema}}.outbox_group_batches
WHERE id = (SELECT id FROM {{schema}}.outbox_group_batches
            WHERE subscription_id = @sub AND lease_until < coalesce(@now::timestamptz, now())
            ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING prev::text, cur::text, after_xid::text, after_id, last_xid::text, last_id, member, catchup,
          lease_until = ` + OwnerGone + ` -- its instance was found gone (see takeBack)`

// moveBatchToRetries: see takeExpiredBatch. It moves subscription @sub's
// rows of @topic of the batch (pair @prev, @cur, after (@after_xid,
// @after_id) up to (@last_xid, @last_id), of @member, a catch-up batch
// when @catchup) at @now, read as the batch was: with the stream's filter
// (see streamFilter) or the catch-up's (@catchup_*: see catchupRows), less
// what the group completed (see notCompleted) or set aside. It returns how
// many rows it moved.
var moveBatchToRetries = `
WITH moved AS (
    INSERT INTO {{schema}}.outbox_group_retries
        (subscription_id, message_id, status, attempts, available_at, last_error, lease_expiries, failing_since)
    SELECT @sub, u.id, 'RETRY', 1, coalesce(@now::timestamptz, now()), 'lease expired (member ' || @member::text || ')', 1,
           coalesce(@now::timestamptz, now())
    FROM (` + unseenRows("o.id", `o.topic = @topic AND (o.xid, o.id) <= (@last_xid::text::xid8, @last_id::bigint)
          AND pg_visible_in_snapshot(o.xid, @cur::pg_snapshot) AND NOT pg_visible_in_snapshot(o.xid, @prev::pg_snapshot)
          AND CASE WHEN @catchup::bool
                   THEN (@catchup_all::bool OR o.created_at >= @catchup_from::timestamptz OR o.id >= @catchup_from_id::bigint)
                   ELSE true`+streamFilter("o")+` END`+notCompleted("o")+notSetAside("o", "@sub::bigint"),
	"@prev::pg_snapshot", "@after_xid::text::xid8", "@after_id::bigint", "") + `) AS u
    ON CONFLICT (subscription_id, message_id) DO NOTHING
    RETURNING 1
)
SELECT count(*) FROM moved`

// fetchRows reads the next rows of snapshot pair (@prev, @cur) after
// (@after_xid, @after_id), in commit-safe order: only transactions that
// committed between the two snapshots, whatever their ids; of them, those
// of the group's stream (see streamFilter) that subscription @sub did not
// set aside.
var fetchRows = nextUnseenRows(streamFilter("o") + notSetAside("o", "@sub::bigint"))

// Messages set aside. A group reads its stream in commit order, a batch at
// a time; two kinds of message leave it, to be delivered from the group's
// retry table instead. A message sent to be available later is parked
// there until it is due (see parkRows). And a message of a priority above
// 0 behind a backlog is taken ahead of it: a look that leaves unread rows
// behind its batch also takes the prioritized messages from among them,
// highest first (takeAhead), and the next look claims them before it
// reads the stream again. outbox_group_set_aside records both, so that
// the stream, a batch read again after a takeover and a backfill skip
// them: one may be handled, and its retry gone, long before they reach it.
// A group with no backlog reads prioritized messages in its batches like
// the others.

// notSetAside excludes the rows (over alias) that subscription sub set
// aside. Only rows of a priority above 0, or sent to be available later,
// are ever set aside: the others cost no lookup. The ids set aside are
// read once per statement, as an array (there are few: they are
// forgotten once the group is past them). As a NOT EXISTS probe per row,
// the planner's estimate of the fetch crossed jit_above_cost, and JIT
// compiled it on every fetch: 86 ms of a 87 ms fetch, a third of a
// drain's throughput.
func notSetAside(alias, sub string) string {
	a := alias + "."
	return `
      AND ((` + a + `priority <= 0 AND ` + a + `available_at <= ` + a + `created_at)
           OR ` + a + `id <> ALL (ARRAY(SELECT t.message_id FROM {{schema}}.outbox_group_set_aside AS t
                                   WHERE t.subscription_id = ` + sub + `)))`
}

// setAside records that subscription @sub set @message_ids (of @xids)
// aside (see parkRows).
const setAside = `
INSERT INTO {{schema}}.outbox_group_set_aside (subscription_id, message_id, xid)
SELECT @sub, u.id, u.xid::xid8 FROM unnest(@message_ids::bigint[], @xids::text[]) AS u(id, xid)
ON CONFLICT DO NOTHING`

// takeAhead takes up to @limit messages of a priority above 0 ahead of
// subscription @sub's stream, highest priority first: messages of @topic
// committed in @snapshot (the look's) that its stream has not read (not
// visible in its @position, nor among the rows of pair @pair_cur read up
// to (@resume_xid, @resume_id)), that belong to it (see streamFilter) and
// that it has not taken already. Each goes to the retry table as a retry
// that never ran, available now (@now), or when it is due if it was sent
// to be available later, and is recorded as set aside. It returns how
// many it took. The rows come from outbox_published_priority_idx, which
// holds only prioritized messages.
var takeAhead = `
WITH ahead AS (
    SELECT o.id, o.xid, CASE WHEN o.available_at > o.created_at THEN o.available_at END AS due
    FROM {{schema}}.outbox_published AS o
    WHERE o.topic = @topic AND o.priority > 0 AND o.status = 'PUBLISHED'
          AND o.xid >= pg_snapshot_xmin(@position::pg_snapshot) AND o.xid < pg_snapshot_xmax(@snapshot::pg_snapshot)
          AND pg_visible_in_snapshot(o.xid, @snapshot::pg_snapshot) AND NOT pg_visible_in_snapshot(o.xid, @position::pg_snapshot)
          AND NOT coalesce(pg_visible_in_snapshot(o.xid, @pair_cur::pg_snapshot)
                           AND (o.xid, o.id) <= (@resume_xid::text::xid8, @resume_id::bigint), false)
          AND NOT EXISTS (SELECT 1 FROM {{schema}}.outbox_group_set_aside AS t
                          WHERE t.subscription_id = @sub AND t.message_id = o.id)
          AND NOT EXISTS (SELECT 1 FROM {{schema}}.outbox_group_retries AS r
                          WHERE r.subscription_id = @sub AND r.message_id = o.id)` + streamFilter("o") + `
    ORDER BY o.priority DESC, o.xid, o.id
    LIMIT @limit
), taken AS (
    INSERT INTO {{schema}}.outbox_group_set_aside (subscription_id, message_id, xid)
    SELECT @sub, id, xid FROM ahead
    ON CONFLICT DO NOTHING
    RETURNING message_id
), parked AS (
    INSERT INTO {{schema}}.outbox_group_retries (subscription_id, message_id, status, attempts, available_at)
    SELECT @sub, a.id, 'RETRY', 0, greatest(coalesce(@now::timestamptz, now()), a.due)
    FROM ahead AS a WHERE a.id IN (SELECT message_id FROM taken)
    ON CONFLICT DO NOTHING
    RETURNING 1
)
SELECT count(*) FROM parked`

// forgetSetAside drops the records of messages subscription @sub set
// aside that no read of the group can reach any more: its position has
// passed them, no open batch (which a takeover reads again) spans them,
// and no backfill is pending.
const forgetSetAside = `
DELETE FROM {{schema}}.outbox_group_set_aside AS t
USING {{schema}}.outbox_subscription_offsets AS f
WHERE t.subscription_id = @sub AND f.subscription_id = @sub AND f.backfill_from IS NULL
      AND pg_visible_in_snapshot(t.xid, f.position)
      AND NOT EXISTS (SELECT 1 FROM {{schema}}.outbox_group_batches AS b
                      WHERE b.subscription_id = @sub AND pg_visible_in_snapshot(t.xid, b.cur)
                            AND NOT pg_visible_in_snapshot(t.xid, b.prev))`

// nextUnseenRows is a statement that reads the next @limit messages of
// @topic committed between snapshots @prev and @cur, after (@after_xid,
// @after_id) in (xid, id) order, that also match filter (over alias o):
// an index read per part of unseenRows, at most @limit rows each, merged. It returns
// id, xid (as text), payload, headers, correlation_id, message_group (”:
// none), priority, created_at, available_at and whether the message is
// scheduled: sent to be available later than it was written (Delay,
// NotBefore), and not due yet. It orders by the
// xid8 itself: the text of an xid orders differently from the resume point
// once xids cross a power of ten (rows then came twice, or never).
func nextUnseenRows(filter string) string {
	return unseenRowsOf("@topic", "@prev::pg_snapshot", "@cur::pg_snapshot", "@after_xid::text::xid8", "@after_id::bigint",
		"@limit", filter)
}

// unseenRowsOf is nextUnseenRows with its topic, pair, resume point and
// limit given as expressions.
func unseenRowsOf(topic, prev, cur, rxid, rid, limit, filter string) string {
	const cols = `o.id, o.xid::text AS xid_text, o.payload, o.headers, o.correlation_id,
           coalesce(o.message_group, '') AS message_group, o.priority, o.created_at, o.available_at, o.xid AS sort_xid`
	return `
SELECT r.id, r.xid_text, r.payload, r.headers, r.correlation_id, r.message_group, r.priority, r.created_at,
       r.available_at, r.available_at > greatest(r.created_at, now())
FROM (` + unseenRows(cols, `o.topic = `+topic+` AND o.status = 'PUBLISHED' AND o.xid < pg_snapshot_xmax(`+cur+`)
      AND pg_visible_in_snapshot(o.xid, `+cur+`)
      AND NOT pg_visible_in_snapshot(o.xid, `+prev+`)`+filter,
		prev, rxid, rid, limit) + `) AS r
ORDER BY r.sort_xid, r.id
LIMIT ` + limit
}

// fetchRowsAhead is fetchRows reading its pair from subscription @sub's
// offsets row, which the look's lockOffset locked earlier in its
// transaction: the rest of the pair in progress, or the rows from the
// position to a snapshot the statement takes, at most @limit of @topic,
// of the group's stream (see streamFilter). Each row also carries the pair's end. It
// goes to the server with lockOffset and fetchState, before the look
// knows whether it will read its stream at all (see fetchState): a look
// that reads new rows saves a round trip, and one that takes another path
// drops them. When lockOffset did not get the row (another instance is
// fetching), neither does this statement, and it reads nothing.
var fetchRowsAhead = `
WITH f AS MATERIALIZED (
    SELECT position AS prev, coalesce(pair_cur, pg_current_snapshot()) AS cur,
           coalesce(resume_xid, '0'::xid8) AS rxid, coalesce(resume_id, 0) AS rid
    FROM {{schema}}.outbox_subscription_offsets WHERE subscription_id = @sub
    FOR UPDATE SKIP LOCKED)
SELECT u.*, (SELECT cur FROM f)::text FROM (` + unseenRowsOf("@topic", "(SELECT prev FROM f)", "(SELECT cur FROM f)",
	"(SELECT rxid FROM f)", "(SELECT rid FROM f)", "@limit", streamFilter("o")+notSetAside("o", "@sub::bigint")) + `) AS u`

// anyWork tells an idle instance of subscription @sub (@topic, its stream:
// see streamFilter, at @now) whether a full look could find anything: its state and
// how it tracks messages (see trackingState), and
// whether it is in the middle of a pair or a backfill, has a batch whose
// lease ran out, a retry that is due, leased past its lease or a dead
// letter without its copy, a record of a message set aside to forget
// (see forgetSetAside), or a message its position has not seen. One
// statement without a transaction instead of the ten of a look: a
// thousand idle groups polling once a second were most of the database's
// work.
var anyWork = `
WITH p AS (
    SELECT s.subscription_status, f.position, f.pair_cur IS NOT NULL OR f.backfill_upto IS NOT NULL AS busy,
           ` + trackingState + `
    FROM {{schema}}.outbox_subscription_offsets AS f
    JOIN {{schema}}.outbox_topic_subscriptions AS s ON s.id = f.subscription_id
    JOIN {{schema}}.outbox_topics AS t ON t.topic = s.topic
    WHERE f.subscription_id = @sub
)
SELECT p.subscription_status, p.bit, p.tracking_mode, p.mode_changing,
       p.busy
       OR ` + aBatchLeaseRanOut("@sub", "@now") + `
       OR EXISTS (SELECT 1 FROM {{schema}}.outbox_group_retries
                  WHERE subscription_id = @sub
                        AND CASE status WHEN 'RETRY' THEN available_at <= coalesce(@now::timestamptz, now())
                                        WHEN 'PROCESSING' THEN lease_until < coalesce(@now::timestamptz, now())
                                        ELSE payload IS NULL END)
       OR EXISTS (SELECT 1 FROM {{schema}}.outbox_group_set_aside WHERE subscription_id = @sub)
       OR EXISTS (SELECT 1 FROM (` + unseenRows("1", `o.topic = @topic AND pg_visible_in_snapshot(o.xid, pg_current_snapshot())`+streamFilter("o"),
	"(SELECT position FROM p)", "'0'::xid8", "-1", "1") + `) AS u)
FROM p`

// insertBatch records a batch of subscription @sub handed to @member,
// leased for @lease_us microseconds from @now: the rows of pair (@prev,
// @cur) after (@after_xid, @after_id) up to (@last_xid, @last_id), read
// by a backfill when @catchup. It returns the batch's id and lease.
const insertBatch = `
INSERT INTO {{schema}}.outbox_group_batches
    (subscription_id, prev, cur, after_xid, after_id, last_xid, last_id, member, lease_until, catchup)
VALUES (@sub, @prev::pg_snapshot, @cur::pg_snapshot, @after_xid::text::xid8, @after_id, @last_xid::text::xid8, @last_id, @member,
        coalesce(@now::timestamptz, now()) + @lease_us * interval '1 microsecond', @catchup)
RETURNING id, lease_until`

// advanceOffset moves subscription @sub's read position to @position,
// reading pair (@position, @pair_cur) from (@resume_xid, @resume_id).
const advanceOffset = `
UPDATE {{schema}}.outbox_subscription_offsets
SET position = @position::pg_snapshot, pair_cur = @pair_cur::pg_snapshot,
    resume_xid = @resume_xid::text::xid8, resume_id = @resume_id, updated_at = now()
WHERE subscription_id = @sub`

// reapRetries returns retries whose lease ran out to the queue (or the
// dead letters, on their last attempt), counting the expiry. It returns
// how many it returned of those whose lease ran out and of those whose
// instance was found gone (see OwnerGone). It reads the leased retries
// only, in their index, whatever the statistics say: with the plan of a
// small table it read every retry of the group twice (30–60 ms every
// PollInterval beside 100,000 queued messages).
const reapRetries = `
WITH reaped AS (
    UPDATE {{schema}}.outbox_group_retries
    SET status = CASE WHEN attempts >= @max_attempts THEN 'DEAD_LETTER' ELSE 'RETRY' END,
        dead_lettered_at = CASE WHEN attempts >= @max_attempts THEN coalesce(@now::timestamptz, now()) END,
        available_at = coalesce(@now::timestamptz, now()),
        last_error = CASE WHEN lease_until = ` + OwnerGone + ` THEN 'instance gone' ELSE 'lease expired' END -- the lease before this update
                     || ' (member ' || coalesce(lease_owner, '?') || ')',
        lease_expiries = lease_expiries + 1, failing_since = coalesce(failing_since, @now::timestamptz, now()),
        lease_owner = NULL, lease_until = NULL
    WHERE message_id = ANY (ARRAY(
        SELECT message_id FROM {{schema}}.outbox_group_retries
        WHERE subscription_id = @sub AND status = 'PROCESSING' AND lease_until < coalesce(@now::timestamptz, now())
        ORDER BY lease_until -- outbox_group_retries_leased_idx's order: any other index needs a sort
        FOR UPDATE SKIP LOCKED)) -- a locked row is being acked in a handler's transaction (see takeRetry)
          AND subscription_id + 0 = @sub -- by message id alone, as leaseDue
    RETURNING starts_with(last_error, 'instance gone') AS gone
)
SELECT count(*) FILTER (WHERE NOT gone), count(*) FILTER (WHERE gone) FROM reaped`

// analyzeRetries refreshes the retry table's statistics (see
// internal/engine's analyze.go), waiting at most 100 ms for a lock another
// ANALYZE or a VACUUM holds: they refresh them too.
const analyzeRetries = `ANALYZE {{schema}}.outbox_group_retries`

// deleteOrphanRetries drops retries of messages that no longer exist
// (deleted while the group was DEAD, or by the retention cap) of which the
// retry kept no copy.
const deleteOrphanRetries = `
DELETE FROM {{schema}}.outbox_group_retries AS r
WHERE r.subscription_id = @sub AND r.payload IS NULL
      AND NOT EXISTS (SELECT 1 FROM {{schema}}.outbox_published AS o WHERE o.id = r.message_id)`

// deadLettersToComplete: per subscription of topic @topic, the dead letters
// with a copy whose message is stored and not completed by the group (by
// the message's own record: see mixedCleanup): completing them lets cleanup delete the message (the dead
// letter stays, with its copy).
var deadLettersToComplete = `
SELECT r.subscription_id, coalesce(s.bit, -1), array_agg(r.message_id ORDER BY r.message_id)
FROM {{schema}}.outbox_group_retries AS r
JOIN {{schema}}.outbox_topic_subscriptions AS s ON s.id = r.subscription_id
JOIN {{schema}}.outbox_published AS o ON o.id = r.message_id
WHERE s.topic = @topic AND r.status = 'DEAD_LETTER' AND r.payload IS NOT NULL
      AND CASE WHEN o.required_bits IS NOT NULL
               THEN s.bit IS NOT NULL AND coalesce(o.done_bits, 0) & (1::bigint << s.bit) = 0
                    AND NOT ` + recordedBy("o", "s.id") + `
               WHEN o.required_count IS NOT NULL
               THEN NOT ` + recordedBy("o", "s.id") + `
               ELSE false END -- Offset: the group's position passes it
GROUP BY r.subscription_id, s.bit`

// copyDeadLetters gives the dead letters of subscription @sub (of every
// subscription when @sub is NULL) a copy of their message, so they survive
// its row and no longer keep it from cleanup.
const copyDeadLetters = `
UPDATE {{schema}}.outbox_group_retries AS r
SET payload = o.payload, headers = o.headers, correlation_id = o.correlation_id,
    message_group = o.message_group, priority = o.priority, created_at = o.created_at, xid = o.xid
FROM {{schema}}.outbox_published AS o
WHERE o.id = r.message_id AND r.status = 'DEAD_LETTER' AND r.payload IS NULL
      AND (@sub::bigint IS NULL OR r.subscription_id = @sub)`

// claimRetries leases due retries of subscription @sub to @member: up to
// @limit ordinary ones, the earliest due first (of those due at one instant,
// as a router's held-back message group is, the first sent first), and at most one suspect (see isSuspect) while no other
// suspect of the group is leased. A message that crashes every process
// handling it is so tried apart from the other suspects, and runs out of
// attempts alone.
var claimRetries = `
WITH ordinary AS (
    SELECT message_id FROM {{schema}}.outbox_group_retries
    WHERE subscription_id = @sub AND status = 'RETRY' AND available_at <= coalesce(@now::timestamptz, now())
          AND NOT ` + isSuspect("") + `
    ORDER BY available_at, message_id LIMIT @limit FOR UPDATE SKIP LOCKED
), suspect AS (
    SELECT message_id FROM {{schema}}.outbox_group_retries
    WHERE subscription_id = @sub AND status = 'RETRY' AND available_at <= coalesce(@now::timestamptz, now())
          AND ` + isSuspect("") + ` AND NOT ` + suspectLeased + `
    ORDER BY available_at LIMIT 1 FOR UPDATE SKIP LOCKED
), due AS (
    SELECT message_id FROM ordinary UNION ALL SELECT message_id FROM suspect
)` + leaseDue

// leaseDue ends claimRetries and claimOrderedRetries: it leases the
// retries of subscription @sub that CTE due lists to @member, for @lease_us
// microseconds from @now, and returns their messages in commit order. A
// retry settled since the statement's snapshot is left alone.
//
// The retries are found by message id alone, one probe of
// outbox_group_retries_message_idx per id, and what a message row no
// longer has (a dead letter's copy) comes back from the update itself.
// The subscription and status are written so that no index can search by
// them (0 added to one, an empty string appended to the other): every
// plan that did read the whole queue of the group whenever the planner
// thought it small. Joined with due, guessing due held a row or two, it
// compared each retry of the group with every row of due (1.5 s a claim
// with 14,000 messages queued); with a plan made
// while the table was small (a prepared statement's generic plan, kept
// until the table is analyzed again), it searched the primary key by
// subscription only; and after a vacuum had found the table empty, a
// partial index on status looked empty to the planner, which read all of
// it (30–90 ms a claim beside 100,000 queued messages, the whole of a look).
const leaseDue = `, claimed AS (
    UPDATE {{schema}}.outbox_group_retries AS r
    SET status = 'PROCESSING', attempts = r.attempts + 1, lease_owner = @member,
        lease_until = coalesce(@now::timestamptz, now()) + @lease_us * interval '1 microsecond'
    WHERE r.message_id = ANY (ARRAY(SELECT message_id FROM due)) AND r.subscription_id + 0 = @sub AND r.status || '' = 'RETRY'
    RETURNING r.message_id, r.attempts, r.lease_until,
              r.xid, r.payload, r.headers, r.correlation_id, r.message_group, r.priority, r.created_at
)
SELECT c.message_id, coalesce(o.xid, c.xid)::text, coalesce(o.payload, c.payload), coalesce(o.headers, c.headers),
       coalesce(o.correlation_id, c.correlation_id), coalesce(o.message_group, c.message_group, ''),
       coalesce(o.priority, c.priority), coalesce(o.created_at, c.created_at), c.attempts, c.lease_until
FROM claimed AS c
LEFT JOIN {{schema}}.outbox_published AS o ON o.id = c.message_id
WHERE coalesce(o.payload, c.payload) IS NOT NULL -- neither: an orphan, deleted at the next reap
ORDER BY coalesce(o.xid, c.xid), c.message_id`

// parkRows puts messages (ids @message_ids, their @message_groups, empty
// for none, and @dues, the times scheduled ones are due, NULL for the
// others) in the retry table of subscription @sub, as retries that never
// ran, available from their due time or @now, the later: an ordered group queues what it reads there (and takes it
// with claimOrderedRetries), and every group parks a scheduled message
// there until it is due (and takes it with claimRetries). A message
// already there (a batch read again after a takeover) keeps its row.
const parkRows = `
INSERT INTO {{schema}}.outbox_group_retries
    (subscription_id, message_id, status, attempts, available_at, message_group)
SELECT @sub, u.id, 'RETRY', 0, greatest(coalesce(@now::timestamptz, now()), u.due), nullif(u.message_group, '')
FROM unnest(@message_ids::bigint[], @message_groups::text[], @dues::timestamptz[]) AS u(id, message_group, due)
ON CONFLICT (subscription_id, message_id) DO NOTHING`

// claimOrderedRetries is claimRetries for a group that reads by message
// group (an ordered topic's, or one configured so), with the same
// parameters and three more: @after_group, the message group to start the
// walk after (empty: the first), @dead_letter_blocks, whether a dead
// letter blocks its message group, and @run_limit, the most messages of
// one message group a claim takes (a run).
//
// The group's queue is its retry table (see parkRows). A message group's
// head is its retry with the lowest message id (a dead letter counts only
// when it blocks): on an ordered topic, ids follow commit order within a
// message group. A head is free when it is due and not leased; only a
// free head, and the retries right behind it that are due and not
// suspects (a run, up to @run_limit), are claimed, so a message group never
// has two deliveries that could overlap or overtake each other except in
// one run, which one executor handles in order.
//
// Heads are found by walking outbox_group_retries_group_idx from one
// message group's head to the next (one index probe each: the first
// entry past the last message group is the next one's head), from the
// group after @after_group to the last, then from the first, until the
// walk is back at @after_group or has met @limit free heads. A message
// group with a long queue so never crowds out the others. A head that is
// a suspect (see isSuspect) is, as in claimRetries, claimed alone (no run)
// and only while no other suspect is leased. Retries of messages without
// a group are claimed as in claimRetries.
//
// Every probe orders by (message_group, message_id) from a bound on both,
// an order only the group index has. Asked for one message group's
// lowest id, the planner could take the order of another index on
// message_id, filter it by message group, and read a whole queue for a
// message group that had one row at its end: 17–50 ms a claim beside
// 100,000 messages of another message group, whenever the statistics
// made that message group look like all of the table (a generic plan, or
// a burst that autovacuum had not analyzed yet).
var claimOrderedRetries = `
WITH RECURSIVE walk AS (
    SELECT h.message_group, h.wrapped, h.message_id, h.free, h.suspect, h.free::int AS found
    FROM (` + nextHead("@after_group::text", "false") + `) AS h
    UNION ALL
    SELECT h.message_group, h.wrapped, h.message_id, h.free, h.suspect, w.found + h.free::int
    FROM walk AS w
    CROSS JOIN LATERAL (` + nextHead("w.message_group", "w.wrapped") + `) AS h
    WHERE w.found < @limit AND NOT (h.wrapped AND h.message_group COLLATE "C" > @after_group::text)
), runs AS (
    SELECT message_id, 1 AS pos, suspect FROM walk WHERE free
    UNION ALL
    SELECT b.message_id, b.pos, false
    FROM walk AS h
    CROSS JOIN LATERAL (
        SELECT message_id, pos FROM (
            SELECT message_id, 1 + row_number() OVER (ORDER BY message_group COLLATE "C", message_id) AS pos,
                   bool_and(message_group COLLATE "C" = h.message_group AND status = 'RETRY' AND NOT ` + isSuspect("") + `
                            AND available_at <= coalesce(@now::timestamptz, now()))
                       OVER (ORDER BY message_group COLLATE "C", message_id) AS unbroken
            FROM (SELECT message_id, message_group, status, lease_expiries, available_at FROM {{schema}}.outbox_group_retries
                  WHERE subscription_id = @sub AND message_group IS NOT NULL -- the group index's predicate
                        AND (message_group COLLATE "C", message_id) > (h.message_group COLLATE "C", h.message_id)
                        AND (status <> 'DEAD_LETTER' OR @dead_letter_blocks::bool)
                  ORDER BY message_group COLLATE "C", message_id LIMIT @run_limit - 1) AS x) AS y
        WHERE unbroken) AS b
    WHERE h.free AND NOT h.suspect
), ungrouped AS (
    SELECT message_id, ` + isSuspect("") + ` AS suspect FROM {{schema}}.outbox_group_retries
    WHERE subscription_id = @sub AND message_group IS NULL AND status = 'RETRY'
          AND available_at <= coalesce(@now::timestamptz, now())
          AND (NOT ` + isSuspect("") + ` OR NOT ` + suspectLeased + `)
    ORDER BY ` + isSuspect("") + `, available_at LIMIT @limit
), due AS (
    (SELECT message_id FROM (SELECT message_id, pos FROM runs WHERE NOT suspect
                             UNION ALL SELECT message_id, 1 FROM ungrouped WHERE NOT suspect) AS ordinary
     ORDER BY pos, message_id LIMIT @limit)
    UNION ALL
    (SELECT message_id FROM (SELECT message_id FROM runs WHERE suspect
                             UNION ALL SELECT message_id FROM ungrouped WHERE suspect) AS suspects
     LIMIT 1)
)` + leaseDue

// nextHead is the head of the first message group, in the walk of
// claimOrderedRetries, after message group after: the first entry of
// outbox_group_retries_group_idx past it (a dead letter only when it
// blocks), or once past the last (wrapped is false), the first entry,
// with wrapped true. Its columns: message_group, message_id, free (due,
// not leased, and not a suspect while another is leased), suspect (see
// isSuspect) and wrapped.
func nextHead(after, wrapped string) string {
	head := func(where, wrappedCol string) string {
		return `SELECT message_group, message_id,
                   status = 'RETRY' AND available_at <= coalesce(@now::timestamptz, now())
                       AND (NOT ` + isSuspect("") + ` OR NOT ` + suspectLeased + `) AS free,
                   ` + isSuspect("") + ` AS suspect, ` + wrappedCol + ` AS wrapped
            FROM {{schema}}.outbox_group_retries
            WHERE subscription_id = @sub AND ` + where + `
                  AND (status <> 'DEAD_LETTER' OR @dead_letter_blocks::bool)
            ORDER BY message_group COLLATE "C", message_id LIMIT 1`
	}
	return `SELECT * FROM (
        (` + head(`message_group COLLATE "C" > `+after, wrapped) + `)
        UNION ALL
        (` + head(`message_group IS NOT NULL AND NOT `+wrapped, "true") + `)) AS next
    LIMIT 1`
}

// isSuspect: the retry (of table alias alias, "" for none) is suspected
// of crashing the processes that handle it. Its lease ran out twice in a
// row: it was in flight in two instances that died or froze, with no
// outcome recorded in between. One expiry is no suspicion: an instance
// killed (a deploy, the OOM killer, a lost node) takes its whole window
// of messages with it, and retrying each of them alone made a group
// crawl for minutes after every crash. A message that does crash every
// process takes one more instance down with its first retry, and is a
// suspect after that.
func isSuspect(alias string) string {
	if alias != "" {
		alias += "."
	}
	return "(" + alias + "lease_expiries >= 2)"
}

// suspectLeased: subscription @sub has a suspect retry (see isSuspect)
// leased.
var suspectLeased = `EXISTS (SELECT 1 FROM {{schema}}.outbox_group_retries AS p
                WHERE p.subscription_id = @sub AND p.status = 'PROCESSING' AND ` + isSuspect("p") + `)`
