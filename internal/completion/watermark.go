package completion

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// watermark returns the least committed position of the ACTIVE and
// PAUSED groups of topic, read with the statements q, as pg_snapshot text,
// or "" when there is none. A DEAD group does not hold it back: within
// its topic's ZombieTTL it holds only what it had not finished when it
// died, which cleanup and the partition check ask apart. Every position
// is a snapshot taken at some moment (or the empty one), so they are
// ordered by inclusion: a snapshot taken earlier sees a subset of what a
// later one sees. The least is found by comparing xmax, then xmin, then
// the in-progress list (longer is earlier).
func watermark(ctx context.Context, db DB, q *sqlq.PubSub, topic string) (string, error) {
	rows, err := db.Query(ctx, q.CommittedPosition, pgx.StrictNamedArgs{"topic": topic})
	if err != nil {
		return "", fmt.Errorf("completion: committed positions: %w", err)
	}
	defer rows.Close()
	least := ""
	var leastKey snapKey
	for rows.Next() {
		var id int64
		var pos string
		if err := rows.Scan(&id, &pos); err != nil {
			return "", fmt.Errorf("completion: committed positions: %w", err)
		}
		k, err := parseSnapshot(pos)
		if err != nil {
			return "", err
		}
		if least == "" || k.before(leastKey) {
			least, leastKey = pos, k
		}
	}
	if err := rows.Err(); err != nil {
		return "", fmt.Errorf("completion: committed positions: %w", err)
	}
	return least, nil
}

type snapKey struct {
	xmin, xmax uint64
	inProgress int
}

func (a snapKey) before(b snapKey) bool {
	if a.xmax != b.xmax {
		return a.xmax < b.xmax
	}
	if a.xmin != b.xmin {
		return a.xmin < b.xmin
	}
	return a.inProgress > b.inProgress
}

// parseSnapshot reads pg_snapshot's text form "xmin:xmax:xip,xip,...".
func parseSnapshot(s string) (snapKey, error) {
	parts := strings.SplitN(s, ":", 3)
	if len(parts) != 3 {
		return snapKey{}, fmt.Errorf("completion: bad snapshot %q", s)
	}
	xmin, err1 := strconv.ParseUint(parts[0], 10, 64)
	xmax, err2 := strconv.ParseUint(parts[1], 10, 64)
	if err1 != nil || err2 != nil {
		return snapKey{}, fmt.Errorf("completion: bad snapshot %q", s)
	}
	n := 0
	if parts[2] != "" {
		n = strings.Count(parts[2], ",") + 1
	}
	return snapKey{xmin: xmin, xmax: xmax, inProgress: n}, nil
}

// Bounds bound a cleanup pass of one topic.
type Bounds struct {
	// Watermark is the least committed position of the ACTIVE and PAUSED
	// groups ("" when none): every such group has passed the rows
	// visible in it.
	Watermark string
	// Below is an xid8 (text): the pass scans rows with smaller xids
	// only, in (topic, xid) index order. From it on, rows are unfinished
	// (not visible in the watermark) or too young (from the retention
	// frontier on), so no pass reads them again and again.
	Below string
}

// CleanupBounds computes the bounds of a cleanup pass of topic that
// deletes rows older than keep's retentions, and records the watermark.
// A DEAD group's position does not bound the scan: what it owes is kept
// row by row (in Bitmap and Counter mode it is in their required sets; in
// Offset mode cleanup asks its claim), and the messages written after it
// died need it no more.
func CleanupBounds(ctx context.Context, db DB, q *sqlq.PubSub, t outbox.TopicConfig, keep Retention) (Bounds, error) {
	topic := t.Name
	var b Bounds
	var err error
	var now time.Time
	if err := db.QueryRow(ctx, q.SnapshotXmax).Scan(&b.Below, &now); err != nil {
		return Bounds{}, fmt.Errorf("completion: cleanup bounds: %w", err)
	}
	if keep.Now != nil {
		now = *keep.Now
	}
	if b.Watermark, err = watermark(ctx, db, q, topic); err != nil {
		return Bounds{}, err
	}
	if b.Watermark != "" {
		if _, err := exec(ctx, db, "record watermark", q.UpsertWatermark, pgx.StrictNamedArgs{"topic": topic, "watermark": b.Watermark}); err != nil {
			return Bounds{}, err
		}
		b.Below = strings.SplitN(b.Watermark, ":", 3)[1] // its xmax: rows from it on are not visible in it
	}
	if b.Below, err = frontier(ctx, db, q, topic, b.Below, now.Add(-min(keep.Completed, keep.ZeroSubscription))); err != nil {
		return Bounds{}, err
	}
	return b, nil
}

// RetentionFrontier returns an xid8 (text) below which topic's rows were
// written before keep's retentions (the shorter of them): cleanup scans no
// further.
func RetentionFrontier(ctx context.Context, db DB, q *sqlq.PubSub, topic string, keep Retention) (string, error) {
	var xmax string
	var now time.Time
	if err := db.QueryRow(ctx, q.SnapshotXmax).Scan(&xmax, &now); err != nil {
		return "", fmt.Errorf("completion: retention frontier: %w", err)
	}
	if keep.Now != nil {
		now = *keep.Now
	}
	return frontier(ctx, db, q, topic, xmax, now.Add(-min(keep.Completed, keep.ZeroSubscription)))
}

// frontier is the xid of topic's first row below below written at or
// after cutoff, or below when there is none.
func frontier(ctx context.Context, db DB, q *sqlq.PubSub, topic, below string, cutoff time.Time) (string, error) {
	var xid *string
	err := db.QueryRow(ctx, q.RetentionFrontier, pgx.StrictNamedArgs{"topic": topic, "below": below, "cutoff": cutoff}).Scan(&xid)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("completion: retention frontier: %w", err)
	}
	if xid != nil {
		return *xid, nil
	}
	return below, nil
}
