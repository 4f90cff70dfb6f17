package sqlq

// The SQL of the QUEUE consumer: claims, acks, settlements, leases and
// dead letters of the outbox table.

// A QUEUE message is pending while lease_owner is NULL and leased while it
// is not; a leased row's available_at is its lease end, so a lease that
// expired makes the message available again to the next claim.

// claim leases up to $2 available messages of topic $1, highest priority
// first, skipping rows other consumers are claiming right now: pending
// ones and ones whose lease expired (recording that as the last error).
// $3 now, $4 lease owner, $5 lease in microseconds. It returns each
// message, its lease end, when it had become available and its previous
// lease owner (NULL unless its lease had expired).
//
// It never takes a message of an ordered topic (a consumer that read the
// topic's configuration before the topic was configured ordered), which
// only claimOrdered hands out.
const claim = `
WITH picked AS (
    SELECT id, available_at, lease_owner FROM {{schema}}.outbox
    WHERE topic = $1 AND available_at <= coalesce($3::timestamptz, now()) AND ordered IS NOT TRUE
    ORDER BY priority DESC, available_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)` + claimPicked

// claimPicked leases the rows of picked (see claim).
const claimPicked = `
UPDATE {{schema}}.outbox AS o
SET attempts = o.attempts + 1,
    lease_owner = $4,
    available_at = coalesce($3::timestamptz, now()) + $5 * interval '1 microsecond',
    last_error = CASE WHEN picked.lease_owner IS NULL THEN o.last_error
                      ELSE 'lease expired (consumer ' || picked.lease_owner || ')' END
FROM picked
WHERE o.id = picked.id
RETURNING o.id, o.payload, o.headers, o.correlation_id, coalesce(o.message_group, ''),
          o.priority, o.attempts, o.created_at, o.available_at, picked.available_at, picked.lease_owner`

