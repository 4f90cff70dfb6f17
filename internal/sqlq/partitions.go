package sqlq

import (
	"strconv"
	"strings"

	"github.com/pgoutbox/pgoutbox/internal/ident"
)

// Partitions is the SQL that keeps outbox_published's range partitions:
// one per xid range [lo, hi), listed in outbox_partitions, each a table
// named outbox_published_p<id> (see Table). Nothing a caller
// names reaches these statements: table names come from the partition's
// id, bounds are xid8 numbers.
type Partitions struct {
	schema string

	// Lock takes, until the transaction ends, the schema's partition lock
	// if it is free (a boolean): one maintenance instance at a time adds
	// or drops partitions.
	Lock string
	// AwaitLock takes the schema's partition lock until the transaction
	// ends, waiting for it if another transaction holds it: for a tool
	// that reshapes the partitions beside running maintenance instances
	// (the tests do), which then skip their steps until it commits.
	AwaitLock string
	// Clock is the current snapshot's xmin (every xid below it has
	// finished: a range below it is sealed), its xmax (the next xid to be
	// assigned) and the database's time.
	Clock string
	// List is every range partition, oldest first: id, lo, hi,
	// created_at, created_xid, sealed_at.
	List string
	// Seal records that partition @partition_id is sealed, unless that is
	// recorded already, and returns when it was (no row: the partition is
	// gone).
	Seal string
	// Insert records a new range partition (@lo, @hi: its bounds, xid8s
	// as text) and returns its id.
	Insert string
	// Listed is true while partition @partition_id is in the list.
	Listed string
	// Forget removes partition @partition_id from the list.
	Forget string
	// LockParent takes the partitioned table's lock alone (not its
	// partitions'), so that dropping a partition waits for the statements
	// that started, and holds new ones back, in the order every statement
	// takes its locks: the table first, then its partitions.
	LockParent string
}

// ForPartitions returns the statements for schema (already validated).
func ForPartitions(schema string) *Partitions {
	r := strings.NewReplacer("{{schema}}", ident.Quote(schema))
	q := func(s string) string { return r.Replace(s) }
	return &Partitions{
		schema:     schema,
		Lock:       q(partitionLock),
		AwaitLock:  q(awaitPartitionLock),
		Clock:      q(partitionClock),
		List:       q(listPartitions),
		Seal:       q(sealPartition),
		Insert:     q(insertPartition),
		Listed:     q(`SELECT EXISTS (SELECT 1 FROM {{schema}}.outbox_partitions WHERE id = @partition_id)`),
		Forget:     q(forgetPartition),
		LockParent: q(`LOCK TABLE ONLY {{schema}}.outbox_published IN ACCESS EXCLUSIVE MODE`),
	}
}

// partitionLockClass is the first key of the partition lock ("pgop"); the
// second is the oid of the schema's outbox_partitions table, so schemas do
// not share it.
const partitionLockClass = `1885826928`

const partitionLock = `SELECT pg_try_advisory_xact_lock(` + partitionLockKeys + `)`

const awaitPartitionLock = `SELECT pg_advisory_xact_lock(` + partitionLockKeys + `)`

const partitionLockKeys = partitionLockClass + `, '{{schema}}.outbox_partitions'::regclass::oid::integer`

const partitionClock = `
SELECT pg_snapshot_xmin(s)::text, pg_snapshot_xmax(s)::text, now() FROM pg_current_snapshot() AS s`

const listPartitions = `
SELECT p.id, p.lo::text, p.hi::text, p.created_at, p.created_xid::text, p.sealed_at
FROM {{schema}}.outbox_partitions AS p ORDER BY p.lo` // by the xid8, not its text

