package sqlq

import (
	"strings"

	"github.com/pgoutbox/pgoutbox/internal/ident"
)

// Inbox is the SQL of package inbox: the keys of handled messages, per
// inbox, in outbox_inbox.
type Inbox struct {
	Seen, Record, Recent, Expire string
}

// ForInbox returns the statements for schema (already validated).
func ForInbox(schema string) *Inbox {
	r := strings.NewReplacer("{{schema}}", ident.Quote(schema))
	return &Inbox{
		Seen:   r.Replace(inboxSeen),
		Record: r.Replace(inboxRecord),
		Recent: r.Replace(inboxRecent),
		Expire: r.Replace(expireInbox),
	}
}

// inboxSeen: inbox $1 recorded key $2 (the pre-check, outside any
// transaction).
const inboxSeen = `SELECT EXISTS (SELECT 1 FROM {{schema}}.outbox_inbox WHERE inbox = $1 AND key = $2)`

// inboxRecord records key $2 in inbox $1 at $3 (now), kept for $4
// microseconds; no row means it was recorded already. In the handler's
// transaction, first: a second delivery of the key waits here until the
// first one's transaction ends, and then finds it (or, after a rollback,
// takes its place).
const inboxRecord = `
INSERT INTO {{schema}}.outbox_inbox (inbox, key, recorded_at, expires_at)
VALUES ($1, $2, coalesce($3::timestamptz, now()), coalesce($3::timestamptz, now()) + $4 * interval '1 microsecond')
ON CONFLICT DO NOTHING`

// inboxRecent returns the $2 keys inbox $1 recorded last and still keeps
// at $3 (now), newest first: what a new process loads into its filter.
const inboxRecent = `
SELECT key FROM {{schema}}.outbox_inbox
WHERE inbox = $1 AND expires_at > coalesce($3::timestamptz, now())
ORDER BY recorded_at DESC LIMIT $2`

// expireInbox deletes up to $2 inbox keys that expired before $1 (now).
const expireInbox = `
DELETE FROM {{schema}}.outbox_inbox AS k
USING (SELECT inbox, key FROM {{schema}}.outbox_inbox
       WHERE expires_at <= coalesce($1::timestamptz, now())
       ORDER BY expires_at
       LIMIT $2
       FOR UPDATE SKIP LOCKED) AS e
WHERE k.inbox = e.inbox AND k.key = e.key`