// claimOrdered is claim for an ordered topic ($1..$5 as claim; $6: a
// group with a dead letter is blocked; $7: the message group to start
// after, the empty string for the first; $8: the longest run). Its
// candidates are the head of each message group, the group's oldest
// message, which only the head's own lease or retry delay can make
// unavailable, each with a run of the group's next messages right behind
// it (up to $8 in all, as long as they are available); and the available
// ungrouped messages. A group's head and run go to one claim together, so
// a group never has messages out to two consumers; the consumer handles
// a run in id order and hands back what follows a message that did not
// succeed.
//
// The heads are found in two ways. The walk (heads) goes from one group
// to the next through outbox_ordered_idx, one index probe per group and
// one more for the run behind a free head, whatever the number of
// messages behind each head: from the group after $7 to the last, then
// from the first, until the walk is back at $7 or has met $2 messages in
// free heads and their runs (a head a concurrent claim locks is skipped,
// with its run, and this claim returns fewer). Groups compare by their
// bytes (COLLATE "C", as the index sorts them). Callers start each walk
// where the previous claim's turn ended, so every group's turn comes,
// and a claim takes at most one run per group, so a group with a long
// backlog never crowds out the others.
//
// The walk does not know the heads' priorities: prioritized does. It
// reads the topic's oldest available messages of priority above 0,
// highest first, through outbox_claim_idx (no index of its own, so sends
// pay nothing for it), as many as the claim has room for and
// priorityLookahead more. Of each group it meets there it keeps the first
// message if that is the group's head, and free (one probe per group, not
// per message), and it keeps the messages without a group; lane takes
// them, highest priority first and in walk order from $7 within one,
// with the runs behind the heads (one probe each), until it has met $2
// messages. A message behind its group's head is passed over: priority
// chooses between groups, never within one. How much it reads is bounded
// so that a long prioritized backlog (behind a head of a lower priority,
// or one that is leased) cannot make every claim read all of it; a head
// it does not reach still comes in its group's turn, and is read once
// the older messages before it are gone.
//
// The claim then takes, up to $2 messages, the candidates of the highest
// priority first. Among candidates of one priority, the heads the walk
// met and the ungrouped messages come first, oldest first, except that
// the walk's heads keep the walk's order among themselves (a head's age
// is the oldest of its own and those of the heads the walk met after it:
// dropping the newest would skip a fresh group's turn in favour of groups
// with a backlog); then the heads only lane found, in walk order from
// $7. So heads of one priority take turns, whatever their priority, and
// a higher priority goes first. A head's priority is its own: the run
// behind it goes with it whatever the priorities of its messages. The
// caller starts the next walk after the last group the claim took at its
// lowest priority, the groups that had their turn.
//
// A head counts, and is a candidate, only if it is free: available, and
// not held back by a dead letter of its group ($6). Counting blocked heads
// would let as many blocked groups as the claim has room for, right after
// the starting point, stop every claim short of the groups behind them.
//
// The heads are locked first (FOR UPDATE SKIP LOCKED); a run is taken
// only behind a head this claim locked, so two claims never split a
// group. A head taken by a concurrent claim is skipped or, if that claim
// committed meanwhile, no longer passes available_at; a head settled
// meanwhile is re-read. A message behind a head is never taken alone,
// even when this statement's snapshot no longer saw the head: a head
// leaves the queue only by its ack or its dead-lettering, after which
// its successor is the group's head. The claim returns at most $2
// messages: the last run may be cut short, never a run's beginning.
var claimOrdered = `
WITH RECURSIVE heads AS (
    SELECT f.*, r.behind, CASE WHEN f.free THEN 1 + r.behind ELSE 0 END AS found, 1 AS step
    FROM (SELECT * FROM (
            (SELECT message_group, id, available_at, ` + headFree + ` AS free, false AS wrapped
             FROM {{schema}}.outbox
             WHERE topic = $1 AND ordered AND message_group COLLATE "C" > $7::text
             ORDER BY message_group COLLATE "C", id LIMIT 1)
            UNION ALL
            (SELECT message_group, id, available_at, ` + headFree + `, true
             FROM {{schema}}.outbox
             WHERE topic = $1 AND ordered AND message_group IS NOT NULL
             ORDER BY message_group COLLATE "C", id LIMIT 1)) AS first
          LIMIT 1) AS f
    CROSS JOIN LATERAL (` + runBehind("f") + `) AS r
    UNION ALL
    SELECT n.*, r.behind, h.found + CASE WHEN n.free THEN 1 + r.behind ELSE 0 END, h.step + 1
    FROM heads AS h
    CROSS JOIN LATERAL (
        SELECT * FROM (
            (SELECT message_group, id, available_at, ` + headFree + ` AS free, h.wrapped AS wrapped
             FROM {{schema}}.outbox
             WHERE topic = $1 AND ordered AND message_group COLLATE "C" > h.message_group
             ORDER BY message_group COLLATE "C", id LIMIT 1)
            UNION ALL
            (SELECT message_group, id, available_at, ` + headFree + `, true
             FROM {{schema}}.outbox
             WHERE topic = $1 AND ordered AND message_group IS NOT NULL AND NOT h.wrapped
             ORDER BY message_group COLLATE "C", id LIMIT 1)) AS next
        LIMIT 1) AS n
    CROSS JOIN LATERAL (` + runBehind("n") + `) AS r
    WHERE h.found < $2 AND NOT (n.wrapped AND n.message_group COLLATE "C" > $7::text)
), prioritized AS (
    SELECT row_number() OVER (ORDER BY priority DESC, message_group IS NOT NULL, wrapped,
                                       message_group COLLATE "C", available_at, id) AS rank,
           message_group, id, available_at, true AS free, wrapped
    FROM (SELECT *, message_group COLLATE "C" <= $7::text AS wrapped
          FROM (SELECT DISTINCT ON (message_group, CASE WHEN message_group IS NULL THEN id END) *
                FROM (SELECT id, message_group, priority, available_at FROM {{schema}}.outbox
                      WHERE topic = $1 AND priority > 0 AND available_at <= coalesce($3::timestamptz, now())
                        AND ordered
                      ORDER BY priority DESC, available_at, id
                      LIMIT $2 + ` + priorityLookahead + `) AS w
                ORDER BY message_group, CASE WHEN message_group IS NULL THEN id END, id) AS outbox
          WHERE message_group IS NULL
             OR (NOT ` + groupBlocked + `
                 AND NOT EXISTS (SELECT 1 FROM {{schema}}.outbox AS e
                                 WHERE e.topic = $1 AND e.ordered AND e.id < outbox.id
                                   AND e.message_group COLLATE "C" = outbox.message_group))) AS p
), lane AS (
    SELECT p.*, r.behind, 1 + r.behind AS found
    FROM prioritized AS p CROSS JOIN LATERAL (` + runBehind("p") + `) AS r
    WHERE p.rank = 1
    UNION ALL
    SELECT p.*, r.behind, l.found + 1 + r.behind
    FROM lane AS l
    CROSS JOIN LATERAL (SELECT * FROM prioritized WHERE rank = l.rank + 1 LIMIT 1) AS p
    CROSS JOIN LATERAL (` + runBehind("p") + `) AS r
    WHERE l.found < $2
), candidates AS (
    SELECT DISTINCT ON (id) * FROM (
        SELECT id, available_at, behind, step, false AS late, wrapped FROM heads WHERE free
        UNION ALL
        (SELECT id, available_at, 0, NULL::int, false, NULL::bool FROM {{schema}}.outbox
         WHERE topic = $1 AND ordered AND message_group IS NULL AND available_at <= coalesce($3::timestamptz, now())
         ORDER BY id
         LIMIT $2)
        UNION ALL
        SELECT id, available_at, behind, NULL, message_group IS NOT NULL, wrapped FROM lane) AS c
    ORDER BY id, late, step -- a head the walk met goes in its turn
), keyed AS (
    SELECT id, behind, late, wrapped,
           CASE WHEN late THEN NULL
                WHEN step IS NULL THEN available_at
                ELSE min(available_at) OVER (PARTITION BY step IS NULL ORDER BY step DESC)
           END AS age
    FROM candidates
), locked AS (
    SELECT o.id, o.available_at, o.lease_owner, o.message_group, o.priority, k.behind, k.late, k.age, k.wrapped
    FROM {{schema}}.outbox AS o JOIN keyed AS k USING (id)
    WHERE o.available_at <= coalesce($3::timestamptz, now())
    ORDER BY ` + candidateOrder("o", "k") + `
    LIMIT $2
    FOR UPDATE OF o SKIP LOCKED
), ranked AS (
    SELECT row_number() OVER (ORDER BY ` + candidateOrder("o", "o") + `) AS rank, o.*
    FROM locked AS o
), picked AS (
    SELECT id, available_at, lease_owner FROM (
        SELECT rank, id, available_at, lease_owner FROM ranked
        UNION ALL
        SELECT h.rank, m.id, m.available_at, m.lease_owner
        FROM ranked AS h
        CROSS JOIN LATERAL (
            SELECT id, available_at, lease_owner FROM {{schema}}.outbox
            WHERE topic = $1 AND ordered AND message_group COLLATE "C" = h.message_group AND id > h.id
            ORDER BY message_group COLLATE "C", id
            LIMIT h.behind
            FOR UPDATE) AS m
        WHERE h.behind > 0
        ORDER BY 1, 2
        LIMIT $2) AS p
)` + claimPicked

