package pubsub

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/pgoutbox/pgoutbox/internal/ident"
	"github.com/pgoutbox/pgoutbox/internal/sqlq"
)

// Watermark returns the least committed position of topic's subscribed
// (ACTIVE or PAUSED) groups, in the tables of schema, as pg_snapshot text,
// or "" when none is subscribed. Every position is a snapshot taken at some moment (or the
// empty one), so they are ordered by inclusion: a snapshot taken earlier
// sees a subset of what a later one sees. The least is found by comparing
// xmax, then xmin, then the in-progress list (longer is earlier).
func Watermark(ctx context.Context, db DB, schema, topic string) (string, error) {
	schema, err := ident.Schema(schema)
	if err != nil {
		return "", err
	}
	return watermark(ctx, db, sqlq.ForPubSub(schema), topic)
}

func watermark(ctx context.Context, db DB, q *sqlq.PubSub, topic string) (string, error) {
	rows, err := db.Query(ctx, q.CommittedPosition, topic)
	if err != nil {
		return "", fmt.Errorf("pubsub: committed positions: %w", err)
	}
	defer rows.Close()
	least := ""
	var leastKey snapKey
	for rows.Next() {
		var id int64
		var pos string
		if err := rows.Scan(&id, &pos); err != nil {
			return "", fmt.Errorf("pubsub: committed positions: %w", err)
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
		return "", fmt.Errorf("pubsub: committed positions: %w", err)
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
		return snapKey{}, fmt.Errorf("pubsub: bad snapshot %q", s)
	}
	xmin, err1 := strconv.ParseUint(parts[0], 10, 64)
	xmax, err2 := strconv.ParseUint(parts[1], 10, 64)
	if err1 != nil || err2 != nil {
		return snapKey{}, fmt.Errorf("pubsub: bad snapshot %q", s)
	}
	n := 0
	if parts[2] != "" {
		n = strings.Count(parts[2], ",") + 1
	}
	return snapKey{xmin: xmin, xmax: xmax, inProgress: n}, nil
}
