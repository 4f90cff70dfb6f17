package sqlq

import (
	"strings"

	"github.com/pgoutbox/pgoutbox/internal/ident"
)

// LockNamespace is the first key of every instance lock: a client's LISTEN
// session holds pg_advisory_lock(LockNamespace, key) while it lives, so a
// lock of another library, on a single bigint key or a pair with another
// first key, is never taken for one.
const LockNamespace = 1885826914 // "pgob"

// SessionSettings are the settings of a session whose end must be
// noticed (a client's proof of life, a leader's lock): TCP keepalives of
// 5 s idle, 1 s interval and 5 probes and a 10 s TCP user timeout, so the
// server ends the session of a vanished host within 10 s
// (outbox.KeepaliveBound; a Unix-domain socket ignores them).
const SessionSettings = `SELECT set_config('tcp_keepalives_idle', '5', false), set_config('tcp_keepalives_interval', '1', false),
       set_config('tcp_keepalives_count', '5', false), set_config('tcp_user_timeout', '10000', false)`

// OwnerGone is the lease end TakeBack gives the leases of an instance
// found gone: past, so the next look of the group takes them over, and
// apart from every other (an expired lease is later; a DEAD group's
// resurrection sets -infinity), so the look can say why.
const OwnerGone = "'epoch'::timestamptz"

// Liveness is the SQL that takes back the leases of instances whose
// client's session ended (see migration 19, outbox_live_instances).
type Liveness struct {
	// LockInstance tries the lock of @key on the calling session and
	// reports whether it holds it; WaitForLock takes it, waiting up to
	// the session's lock_timeout (set with SetLockTimeout to @wait).
	LockInstance, WaitForLock, SetLockTimeout string
	// RegisterInstances records that the client of every one of @members
	// holds the lock of @key (one member, as an instance starts, or all
	// of them, on a new session); UnregisterInstance forgets @member if it
	// is recorded with @key; ForgetInstance forgets @member if no session
	// holds its lock, and returns its key if it stays.
	RegisterInstances, UnregisterInstance, ForgetInstance string
	// GoneInstances lists the recorded instances whose lock no session
	// holds. It and TakeBack find nothing when @own, the calling client's
	// key (0: none), is held by no session on this server: the client's
	// session is on another (a failover moved the pool), and what it
	// would find free here is not known to be gone.
	GoneInstances string
	// TakeBack ends the leases of those of @members whose lock no session
	// holds, and forgets those that hold no lease any more (the next call
	// forgets those this one took back, and ends what a locked row kept
	// it from ending this time). It returns how many batches and retry
	// deliveries it took back, their topics and the instances it found gone.
	TakeBack string
}

// ForLiveness returns the statements for schema (already validated).
func ForLiveness(schema string) *Liveness {
	r := strings.NewReplacer("{{schema}}", ident.Quote(schema))
	return &Liveness{
		LockInstance:       r.Replace(lockInstance),
		WaitForLock:        r.Replace(waitForLock),
		SetLockTimeout:     r.Replace(setLockTimeout),
		RegisterInstances:  r.Replace(registerInstances),
		UnregisterInstance: r.Replace(unregisterInstance),
		ForgetInstance:     r.Replace(forgetInstance),
		GoneInstances:      r.Replace(goneInstances),
		TakeBack:           r.Replace(takeBack),
	}
}

const lockInstance = `SELECT pg_try_advisory_lock(@namespace::int, @key::int)`

const waitForLock = `SELECT pg_advisory_lock(@namespace::int, @key::int)`

const setLockTimeout = `SELECT set_config('lock_timeout', @wait, false)`

const registerInstances = `
INSERT INTO {{schema}}.outbox_live_instances (member, lock_key) SELECT m, @key FROM unnest(@members::text[]) AS m
ON CONFLICT (member) DO UPDATE SET lock_key = EXCLUDED.lock_key, registered_at = now()`