// candidateOrder is the order claimOrdered takes its candidates in (see
// there): by the priority, message group and id of outbox row o, and by
// key k's late (a head only lane found), age and wrapped.
func candidateOrder(o, k string) string {
	return o + `.priority DESC, ` + k + `.late, ` + k + `.age, ` + k + `.wrapped, ` +
		o + `.message_group COLLATE "C", ` + o + `.id`
}

// priorityLookahead is how many available messages of priority above 0
// claimOrdered reads beyond the claim's room, looking for heads.
const priorityLookahead = `100`

// runBehind counts the messages right behind the head at alias (a
// claimOrdered walk's step) that may go with it in a run: for a free
// head, its group's next messages up to $8 in all, as long as each is
// available.
func runBehind(alias string) string {
	return `
        SELECT count(*)::int AS behind FROM (
            SELECT bool_and(available_at <= coalesce($3::timestamptz, now())) OVER (ORDER BY id) AS ok
            FROM (SELECT id, available_at FROM {{schema}}.outbox
                  WHERE ` + alias + `.free AND topic = $1 AND ordered
                    AND message_group COLLATE "C" = ` + alias + `.message_group AND id > ` + alias + `.id
                  ORDER BY message_group COLLATE "C", id
                  LIMIT $8::int - 1) AS b) AS w
        WHERE ok`
}

