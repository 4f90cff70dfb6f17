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

// Liveness is the SQL that takes back the leases of instances whose
// client's session ended (see migration 19, outbox_live_instances).
type Liveness struct {
	// LockInstance tries the lock of @key on the calling session and
	// reports whether it holds it.
	LockInstance string
	// RegisterInstance records that @member's client holds the lock of
	// @key; UnregisterInstance forgets @member.
	RegisterInstance, UnregisterInstance string
	// GoneInstances lists the recorded instances whose lock no session
	// holds.
	GoneInstances string
	// TakeBack ends at once the leases of @members (instances found gone)
	// and forgets them, but for one whose lock a session took again
	// meanwhile. It returns the batches and retry deliveries it took
	// back and the topics they belong to.
	TakeBack string
}

// ForLiveness returns the statements for schema (already validated).
func ForLiveness(schema string) *Liveness {
	r := strings.NewReplacer("{{schema}}", ident.Quote(schema))
	return &Liveness{
		LockInstance:       r.Replace(lockInstance),
		RegisterInstance:   r.Replace(registerInstance),
		UnregisterInstance: r.Replace(unregisterInstance),
		GoneInstances:      r.Replace(goneInstances),
		TakeBack:           r.Replace(takeBack),
	}
}

const lockInstance = `SELECT pg_try_advisory_lock(@namespace::int, @key::int)`

const registerInstance = `
INSERT INTO {{schema}}.outbox_live_instances (member, lock_key) VALUES (@member, @key)
ON CONFLICT (member) DO UPDATE SET lock_key = EXCLUDED.lock_key, registered_at = now()`

const unregisterInstance = `DELETE FROM {{schema}}.outbox_live_instances WHERE member = @member`

// lockFree is true when no session of this database holds instance i's
// lock. A lock taken with two int4 keys shows in pg_locks as classid,
// objid and objsubid 2.
const lockFree = `NOT EXISTS (
    SELECT 1 FROM pg_locks AS l
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.classid = @namespace::int::oid AND l.objid = i.lock_key::oid)`

const goneInstances = `
SELECT i.member FROM {{schema}}.outbox_live_instances AS i
WHERE ` + lockFree

// takeBack sets the leases of the gone instances' batches and retry
// deliveries to -infinity: the next look of their group takes them over
// (a batch) or returns them to the queue (a retry), and says the owner
// was gone. A retry delivery whose row is locked is being acked in a
// handler's transaction (see takeRetry); it is left to its lease.
const takeBack = `
WITH gone AS (
    DELETE FROM {{schema}}.outbox_live_instances AS i
    WHERE i.member = ANY(@members::text[]) AND ` + lockFree + `
    RETURNING i.member
), batches AS (
    UPDATE {{schema}}.outbox_group_batches
    SET lease_until = '-infinity'
    WHERE member IN (SELECT member FROM gone) AND lease_until > '-infinity'
    RETURNING subscription_id
), retries AS (
    UPDATE {{schema}}.outbox_group_retries AS r
    SET lease_until = '-infinity'
    FROM (SELECT subscription_id, message_id FROM {{schema}}.outbox_group_retries
          WHERE status = 'PROCESSING' AND lease_owner IN (SELECT member FROM gone) AND lease_until > '-infinity'
          FOR UPDATE SKIP LOCKED) AS held
    WHERE r.subscription_id = held.subscription_id AND r.message_id = held.message_id
    RETURNING r.subscription_id
)
SELECT (SELECT count(*) FROM batches), (SELECT count(*) FROM retries),
       ARRAY(SELECT DISTINCT s.topic FROM {{schema}}.outbox_topic_subscriptions AS s
             WHERE s.id IN (SELECT subscription_id FROM batches UNION SELECT subscription_id FROM retries)),
       ARRAY(SELECT member FROM gone)`