const unregisterInstance = `DELETE FROM {{schema}}.outbox_live_instances WHERE member = @member AND lock_key = @key`

// forgetInstance returns the key of @member's row if it stays (a session
// holds its lock).
const forgetInstance = `
WITH forgotten AS (
    DELETE FROM {{schema}}.outbox_live_instances AS i WHERE i.member = @member AND ` + lockFree + `
    RETURNING i.member
)
SELECT lock_key FROM {{schema}}.outbox_live_instances WHERE member = @member AND member NOT IN (SELECT member FROM forgotten)`

// lockFree is true when no session holds instance i's lock: this
// transaction can take it (and lets it go when it ends). Unlike a read of
// pg_locks, it is decided at once, and decided again for a row that
// changed while the statement ran.
const lockFree = `pg_try_advisory_xact_lock(@namespace::int, i.lock_key)`

// ownHeld: see GoneInstances.
const ownHeld = `own AS MATERIALIZED (
    SELECT @own::int = 0 OR NOT pg_try_advisory_xact_lock(@namespace::int, @own::int) AS held
)`

const goneInstances = `
WITH ` + ownHeld + `
SELECT i.member FROM {{schema}}.outbox_live_instances AS i
WHERE (SELECT held FROM own) AND ` + lockFree

// takeBack: a lease of -infinity (a DEAD group's return ended it) is
// left as it is. A batch or retry delivery whose row is locked is being
// finished, or acked in a handler's transaction (see takeRetry): it is
// skipped, and the instance stays recorded until a later call ends it.
const takeBack = `
WITH ` + ownHeld + `, gone AS MATERIALIZED (
    SELECT i.member FROM {{schema}}.outbox_live_instances AS i
    WHERE (SELECT held FROM own)
      AND CASE WHEN i.member = ANY(@members::text[]) THEN ` + lockFree + ` ELSE false END -- no lock taken on others' keys
    FOR UPDATE SKIP LOCKED
), batches AS (
    UPDATE {{schema}}.outbox_group_batches
    SET lease_until = ` + OwnerGone + `
    WHERE id = ANY (ARRAY(
        SELECT id FROM {{schema}}.outbox_group_batches
        WHERE member IN (SELECT member FROM gone) AND lease_until > ` + OwnerGone + `
        FOR UPDATE SKIP LOCKED))
    RETURNING subscription_id
), retries AS (
    UPDATE {{schema}}.outbox_group_retries AS r
    SET lease_until = ` + OwnerGone + `
    FROM (SELECT subscription_id, message_id FROM {{schema}}.outbox_group_retries
          WHERE status = 'PROCESSING' AND lease_owner IN (SELECT member FROM gone) AND lease_until > ` + OwnerGone + `
          FOR UPDATE SKIP LOCKED) AS held
    WHERE r.subscription_id = held.subscription_id AND r.message_id = held.message_id
    RETURNING r.subscription_id
), forgotten AS ( -- what this statement ends is not seen here: a later call forgets it
    DELETE FROM {{schema}}.outbox_live_instances AS i
    WHERE i.member IN (SELECT member FROM gone)
      AND NOT EXISTS (SELECT 1 FROM {{schema}}.outbox_group_batches AS b
                      WHERE b.member = i.member AND b.lease_until > ` + OwnerGone + `)
      AND NOT EXISTS (SELECT 1 FROM {{schema}}.outbox_group_retries AS r
                      WHERE r.status = 'PROCESSING' AND r.lease_owner = i.member AND r.lease_until > ` + OwnerGone + `)
)
SELECT (SELECT count(*) FROM batches), (SELECT count(*) FROM retries),
       ARRAY(SELECT DISTINCT s.topic FROM {{schema}}.outbox_topic_subscriptions AS s
             WHERE s.id IN (SELECT subscription_id FROM batches UNION SELECT subscription_id FROM retries)),
       ARRAY(SELECT member FROM gone)`