// headFree is whether the outbox row a claimOrdered walk is at, a group's
// head, may be claimed: it is available, and not blocked (groupBlocked).
const headFree = `(available_at <= coalesce($3::timestamptz, now()) AND NOT ` + groupBlocked + `)`

// groupBlocked: the group of outbox row outbox has a dead letter, and the
// topic blocks groups on them ($6).
const groupBlocked = `($6::bool AND EXISTS (SELECT 1 FROM {{schema}}.outbox_dead_letters AS d
                                 WHERE d.topic = $1 AND d.message_group = outbox.message_group))`

// ack deletes handled messages. A delivery is (id, attempts): an ack whose
// lease expired and was claimed again since matches nothing.
const ack = `
DELETE FROM {{schema}}.outbox AS o
USING unnest($1::bigint[], $2::int[]) AS a(id, attempts)
WHERE o.id = a.id AND o.attempts = a.attempts AND o.lease_owner IS NOT NULL`

// settle ends leases: retry later (nack), release (delay 0, and uncount=1
// gives back an attempt that never started), or dead-letter (the row moves
// to outbox_dead_letters). It returns how many leases it ended.
const settle = `
WITH s AS (
    SELECT * FROM unnest($1::bigint[], $2::int[], $3::bigint[], $4::bool[], $5::text[], $6::int[])
        AS s(id, attempts, delay_us, dead, err, uncount)
), parked AS (
    DELETE FROM {{schema}}.outbox AS o
    USING s
    WHERE o.id = s.id AND o.attempts = s.attempts AND o.lease_owner IS NOT NULL AND s.dead
    RETURNING o.id, o.topic, o.payload, o.headers, o.correlation_id, o.message_group, o.priority,
              o.attempts - s.uncount AS attempts, coalesce(s.err, o.last_error) AS last_error, o.created_at, o.xid
), moved AS (
    INSERT INTO {{schema}}.outbox_dead_letters
        (id, topic, payload, headers, correlation_id, message_group, priority, attempts, last_error, created_at,
         dead_lettered_at, xid)
    SELECT id, topic, payload, headers, correlation_id, message_group, priority, attempts, last_error, created_at,
           coalesce($7::timestamptz, now()), xid
    FROM parked
    RETURNING id
), retried AS (
    UPDATE {{schema}}.outbox AS o
    SET attempts = o.attempts - s.uncount,
        available_at = coalesce($7::timestamptz, now()) + s.delay_us * interval '1 microsecond',
        last_error = coalesce(s.err, o.last_error),
        lease_owner = NULL,
        failing_since = CASE WHEN s.uncount = 0 THEN coalesce(o.failing_since, $7::timestamptz, now())
                             ELSE o.failing_since END
    FROM s
    WHERE o.id = s.id AND o.attempts = s.attempts AND o.lease_owner IS NOT NULL AND NOT s.dead
    RETURNING o.id
)
SELECT (SELECT count(*) FROM moved) + (SELECT count(*) FROM retried)`

// extendLease pushes a held lease out to $3 + $4 microseconds.
const extendLease = `
UPDATE {{schema}}.outbox SET available_at = coalesce($3::timestamptz, now()) + $4 * interval '1 microsecond'
WHERE id = $1 AND attempts = $2 AND lease_owner IS NOT NULL
RETURNING available_at`

// extendLeases pushes many held leases ($1 ids, $2 attempts) out to $3 +
// $4 microseconds in one statement and returns the ones it extended; a
// lease that ended (settled, or claimed again as a new attempt) is left
// alone and missing from the result.
const extendLeases = `
UPDATE {{schema}}.outbox AS o
SET available_at = coalesce($3::timestamptz, now()) + $4 * interval '1 microsecond'
FROM unnest($1::bigint[], $2::int[]) AS l(id, attempts)
WHERE o.id = l.id AND o.attempts = l.attempts AND o.lease_owner IS NOT NULL
RETURNING o.id, o.attempts, o.available_at`

const listDeadLetters = `
SELECT id, payload, headers, correlation_id, coalesce(message_group, ''), priority, attempts,
       created_at, dead_lettered_at, coalesce(last_error, '')
FROM {{schema}}.outbox_dead_letters
WHERE topic = $1 AND id > $2
ORDER BY id
LIMIT $3`

