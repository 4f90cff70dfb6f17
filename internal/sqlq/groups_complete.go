package sqlq

// The SQL a consumer group completes with: batches finished, retries
// and dead letters written, leases kept.

// finishBatch deletes a batch its member completed; no row means the lease
// expired and another member took the batch over.
const finishBatch = `DELETE FROM {{schema}}.outbox_group_batches WHERE id = $1 AND member = $2`

// insertRetries parks failed messages of a batch (retry after a delay, or
// at the instant $9 gives, or dead-letter), and messages a stopping instance never handled (attempts
// given back, available at once), except those the group ($8: its bit,
// 0 for none) recorded as completed: a handler that acked in its own
// transaction (see Group.AckTx) and then failed, or overran its timeout,
// has its message done. It runs after finishBatch, whose delete waited
// for such a transaction to end.
const insertRetries = `
INSERT INTO {{schema}}.outbox_group_retries
    (subscription_id, message_id, status, attempts, available_at, last_error, dead_lettered_at, failing_since)
SELECT $1, r.message_id, CASE WHEN r.dead THEN 'DEAD_LETTER' ELSE 'RETRY' END, r.attempts,
       coalesce(r.at, coalesce($6::timestamptz, now()) + r.delay_us * interval '1 microsecond'), nullif(r.err, ''),
       CASE WHEN r.dead THEN coalesce($6::timestamptz, now()) END,
       CASE WHEN r.err <> '' THEN coalesce($6::timestamptz, now()) END
FROM unnest($2::bigint[], $3::int[], $4::bigint[], $5::bool[], $7::text[], $9::timestamptz[]) AS r(message_id, attempts, delay_us, dead, err, at)
WHERE NOT EXISTS (SELECT 1 FROM {{schema}}.outbox_consumer_groups AS c
                  WHERE c.message_id = r.message_id AND c.subscription_id = $1)
  AND NOT EXISTS (SELECT 1 FROM {{schema}}.outbox_published AS o
                  WHERE o.id = r.message_id AND o.done_bits & $8::bigint <> 0)
ON CONFLICT (subscription_id, message_id) DO NOTHING`

// settleRetry ends a retry delivery that did not succeed: retry after $4
// microseconds (or at $9, when given), dead-letter ($5), or give the attempt back ($8 = 1) when a
// stopping instance never ran it. The message ran to an end, so it is no
// longer suspected of crashing its process.
const settleRetry = `
UPDATE {{schema}}.outbox_group_retries
SET status = CASE WHEN $5 THEN 'DEAD_LETTER' ELSE 'RETRY' END,
    attempts = attempts - $8,
    available_at = coalesce($9::timestamptz, coalesce($7::timestamptz, now()) + $4 * interval '1 microsecond'),
    dead_lettered_at = CASE WHEN $5 THEN coalesce($7::timestamptz, now()) END,
    last_error = coalesce(nullif($6, ''), last_error), lease_owner = NULL, lease_until = NULL,
    lease_expiries = CASE WHEN $8 = 1 THEN lease_expiries ELSE 0 END,
    failing_since = CASE WHEN $8 = 1 THEN failing_since ELSE coalesce(failing_since, $7::timestamptz, now()) END
WHERE subscription_id = $1 AND message_id = $2 AND lease_owner = $3 AND status = 'PROCESSING'`

// deleteRetries ends retry deliveries ($2 ids) of subscription $1 that
// member $3 handled, and returns the ids whose lease it still held.
const deleteRetries = `
DELETE FROM {{schema}}.outbox_group_retries
WHERE subscription_id = $1 AND message_id = ANY($2::bigint[]) AND lease_owner = $3 AND status = 'PROCESSING'
RETURNING message_id`

// holdBatch checks, in a handler's transaction, that member $2 still
// holds batch $1 (Group.AckTx): the row is locked FOR KEY SHARE until the
// transaction ends, so a takeover (FOR UPDATE SKIP LOCKED) passes over it
// and finishBatch waits, while the lease keeper's update (which changes
// no key) goes on.
//
// Both statements AckTx runs first also bound how long the caller's
// transaction may sit idle from then on (idleAfterAck), as the group's own
// transactions are bound (a frozen process would otherwise keep those
// rows locked until it died).
const holdBatch = idleAfterAck + `
SELECT 1 FROM {{schema}}.outbox_group_batches AS b, idle WHERE b.id = $1 AND b.member = $2 AND idle.v IS NOT NULL
FOR KEY SHARE OF b`

// idleAfterAck sets idle_in_transaction_session_timeout to 10 s for the
// rest of the transaction (see holdBatch).
const idleAfterAck = `WITH idle AS (SELECT set_config('idle_in_transaction_session_timeout', '10s', true) AS v)`

// takeRetry ends retry delivery $4 (its attempt) of message $2 held by
// member $3, in a handler's transaction (Group.AckTx); no row means its
// lease was lost.
const takeRetry = idleAfterAck + `
DELETE FROM {{schema}}.outbox_group_retries
WHERE subscription_id = $1 AND message_id = $2 AND lease_owner = $3 AND status = 'PROCESSING' AND attempts = $4
      AND (SELECT v FROM idle) IS NOT NULL`

// recordHandled records that subscription $1 completed message $2 where
// its mode records nothing per message (Offset), so that a takeover of
// its batch, or a failure written after it, skips the message (see
// notCompleted and insertRetries).
const recordHandled = `
INSERT INTO {{schema}}.outbox_consumer_groups (message_id, subscription_id) VALUES ($2, $1)
ON CONFLICT DO NOTHING`

// forgetHandled drops the records of recordHandled once their batch ($2
// ids) completed: nothing reads them after that.
const forgetHandled = `
DELETE FROM {{schema}}.outbox_consumer_groups WHERE subscription_id = $1 AND message_id = ANY($2::bigint[])`

// extendGroupLeases keeps the leases of the batches ($3) and retry deliveries
// ($4) that member $2 is still working on, in one statement. It returns
// the ids it extended: the others were taken over.
const extendGroupLeases = `
WITH b AS (
    UPDATE {{schema}}.outbox_group_batches
    SET lease_until = coalesce($5::timestamptz, now()) + $6 * interval '1 microsecond'
    WHERE subscription_id = $1 AND member = $2 AND id = ANY($3::bigint[])
    RETURNING id
), r AS (
    UPDATE {{schema}}.outbox_group_retries
    SET lease_until = coalesce($5::timestamptz, now()) + $6 * interval '1 microsecond'
    WHERE subscription_id = $1 AND message_id = ANY (ARRAY(
        SELECT message_id FROM {{schema}}.outbox_group_retries
        WHERE subscription_id = $1 AND lease_owner = $2 AND status = 'PROCESSING' AND message_id = ANY($4::bigint[])
        FOR UPDATE SKIP LOCKED)) -- a locked row is being acked in a handler's transaction (see takeRetry)
    RETURNING message_id
)
SELECT 'batch', id FROM b UNION ALL SELECT 'retry', message_id FROM r`
