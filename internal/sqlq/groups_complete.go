package sqlq

// The SQL a consumer group completes with: batches finished, retries
// and dead letters written, leases kept.

// finishBatch deletes batch @batch_id that its member @member completed;
// no row means the lease expired and another member took the batch over.
const finishBatch = `DELETE FROM {{schema}}.outbox_group_batches WHERE id = @batch_id AND member = @member`

// insertRetries parks failed messages of a batch of subscription @sub
// (retry after a delay, or at the instant @due_at gives, or dead-letter),
// and messages a stopping instance never handled (attempts given back,
// available at once), except those the group (@bit: its bit's mask, 0 for
// none) recorded as completed: a handler that acked in its own
// transaction (see Group.AckTx) and then failed, or overran its timeout,
// has its message done. The messages come as arrays of one element per
// message: @message_ids, @attempts, @delays_us (microseconds), @dead,
// @errors (empty for none) and @due_at (NULL: after the delay, from @now).
// It runs after finishBatch, whose delete waited for such a transaction
// to end.
const insertRetries = `
INSERT INTO {{schema}}.outbox_group_retries
    (subscription_id, message_id, status, attempts, available_at, last_error, dead_lettered_at, failing_since)
SELECT @sub, r.message_id, CASE WHEN r.dead THEN 'DEAD_LETTER' ELSE 'RETRY' END, r.attempts,
       coalesce(r.at, coalesce(@now::timestamptz, now()) + r.delay_us * interval '1 microsecond'), nullif(r.err, ''),
       CASE WHEN r.dead THEN coalesce(@now::timestamptz, now()) END,
       CASE WHEN r.err <> '' THEN coalesce(@now::timestamptz, now()) END
FROM unnest(@message_ids::bigint[], @attempts::int[], @delays_us::bigint[], @dead::bool[], @errors::text[], @due_at::timestamptz[])
     AS r(message_id, attempts, delay_us, dead, err, at)
WHERE NOT EXISTS (SELECT 1 FROM {{schema}}.outbox_consumer_groups AS c
                  WHERE c.message_id = r.message_id AND c.subscription_id = @sub)
  AND NOT EXISTS (SELECT 1 FROM {{schema}}.outbox_published AS o
                  WHERE o.id = r.message_id AND o.done_bits & @bit::bigint <> 0)
ON CONFLICT (subscription_id, message_id) DO NOTHING`

// settleRetry ends retry delivery of message @message_id of subscription
// @sub, held by member @member, that did not succeed: retry after
// @delay_us microseconds (or at @due_at, when given), dead-letter (@dead),
// or give the attempt back (@give_back = 1) when a stopping instance never
// ran it. @error, unless empty, is its last error. The message ran to an
// end, so it is no longer suspected of crashing its process.
const settleRetry = `
UPDATE {{schema}}.outbox_group_retries
SET status = CASE WHEN @dead THEN 'DEAD_LETTER' ELSE 'RETRY' END,
    attempts = attempts - @give_back,
    available_at = coalesce(@due_at::timestamptz, coalesce(@now::timestamptz, now()) + @delay_us * interval '1 microsecond'),
    dead_lettered_at = CASE WHEN @dead THEN coalesce(@now::timestamptz, now()) END,
    last_error = coalesce(nullif(@error, ''), last_error), lease_owner = NULL, lease_until = NULL,
    lease_expiries = CASE WHEN @give_back = 1 THEN lease_expiries ELSE 0 END,
    failing_since = CASE WHEN @give_back = 1 THEN failing_since ELSE coalesce(failing_since, @now::timestamptz, now()) END
WHERE subscription_id = @sub AND message_id = @message_id AND lease_owner = @member AND status = 'PROCESSING'`

// deleteRetries ends retry deliveries (@message_ids) of subscription @sub
// that member @member handled, and returns the ids whose lease it still
// held.
const deleteRetries = `
DELETE FROM {{schema}}.outbox_group_retries
WHERE subscription_id = @sub AND message_id = ANY(@message_ids::bigint[]) AND lease_owner = @member AND status = 'PROCESSING'
RETURNING message_id`

