package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/groupwalk"
)

// ErrLeaseLost: the delivery's lease expired and the message was returned
// to the queue (or claimed again); the outcome was not recorded.
var ErrLeaseLost = errors.New("outbox: lease lost")

// The methods below are the building blocks of Consumer, for programs that
// settle messages themselves and asynchronously (the router package does).
// A delivery is identified by (ID, Attempt): settling one whose lease
// expired and was reclaimed since changes nothing and returns ErrLeaseLost.

// Claim leases up to limit available messages of a QUEUE topic to owner,
// highest priority first, for the topic's Lease. On an ordered topic
// (TopicConfig.Ordered) it leases at most one message per message group,
// the group's oldest, and none of a group that has one leased; the
// priority of a group's oldest message chooses between groups, and groups
// of one priority take turns. Messages whose lease expired are available
// again and claimed like the others (with the next attempt); one whose
// expired lease was its last attempt is dead-lettered instead of
// returned. The batch is returned in id order.
func (c *Client) Claim(ctx context.Context, topic, owner string, limit int) ([]*Delivery, error) {
	if limit < 1 || owner == "" {
		return nil, fmt.Errorf("%w: Claim needs an owner and limit >= 1", ErrInvalidConfig)
	}
	t, err := c.Topic(ctx, topic)
	if err != nil {
		return nil, err
	}
	if t.Semantics != Queue {
		return nil, fmt.Errorf("%w: %q is a %s topic", ErrWrongSemantics, topic, t.Semantics)
	}
	if t.Tracking != "" {
		return nil, errOnLog(topic)
	}
	claimed, err := c.claim(ctx, t, owner, limit, 1)
	if err != nil {
		return nil, err
	}
	ds := make([]*Delivery, len(claimed))
	for i, cl := range claimed {
		ds[i] = cl.d
	}
	// In id order, so messages of one group come in the order they were written.
	slices.SortFunc(ds, func(a, b *Delivery) int { return cmp.Compare(a.ID, b.ID) })
	return ds, nil
}

// claimed is a claimed delivery, when it had become available, and, for a
// message taken back from an expired lease, who held that lease.
type claimed struct {
	d             *Delivery
	availableAt   time.Time
	previousOwner string
}

// claim runs the claim statement for topic t (rows in no particular
// order). On an ordered topic it hands out, per message group, the head
// and up to run-1 messages right behind it.
func (c *Client) claim(ctx context.Context, t TopicConfig, owner string, limit, run int) ([]claimed, error) {
	query, args := c.sql.Claim, []any{t.Name, limit, c.now(), owner, t.Lease.Microseconds()}
	var after string
	if t.Ordered {
		if v, ok := c.walks.Load(t.Name); ok {
			after = v.(string)
		}
		query, args = c.sql.ClaimOrdered, append(args, t.OrderedDeadLetters == BlockGroup, after, run)
	}
	rows, err := c.pool.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("outbox: claim: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (claimed, error) {
		cl := claimed{d: &Delivery{Topic: t.Name, MaxAttempts: t.MaxAttempts}}
		var prio int16
		var previousOwner *string
		err := r.Scan(&cl.d.ID, &cl.d.Payload, &cl.d.Headers, &cl.d.CorrelationID, &cl.d.Group, &prio,
			&cl.d.Attempt, &cl.d.CreatedAt, &cl.d.LeaseUntil, &cl.availableAt, &previousOwner)
		cl.d.Priority = int(prio)
		if previousOwner != nil {
			cl.previousOwner = *previousOwner
		}
		return cl, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: claim: %w", err)
	}
	if t.Ordered && len(out) > 0 {
		c.walks.Store(t.Name, groupwalk.End(after, turnTakers(out), func(cl claimed) string { return cl.d.Group }))
	}
	return c.takeBackExpired(ctx, t, out)
}

// turnTakers are the heads of an ordered claim (each group's first
// message in it) of the lowest priority among them: the groups that had
// their turn. The claim took its heads of a higher priority ahead of
// their turn, so the next claim's walk starts after the last group it
// took in turn, not after those: a group with a stream of urgent
// messages does not make the walk skip the groups between.
func turnTakers(out []claimed) []claimed {
	heads := map[string]claimed{}
	for _, cl := range out {
		if h, ok := heads[cl.d.Group]; cl.d.Group != "" && (!ok || cl.d.ID < h.d.ID) {
			heads[cl.d.Group] = cl
		}
	}
	var takers []claimed
	for _, h := range heads {
		switch {
		case len(takers) == 0 || h.d.Priority < takers[0].d.Priority:
			takers = append(takers[:0], h)
		case h.d.Priority == takers[0].d.Priority:
			takers = append(takers, h)
		}
	}
	return takers
}

