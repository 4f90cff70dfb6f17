package outbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ExpireIdempotencyKeys deletes the idempotency keys, of every topic, whose
// window has passed, in batches, until none is left or ctx ends, and returns
// how many it deleted. The maintenance service (package maintenance, which
// pgoutbox.Client runs) calls it every cleanup interval. Sends ignore an
// expired key that is still stored, so this only reclaims space. Safe to
// run from many instances at once.
func (c *Client) ExpireIdempotencyKeys(ctx context.Context) (int64, error) {
	const batch = 1000
	var total int64
	for {
		tag, err := c.pool.Exec(ctx, c.sql.ExpireIdempotencyKeys, pgx.StrictNamedArgs{"now": c.now(), "batch_size": batch})
		if err != nil {
			return total, fmt.Errorf("outbox: expire idempotency keys: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < batch {
			return total, nil
		}
	}
}