// sealPartition records that partition @partition_id is sealed. It
// writes sealed_at only the first time (the table is read every pass; a
// version per pass would bloat it).
const sealPartition = `
WITH sealed AS (
    UPDATE {{schema}}.outbox_partitions SET sealed_at = now() WHERE id = @partition_id AND sealed_at IS NULL
    RETURNING sealed_at
)
SELECT sealed_at FROM sealed
UNION ALL
SELECT sealed_at FROM {{schema}}.outbox_partitions WHERE id = @partition_id AND sealed_at IS NOT NULL`

// insertPartition records range partition [@lo, @hi) (xid8s, as text)
// and returns its id.
const insertPartition = `
INSERT INTO {{schema}}.outbox_partitions (lo, hi) VALUES (@lo::text::xid8, @hi::text::xid8) RETURNING id`

// forgetPartition removes partition @partition_id from the list.
const forgetPartition = `DELETE FROM {{schema}}.outbox_partitions WHERE id = @partition_id`

// Table is the qualified, quoted name of partition id's table.
func (p *Partitions) Table(id int64) string {
	return ident.Quote(p.schema) + "." + ident.Quote("outbox_published_p"+strconv.FormatInt(id, 10))
}

// Create is the DDL that makes partition id's table for xids [lo, hi):
// an empty table shaped like outbox_published, then attached to it.
// Attaching (rather than CREATE TABLE … PARTITION OF) takes a SHARE UPDATE
// EXCLUSIVE lock on outbox_published, which inserts and reads do not wait
// for, and scans the default partition, which is normally empty.
func (p *Partitions) Create(id int64, lo, hi uint64) []string {
	table := p.Table(id)
	parent := ident.Quote(p.schema) + ".outbox_published"
	return []string{
		`CREATE TABLE ` + table + ` (LIKE ` + parent + ` INCLUDING DEFAULTS)`,
		`ALTER TABLE ` + parent + ` ATTACH PARTITION ` + table + ` FOR VALUES FROM ('` +
			strconv.FormatUint(lo, 10) + `') TO ('` + strconv.FormatUint(hi, 10) + `')`,
	}
}

// Topics lists the topics with a row in partition id's table, skipping
// through its (topic, xid, id) index from one topic to the next.
func (p *Partitions) Topics(id int64) string {
	table := p.Table(id)
	return `
WITH RECURSIVE t AS (
    (SELECT topic FROM ` + table + ` ORDER BY topic LIMIT 1)
    UNION ALL
    SELECT (SELECT o.topic FROM ` + table + ` AS o WHERE o.topic > t.topic ORDER BY o.topic LIMIT 1)
    FROM t WHERE t.topic IS NOT NULL
)
SELECT topic FROM t WHERE topic IS NOT NULL`
}

// ForgetCompletions deletes the Counter dedupe rows of partition id's
// messages, which go with it.
func (p *Partitions) ForgetCompletions(id int64) string {
	return `DELETE FROM ` + ident.Quote(p.schema) + `.outbox_consumer_groups
WHERE message_id IN (SELECT id FROM ` + p.Table(id) + `)`
}

// WrittenSince is true when partition id's table has a row version
// written by a transaction that @xmin (an xid8, as text: the xmin of a
// snapshot taken before the partition was checked) does not see as
// finished: the partition was written to while it was checked. That
// happens only when something sets the xid column by hand (pgoutbox never
// does: it is the writing transaction's id), and makes the drop wait for
// the next check. It reads every row version of the table.
func (p *Partitions) WrittenSince(id int64) string {
	return `SELECT EXISTS (SELECT 1 FROM ` + p.Table(id) + `
WHERE age(xmin) <= age((@xmin::text::numeric % 4294967296)::text::xid))`
}

// Drop is the DDL that drops partition id's table.
func (p *Partitions) Drop(id int64) string { return `DROP TABLE ` + p.Table(id) }

// SetLockTimeout bounds, for the rest of the transaction, how long a
// statement waits for a lock (ms milliseconds).
func SetLockTimeout(ms int64) string {
	return `SET LOCAL lock_timeout = ` + strconv.FormatInt(max(ms, 1), 10)
}