// takeBackExpired logs the claimed messages whose lease had expired (at
// most once per topic and LogInterval, the next record counting those
// left out) and dead-letters, instead of delivering, those whose expired lease was their
// last attempt (giving back the attempt the claim counted). On an ordered
// topic, what the claim took behind such a message in its group (a run)
// is handed back untried: it waits for the dead letter, or, when the topic
// skips dead letters, for the next claim.
func (c *Client) takeBackExpired(ctx context.Context, t TopicConfig, out []claimed) ([]claimed, error) {
	expired := 0
	for _, cl := range out {
		if cl.previousOwner != "" {
			expired++
		}
	}
	if expired == 0 {
		return out, nil
	}
	c.takeovers.Sum(slog.LevelWarn, "takeover|"+t.Name, "pgoutbox: took back messages whose lease expired",
		"count", int64(expired), slog.String("topic", t.Name))
	var err error
	deadAt := map[string]int64{} // message group -> its lowest id dead-lettered here
	out = slices.DeleteFunc(out, func(cl claimed) bool {
		if err != nil || cl.previousOwner == "" || cl.d.Attempt <= t.MaxAttempts {
			return false
		}
		err = c.settle(ctx, cl.d, c.now(), 0, true, "lease expired (consumer "+cl.previousOwner+")", 1)
		if g := cl.d.Group; err == nil && t.Ordered && g != "" {
			if at, ok := deadAt[g]; !ok || cl.d.ID < at {
				deadAt[g] = cl.d.ID
			}
		}
		return err == nil
	})
	if err != nil || len(deadAt) == 0 {
		return out, err
	}
	out = slices.DeleteFunc(out, func(cl claimed) bool {
		at, ok := deadAt[cl.d.Group]
		if err != nil || !ok || cl.d.ID < at {
			return false
		}
		err = c.Release(ctx, cl.d, false)
		return err == nil
	})
	return out, err
}

// Ack deletes handled messages.
func (c *Client) Ack(ctx context.Context, ds ...*Delivery) error {
	lost, err := c.ack(ctx, c.pool, ds...)
	if err == nil && lost > 0 {
		err = fmt.Errorf("%w: %d of %d acks", ErrLeaseLost, lost, len(ds))
	}
	return err
}

// ack deletes the messages of ds whose leases still stand, with db (the
// pool, or a caller's transaction), and returns how many did not.
func (c *Client) ack(ctx context.Context, db Executor, ds ...*Delivery) (int, error) {
	ids, attempts := make([]int64, len(ds)), make([]int32, len(ds))
	for i, d := range ds {
		ids[i], attempts[i] = d.ID, int32(d.Attempt)
	}
	tag, err := db.Exec(ctx, c.sql.Ack, ids, attempts)
	if err != nil {
		return 0, fmt.Errorf("outbox: ack: %w", err)
	}
	return len(ds) - int(tag.RowsAffected()), nil
}

// AckTx deletes handled message d inside tx, the caller's transaction
// that holds the handler's own writes: they and the ack commit together,
// or neither does. So a handler whose effects are writes to this database
// has them exactly once. It checks that d's lease still stands (the
// message was not claimed again since): if not, it returns ErrLeaseLost
// and the caller must roll tx back, so that only the redelivery's effects
// remain. Call it last in tx: the message's row stays locked until tx
// ends (a claim passes over it meanwhile). A consumer's handler that acked
// in its transaction returns nil; the consumer's own ack then finds
// nothing left to do.
func (c *Client) AckTx(ctx context.Context, tx Executor, d *Delivery) error {
	if tx == nil {
		return fmt.Errorf("%w: AckTx of message %d", ErrNilExecutor, d.ID)
	}
	lost, err := c.ack(ctx, tx, d)
	if err == nil && lost > 0 {
		err = fmt.Errorf("%w: message %d attempt %d", ErrLeaseLost, d.ID, d.Attempt)
	}
	return err
}

// Retry ends d's lease and makes the message available again after delay
// (or dead-letters it when that was its last attempt), recording reason.
func (c *Client) Retry(ctx context.Context, d *Delivery, delay time.Duration, reason string) error {
	return c.settleOne(ctx, d, delay, d.Attempt >= d.MaxAttempts && d.MaxAttempts > 0, reason, 0)
}

