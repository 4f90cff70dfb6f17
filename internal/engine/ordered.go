package engine

import (
	"context"
	"time"
)

// Ordered groups. A group of an ordered topic
// (outbox.TopicConfig.Ordered), and one configured to read by message
// group (consumergroup.Config.ByMessageGroup; all that follows holds for
// it, with ids in place of commit order), does not hand out what it reads
// as batches: each look queues the rows it reads in the group's retry
// table, as retries that never ran, and claims from there only the head
// of each message group (its oldest queued message, by id: on an ordered
// topic ids follow commit order within a message group) while no other
// message of that message group is leased, plus a run of the messages
// right behind a free head (see sqlq's claimOrderedRetries). An executor
// handles a run in order and hands back what is left of it when one
// fails. Retries, lease expiries, dead letters and replays are the retry
// table's, so they keep the order too; what orders the stream is the
// claim, in the database, so no number of instances, crashes or restarts
// can reorder a message group.
//
// A snapshot pair's rows are read in (xid, id) order, which is not commit
// order within a message group: a pair read in several looks could queue
// a message group's later message before its earlier one, and a claim
// between the two looks would take it. So a look claims only once the
// pair it reads is queued whole, and a pending backfill is queued whole
// before the stream is read at all (its messages are older than the
// stream's).
//
// What an ordered group records per message, in every tracking mode: one
// retry row (inserted when read, updated when leased, deleted when done),
// beside the tracking mode's own completion record (none in Offset mode).

// orderedPage is the most messages a look of an ordered group queues.
const orderedPage = 1000

// lookOrdered is the rest of fetchOnce for an ordered group: queue the
// pending backfill's next rows, or else the stream's, and once the
// stream's pair is queued whole, claim. It commits.
func (f *Fetcher) lookOrdered(ctx context.Context, tx *LookTx, p position, snapshot string, limit int) (fetchResult, error) {
	if b := p.backfill; b != nil && !b.readingEnded {
		f.backfilling.Store(true)
		n, err := f.fetchCatchup(ctx, tx, b, orderedPage)
		if err != nil {
			return 0, err
		}
		if err := tx.Commit(ctx); err != nil {
			return 0, err
		}
		if n == 0 {
			want := max(1, f.catchupSize(b, orderedPage))
			if f.catchupWait = f.throttle.wait(time.Now(), want); f.catchupWait > 0 {
				return fetchedNothing, nil // throttled
			}
		}
		return fetchedWork, nil
	}
	f.backfilling.Store(false)
	pr, err := f.nextRows(ctx, tx, p, snapshot, orderedPage, nil)
	if err != nil {
		return 0, err
	}
	if err := f.park(ctx, tx, pr.rows); err != nil {
		return 0, err
	}
	if !pr.exhausted {
		return fetchedWork, tx.Commit(ctx) // the rest of the pair first
	}
	n, err := f.claimRetries(ctx, tx, limit)
	if err != nil || n > 0 {
		return fetchedWork, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, err
	}
	if len(pr.rows) > 0 {
		return fetchedWork, nil
	}
	f.idle = true
	return fetchedNothing, nil
}
