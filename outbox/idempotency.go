package outbox

import (
	"context"
	"fmt"
)

// ExpireIdempotencyKeys deletes up to limit idempotency keys, of any topic,
// whose window has passed, and returns how many it deleted. Consumers call
// it in the background; an expired key that is still stored is ignored by
// sends, so this only reclaims space.
func (c *Client) ExpireIdempotencyKeys(ctx context.Context, limit int) (int64, error) {
	if limit < 1 {
		return 0, fmt.Errorf("%w: limit must be at least 1", ErrInvalidConfig)
	}
	tag, err := c.pool.Exec(ctx, c.sql.ExpireIdempotencyKeys, c.now(), limit)
	if err != nil {
		return 0, fmt.Errorf("outbox: expire idempotency keys: %w", err)
	}
	return tag.RowsAffected(), nil
}