// DeadLetter parks the message at once, recording reason.
func (c *Client) DeadLetter(ctx context.Context, d *Delivery, reason string) error {
	return c.settleOne(ctx, d, 0, true, reason, 0)
}

// Postpone gives the message back, available after delay, without counting
// the attempt (it was not tried).
func (c *Client) Postpone(ctx context.Context, d *Delivery, delay time.Duration) error {
	return c.settleOne(ctx, d, delay, false, "postponed", 1)
}

// PostponeUntil is Postpone to an absolute time: messages postponed to the
// same instant are claimed again in id order.
func (c *Client) PostponeUntil(ctx context.Context, d *Delivery, at time.Time) error {
	return c.settleAt(ctx, d, at, false, "postponed", 1)
}

// RetryAt is Retry with an absolute time.
func (c *Client) RetryAt(ctx context.Context, d *Delivery, at time.Time, reason string) error {
	return c.settleAt(ctx, d, at, d.Attempt >= d.MaxAttempts && d.MaxAttempts > 0, reason, 0)
}

// Release gives the message back for immediate redelivery; started says
// whether handling began (if not, the attempt is not counted).
func (c *Client) Release(ctx context.Context, d *Delivery, started bool) error {
	uncount := int32(1)
	if started {
		uncount = 0
	}
	return c.settleOne(ctx, d, 0, false, "released", uncount)
}

// settleOne settles one delivery: available again delay after now (the
// clock's, or the database's), or from the instant at when it is set.
func (c *Client) settleOne(ctx context.Context, d *Delivery, delay time.Duration, dead bool, reason string, uncount int32) error {
	return c.settle(ctx, d, c.now(), delay, dead, reason, uncount)
}

func (c *Client) settleAt(ctx context.Context, d *Delivery, at time.Time, dead bool, reason string, uncount int32) error {
	return c.settle(ctx, d, &at, 0, dead, reason, uncount)
}

func (c *Client) settle(ctx context.Context, d *Delivery, base *time.Time, delay time.Duration, dead bool, reason string, uncount int32) error {
	var settled int64
	err := c.pool.QueryRow(ctx, c.sql.Settle, []int64{d.ID}, []int32{int32(d.Attempt)}, []int64{delay.Microseconds()},
		[]bool{dead}, []*string{&reason}, []int32{uncount}, base).Scan(&settled)
	if err != nil {
		return fmt.Errorf("outbox: settle: %w", err)
	}
	if settled == 0 {
		return fmt.Errorf("%w: message %d attempt %d", ErrLeaseLost, d.ID, d.Attempt)
	}
	return nil
}

// ExtendLease keeps d leased for another lease from now and updates
// d.LeaseUntil.
func (c *Client) ExtendLease(ctx context.Context, d *Delivery, lease time.Duration) error {
	var until time.Time
	err := c.pool.QueryRow(ctx, c.sql.ExtendLease, d.ID, d.Attempt, c.now(), lease.Microseconds()).Scan(&until)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: message %d attempt %d", ErrLeaseLost, d.ID, d.Attempt)
	}
	if err != nil {
		return fmt.Errorf("outbox: extend lease: %w", err)
	}
	d.LeaseUntil = until
	return nil
}

// ExtendLeases keeps every delivery of ds leased for another lease from
// now, in one statement, and updates their LeaseUntil. It returns the
// deliveries whose lease it could not renew (settled, or expired and
// claimed again since: ErrLeaseLost for each); their LeaseUntil is unchanged.
func (c *Client) ExtendLeases(ctx context.Context, ds []*Delivery, lease time.Duration) (lost []*Delivery, err error) {
	if len(ds) == 0 {
		return nil, nil
	}
	ids, attempts := make([]int64, len(ds)), make([]int32, len(ds))
	for i, d := range ds {
		ids[i], attempts[i] = d.ID, int32(d.Attempt)
	}
	rows, err := c.pool.Query(ctx, c.sql.ExtendLeases, ids, attempts, c.now(), lease.Microseconds())
	if err != nil {
		return nil, fmt.Errorf("outbox: extend leases: %w", err)
	}
	type held struct {
		id      int64
		attempt int32
	}
	renewed := make(map[held]time.Time, len(ds))
	var l held
	var until time.Time
	_, err = pgx.ForEachRow(rows, []any{&l.id, &l.attempt, &until}, func() error {
		renewed[l] = until
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: extend leases: %w", err)
	}
	for _, d := range ds {
		if until, ok := renewed[held{d.ID, int32(d.Attempt)}]; ok {
			d.LeaseUntil = until
		} else {
			lost = append(lost, d)
		}
	}
	return lost, nil
}
