package admin

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Watermark is a point in the order transactions end, read with
// Admin.Watermark: every transaction that began before it has ended.
// Two watermarks bound what was written between them, once and for
// good, which makes a series of them a cheap way to count a topic's
// sends (Admin.SentBetween) without counting the topic.
type Watermark int64

// Watermark reads the server's watermark now. A transaction held open
// (a long report, an idle session in a transaction) holds it back: what
// is sent meanwhile is counted once it ends.
func (a *Admin) Watermark(ctx context.Context) (Watermark, error) {
	var w Watermark
	if err := a.pool.QueryRow(ctx, a.q.Watermark).Scan(&w); err != nil {
		return 0, fmt.Errorf("admin: watermark: %w", err)
	}
	return w, nil
}

// SentBetween counts topic's stored messages written between watermarks
// from and to (read earlier and later), up to limit: an index range scan
// of what was sent in between, never of the topic. A message that was
// sent, handled and deleted by cleanup before the count is not counted.
func (a *Admin) SentBetween(ctx context.Context, topic string, from, to Watermark, limit int64) (int64, error) {
	if to <= from {
		return 0, nil
	}
	var n int64
	err := a.pool.QueryRow(ctx, a.q.SentBetween, pgx.StrictNamedArgs{"topic": topic, "from": int64(from), "to": int64(to), "limit": limit}).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("admin: sends of %q: %w", topic, err)
	}
	return n, nil
}
