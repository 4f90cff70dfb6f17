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

// inboxSeen: inbox @inbox recorded key @key (the pre-check, outside any
// transaction).
const inboxSeen = `SELECT EXISTS (SELECT 1 FROM {{schema}}.outbox_inbox WHERE inbox = @inbox AND key = @key)`

// inboxRecord records key @key in inbox @inbox at @now, kept for
// @retention_us microseconds; no row means it was recorded already. In
// the handler's transaction, first: a second delivery of the key waits
// here until the first one's transaction ends, and then finds it (or,
// after a rollback, takes its place).
const inboxRecord = `
INSERT INTO {{schema}}.outbox_inbox (inbox, key, recorded_at, expires_at)
VALUES (@inbox, @key, coalesce(@now::timestamptz, now()), coalesce(@now::timestamptz, now()) + @retention_us * interval '1 microsecond')
ON CONFLICT DO NOTHING`

// inboxRecent returns the @limit keys inbox @inbox recorded last and still
// keeps at @now, newest first: what a new process loads into its filter.
const inboxRecent = `
SELECT key FROM {{schema}}.outbox_inbox
WHERE inbox = @inbox AND expires_at > coalesce(@now::timestamptz, now())
ORDER BY recorded_at DESC LIMIT @limit`

// expireInbox deletes up to @batch_size inbox keys that expired before
// @now.
const expireInbox = `
DELETE FROM {{schema}}.outbox_inbox AS k
USING (SELECT inbox, key FROM {{schema}}.outbox_inbox
       WHERE expires_at <= coalesce(@now::timestamptz, now())
       ORDER BY expires_at
       LIMIT @batch_size
       FOR UPDATE SKIP LOCKED) AS e
WHERE k.inbox = e.inbox AND k.key = e.key`