// replayDeadLetters moves dead letters of topic $1 (all of them when $2 is
// NULL) back to the queue, deliverable at once with a fresh attempt budget,
// keeping their ids: on an ordered topic each is its group's oldest
// message again. Except where its group has moved on, on an ordered topic
// that skips dead letters or (the policy was changed since) one with a
// later message of the group leased: then a replayed message goes to the
// back of its group, as a new send would, under the group's lock and with
// a new id (see insertOrdered), so the group never has two out at once.
const replayDeadLetters = `
WITH t AS (
    SELECT coalesce((SELECT ordered FROM {{schema}}.outbox_topics WHERE topic = $1), false) AS ordered,
           coalesce((SELECT ordered AND ordered_dead_letters = 'SKIP'
                     FROM {{schema}}.outbox_topics WHERE topic = $1), false) AS skips
), replayed AS (
    DELETE FROM {{schema}}.outbox_dead_letters
    WHERE topic = $1 AND ($2::bigint[] IS NULL OR id = ANY($2::bigint[]))
    RETURNING *
)
INSERT INTO {{schema}}.outbox
    (id, topic, payload, headers, correlation_id, message_group, priority, attempts, available_at, last_error,
     created_at, xid, ordered)
SELECT CASE WHEN t.ordered AND r.message_group IS NOT NULL
                 AND (t.skips OR EXISTS (SELECT 1 FROM {{schema}}.outbox AS o
                                         WHERE o.topic = $1 AND o.ordered AND o.message_group = r.message_group
                                           AND o.id > r.id AND o.lease_owner IS NOT NULL))
            THEN nextval('{{schema}}.outbox_id_seq') ELSE r.id END,
       r.topic, r.payload, r.headers, r.correlation_id, r.message_group, r.priority, 0, now(), r.last_error,
       r.created_at, r.xid, CASE WHEN t.ordered THEN true END
FROM (SELECT * FROM replayed ORDER BY id) AS r, t
WHERE (SELECT count(pg_advisory_xact_lock(` + orderedLockClass + `, g.key))
       FROM (SELECT DISTINCT hashtext($1 || '/' || message_group) AS key
             FROM replayed, t WHERE t.ordered AND message_group IS NOT NULL
             ORDER BY 1) AS g) >= 0
RETURNING id`

// blockedHeads are the messages that hold an ordered topic's ($1) groups
// back: queued ones that failed (only a group's head is ever delivered,
// so each is its group's head, one per group), and, when $2 (the topic
// blocks groups on dead letters), each group's oldest dead letter.
const blockedHeads = `
blocked AS (
    SELECT message_group, id, attempts, coalesce(last_error, '') AS last_error, failing_since AS since, false AS dead
    FROM {{schema}}.outbox
    WHERE topic = $1 AND failing_since IS NOT NULL AND ordered AND message_group IS NOT NULL
    UNION ALL
    (SELECT DISTINCT ON (message_group) message_group, id, attempts, coalesce(last_error, ''), dead_lettered_at, true
     FROM {{schema}}.outbox_dead_letters
     WHERE $2 AND topic = $1 AND message_group IS NOT NULL
     ORDER BY message_group, id)
)`

// blockedGroups lists up to $3 blocked groups of topic $1, longest
// blocked first: the head, and how many messages wait behind it.
const blockedGroups = `
WITH ` + blockedHeads + `
SELECT message_group, id, attempts, last_error, since, dead,
       (SELECT count(*) FROM {{schema}}.outbox AS o
        WHERE o.topic = $1 AND o.ordered AND o.message_group = b.message_group AND o.id <> b.id)
FROM (SELECT DISTINCT ON (message_group) * FROM blocked ORDER BY message_group, dead DESC, since) AS b
ORDER BY since, message_group
LIMIT $3`

// blockedSummary counts topic $1's blocked groups and finds when the
// longest blocked one was first held back.
const blockedSummary = `
WITH ` + blockedHeads + `
SELECT count(DISTINCT message_group), min(since) FROM blocked`

// discardDeadLetters deletes dead letters of topic $1 (all of them when
// $2 is NULL).
const discardDeadLetters = `
DELETE FROM {{schema}}.outbox_dead_letters
WHERE topic = $1 AND ($2::bigint[] IS NULL OR id = ANY($2::bigint[]))`