// holdBatch checks, in a handler's transaction, that member @member still
// holds batch @batch_id (Group.AckTx): the row is locked FOR KEY SHARE
// until the transaction ends, so a takeover (FOR UPDATE SKIP LOCKED)
// passes over it and finishBatch waits, while the lease keeper's update
// (which changes no key) goes on.
//
// Both statements AckTx runs first also bound how long the caller's
// transaction may sit idle from then on (idleAfterAck), as the group's own
// transactions are bound (a frozen process would otherwise keep those
// rows locked until it died).
const holdBatch = idleAfterAck + `
SELECT 1 FROM {{schema}}.outbox_group_batches AS b, idle WHERE b.id = @batch_id AND b.member = @member AND idle.v IS NOT NULL
FOR KEY SHARE OF b`

// idleAfterAck sets idle_in_transaction_session_timeout to 10 s for the
// rest of the transaction (see holdBatch).
const idleAfterAck = `WITH idle AS (SELECT set_config('idle_in_transaction_session_timeout', '10s', true) AS v)`

// takeRetry ends retry delivery @attempt (its attempt) of message
// @message_id of subscription @sub held by member @member, in a handler's
// transaction (Group.AckTx); no row means its lease was lost.
const takeRetry = idleAfterAck + `
DELETE FROM {{schema}}.outbox_group_retries
WHERE subscription_id = @sub AND message_id = @message_id AND lease_owner = @member AND status = 'PROCESSING' AND attempts = @attempt
      AND (SELECT v FROM idle) IS NOT NULL`

// recordHandled records that subscription @sub completed message
// @message_id where its mode records nothing per message (Offset), so
// that a takeover of its batch, or a failure written after it, skips the
// message (see notCompleted and insertRetries).
const recordHandled = `
INSERT INTO {{schema}}.outbox_consumer_groups (message_id, subscription_id) VALUES (@message_id, @sub)
ON CONFLICT DO NOTHING`

// forgetHandled drops the records of recordHandled of subscription @sub
// once their batch (@message_ids) completed: nothing reads them after
// that.
const forgetHandled = `
DELETE FROM {{schema}}.outbox_consumer_groups WHERE subscription_id = @sub AND message_id = ANY(@message_ids::bigint[])`

// extendGroupLeases keeps the leases of the batches (@batch_ids) and
// retry deliveries (@retry_ids, their message ids) of subscription @sub
// that member @member is still working on, in one statement, for
// @lease_us microseconds from @now. It returns the ids it extended: the
// others were taken over.
const extendGroupLeases = `
WITH b AS (
    UPDATE {{schema}}.outbox_group_batches
    SET lease_until = coalesce(@now::timestamptz, now()) + @lease_us * interval '1 microsecond'
    WHERE subscription_id = @sub AND member = @member AND id = ANY(@batch_ids::bigint[])
      AND lease_until <> ` + OwnerGone + ` -- taken back: the instance was found gone (see takeBack)
    RETURNING id
), r AS (
    UPDATE {{schema}}.outbox_group_retries
    SET lease_until = coalesce(@now::timestamptz, now()) + @lease_us * interval '1 microsecond'
    WHERE subscription_id = @sub AND message_id = ANY (ARRAY(
        SELECT message_id FROM {{schema}}.outbox_group_retries
        WHERE subscription_id = @sub AND lease_owner = @member AND status = 'PROCESSING' AND message_id = ANY(@retry_ids::bigint[])
          AND lease_until <> ` + OwnerGone + `
        FOR UPDATE SKIP LOCKED)) -- a locked row is being acked in a handler's transaction (see takeRetry)
    RETURNING message_id
)
SELECT 'batch', id FROM b UNION ALL SELECT 'retry', message_id FROM r`
