package outbox

import (
	"context"
	"fmt"
)

// ExpireIdempotencyKeys deletes up to limit idempotency keys, of any topic,
// whose window has passed, and returns how many it deleted. Running QUEUE
// consumers call it every PollInterval; a service that runs only consumer
// groups calls it from its maintenance job, beside consumergroup's Cleanup.
// Sends ignore an expired key that is still stored, so this only reclaims
// space. Safe to run from many instances at once.
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
