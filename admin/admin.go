// Package admin lets an operator see and steer topics and consumer groups
// by name, from any process: list topics with their backlog, list groups
// with their health and lag, list the message groups an ordered topic or
// group is held back on, pause, resume, cancel or remove a group, and
// list, replay or purge dead letters. It changes nothing a running
// consumer must be told about: every instance of a group follows its state
// within its poll interval.
//
// Counts stop at a limit (Options.CountLimit) so that a page or a metrics
// scrape costs a bounded number of index reads however large the backlog:
// a count equal to the limit means "at least that many". Every method
// fails with an error wrapping outbox.ErrNotFound for a topic or group
// that does not exist.
package admin

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/ident"
	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// DefaultCountLimit is where counts stop by default.
const DefaultCountLimit = consumergroup.DefaultHealthCountLimit

// Options configures an Admin.
type Options struct {
	// CountLimit is where counts stop. Defaults to DefaultCountLimit.
	CountLimit int
}

// Admin inspects and steers the topics and groups of one schema. It holds
// no goroutines and is safe for concurrent use.
type Admin struct {
	client *outbox.Client
	pool   *pgxpool.Pool
	maint  *consumergroup.Maintainer
	q      *sqlq.Admin
	rq     *sqlq.Router // what routers share (see Routers)
	limit  int
}

// New returns an Admin working through client (its pool and schema).
func New(client *outbox.Client, opts Options) (*Admin, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: admin: nil client", outbox.ErrInvalidConfig)
	}
	if opts.CountLimit < 0 {
		return nil, fmt.Errorf("%w: admin: CountLimit %d is negative", outbox.ErrInvalidConfig, opts.CountLimit)
	}
	schema, err := ident.Schema(client.Schema())
	if err != nil {
		return nil, err
	}
	maint, err := consumergroup.NewMaintainer(client.Pool(), client)
	if err != nil {
		return nil, err
	}
	return &Admin{client: client, pool: client.Pool(), maint: maint, q: sqlq.ForAdmin(schema), rq: sqlq.ForRouter(schema),
		limit: cmp.Or(opts.CountLimit, DefaultCountLimit)}, nil
}

// CountLimit is where the Admin's counts stop: a count equal to it means
// "at least that many".
func (a *Admin) CountLimit() int { return a.limit }

// FormatCount prints a count the Admin read: "10000+" at CountLimit.
func (a *Admin) FormatCount(n int64) string {
	if n >= int64(a.limit) {
		return strconv.FormatInt(n, 10) + "+"
	}
	return strconv.FormatInt(n, 10)
}

// Topic is a topic's configuration and backlog.
type Topic struct {
	outbox.TopicConfig
	// Groups names the groups subscribed to a PUB_SUB topic, cancelled
	// ones last (see Admin.Groups for their health).
	Groups []string
	// Ready counts a QUEUE topic's messages deliverable now (on an
	// ordered topic, those of a blocked message group too: see
	// Admin.BlockedGroups), Scheduled those due later (a delay or a
	// retry's backoff) and Leased those a consumer holds. Scheduled and
	// Leased are told apart among the CountLimit due soonest: past that
	// they add up to CountLimit.
	Ready, Scheduled, Leased int64
	// On a QUEUE topic whose messages live on the log, Ready also counts
	// the messages of the batches its consumers hold (Leased counts the
	// messages leased one by one: retries, and an ordered topic's), and
	// Scheduled the messages that wait for a retry.
	//
	// OldestReady is how long the oldest deliverable message of a QUEUE
	// topic has been waiting (0 when none is).
	OldestReady time.Duration
	// DeadLetters counts a QUEUE topic's dead letters (a group's are in
	// its health).
	DeadLetters int64
}

// Topics lists the configured topics, and the topics that hold messages
// without a configuration (Configured false), by name.
func (a *Admin) Topics(ctx context.Context) ([]Topic, error) {
	names, err := a.topicNames(ctx)
	if err != nil {
		return nil, err
	}
	topics := make([]Topic, 0, len(names))
	for _, name := range names {
		t, err := a.Topic(ctx, name)
		if err != nil {
			return nil, err
		}
		topics = append(topics, t)
	}
	return topics, nil
}

// Topic reads one topic: a configured one, or one that holds messages
// without a configuration (Configured false: a QUEUE topic with the
// defaults).
func (a *Admin) Topic(ctx context.Context, name string) (Topic, error) {
	cfg, err := a.topicConfig(ctx, name)
	if err != nil {
		return Topic{}, err
	}
	t := Topic{TopicConfig: cfg}
	if cfg.Semantics == outbox.PubSub {
		t.Groups, err = a.groupNames(ctx, name)
		return t, err
	}
	g, err := a.queueGroup(cfg)
	if err != nil {
		return Topic{}, err
	}
	h, err := g.Health(ctx, a.limit) // its consumers' group says it
	if errors.Is(err, outbox.ErrNotFound) {
		return t, nil // no consumer and no message yet
	}
	if err != nil {
		return Topic{}, fmt.Errorf("admin: topic %q: %w", name, err)
	}
	t.Ready, t.Scheduled, t.Leased = h.Unread+h.Queued, h.Scheduled+h.Waiting, h.LeasedRetries
	t.DeadLetters, t.OldestReady = h.DeadLetters, h.Lag
	return t, nil
}

// topicNames lists the configured topics' names, in order.
func (a *Admin) topicNames(ctx context.Context) ([]string, error) {
	rows, err := a.pool.Query(ctx, a.q.TopicNames)
	if err != nil {
		return nil, fmt.Errorf("admin: list topics: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("admin: list topics: %w", err)
	}
	return names, nil
}

// topicConfig loads a configured topic, or the defaults of a topic that
// holds messages without a configuration (Configured false), or fails
// with ErrNotFound.
func (a *Admin) topicConfig(ctx context.Context, name string) (outbox.TopicConfig, error) {
	cfg, err := a.client.Topic(ctx, name)
	if err != nil || cfg.Configured {
		return cfg, err
	}
	var stored bool
	if err := a.pool.QueryRow(ctx, a.q.TopicStored, pgx.StrictNamedArgs{"topic": name}).Scan(&stored); err != nil {
		return cfg, fmt.Errorf("admin: topic %q: %w", name, err)
	}
	if !stored {
		return cfg, fmt.Errorf("%w: topic %q", outbox.ErrNotFound, name)
	}
	return cfg, nil
}

func (a *Admin) groupNames(ctx context.Context, topic string) ([]string, error) {
	rows, err := a.pool.Query(ctx, a.q.TopicGroups, pgx.StrictNamedArgs{"topic": topic})
	if err != nil {
		return nil, fmt.Errorf("admin: groups of %q: %w", topic, err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("admin: groups of %q: %w", topic, err)
	}
	return names, nil
}

// Groups reads the health of every group subscribed to a PUB_SUB topic,
// by name, cancelled ones last.
func (a *Admin) Groups(ctx context.Context, topic string) ([]consumergroup.Health, error) {
	t, err := a.Topic(ctx, topic)
	if err != nil {
		return nil, err
	}
	if t.Semantics != outbox.PubSub {
		return nil, fmt.Errorf("%w: %q is a %s topic; it has no groups", outbox.ErrWrongSemantics, topic, t.Semantics)
	}
	return a.healths(ctx, t)
}

// healths reads the health of each of t's groups.
func (a *Admin) healths(ctx context.Context, t Topic) ([]consumergroup.Health, error) {
	out := make([]consumergroup.Health, 0, len(t.Groups))
	for _, name := range t.Groups {
		h, err := a.Group(ctx, t.Name, name)
		if err != nil {
			return nil, err
		}
		out = append(out, h)
	}
	return out, nil
}

// Group reads one group's health.
func (a *Admin) Group(ctx context.Context, topic, group string) (consumergroup.Health, error) {
	g, err := a.groupValue(ctx, topic, group)
	if err != nil {
		return consumergroup.Health{}, err
	}
	return g.Health(ctx, a.limit) // ErrNotFound for a group that has no subscription
}

// NearTimeout lists the ACTIVE groups, of every PUB_SUB topic, whose last
// heartbeat is older than 80% of their heartbeat timeout: they are DEAD
// soon unless an instance comes back (see consumergroup.Health.NearTimeout).
func (a *Admin) NearTimeout(ctx context.Context) ([]consumergroup.Health, error) {
	topics, err := a.Topics(ctx)
	if err != nil {
		return nil, err
	}
	var out []consumergroup.Health
	for _, t := range topics {
		hs, err := a.healths(ctx, t)
		if err != nil {
			return nil, err
		}
		for _, h := range hs {
			if h.NearTimeout() {
				out = append(out, h)
			}
		}
	}
	return out, nil
}

// PauseGroup stops delivery to a group until ResumeGroup (see
// consumergroup.Group.Pause). A group already PAUSED stays so, and that
// is a success: what the operator asked for holds.
func (a *Admin) PauseGroup(ctx context.Context, topic, group string) error {
	return a.withGroup(ctx, topic, group, alreadyOK((*consumergroup.Group).Pause, consumergroup.Paused))
}

// ResumeGroup continues a paused group, or brings a DEAD one back with a
// backfill of what it missed (see consumergroup.Group.Resume). A group
// already ACTIVE stays so, and that is a success.
func (a *Admin) ResumeGroup(ctx context.Context, topic, group string) error {
	return a.withGroup(ctx, topic, group, alreadyOK((*consumergroup.Group).Resume, consumergroup.Active))
}

// alreadyOK is change, except that a group found in state want already
// (change refused the transition to the state it is in) is a success.
func alreadyOK(change func(*consumergroup.Group, context.Context) error, want consumergroup.State) func(*consumergroup.Group, context.Context) error {
	return func(g *consumergroup.Group, ctx context.Context) error {
		err := change(g, ctx)
		if !errors.Is(err, consumergroup.ErrInvalidTransition) {
			return err
		}
		if state, serr := g.State(ctx); serr == nil && state == want {
			return nil
		}
		return err
	}
}

// ResurrectGroup brings a DEAD group back, with a backfill of what it had
// not completed or, without, from now: what it owed then waits for it no
// more (see consumergroup.Group.Resurrect). It fails with
// consumergroup.ErrInvalidTransition unless the group is DEAD.
func (a *Admin) ResurrectGroup(ctx context.Context, topic, group string, backfill bool) error {
	return a.withGroup(ctx, topic, group, func(g *consumergroup.Group, ctx context.Context) error {
		return g.Resurrect(ctx, backfill)
	})
}

// ForceComplete gives up a group's messages written more than olderThan
// ago that it has not completed, so that they no longer hold cleanup back,
// and returns how many it gave up (see consumergroup.Group.ForceComplete).
func (a *Admin) ForceComplete(ctx context.Context, topic, group string, olderThan time.Duration) (int64, error) {
	g, err := a.group(ctx, topic, group)
	if err != nil {
		return 0, err
	}
	return g.ForceComplete(ctx, olderThan)
}

// ChangeMode changes a PUB_SUB topic's tracking mode with its groups and
// producers running (see outbox.Client.ChangeTrackingMode).
func (a *Admin) ChangeMode(ctx context.Context, topic string, mode outbox.TrackingMode) error {
	return a.client.ChangeTrackingMode(ctx, topic, mode)
}

// Inconsistencies reports, per topic and kind, stored messages whose
// completion record does not add up, counting at most CountLimit of each
// (see consumergroup.Maintainer.Inconsistencies). It reads the whole
// table.
func (a *Admin) Inconsistencies(ctx context.Context) ([]consumergroup.Inconsistency, error) {
	return a.maint.Inconsistencies(ctx, a.limit)
}

// CancelGroup ends a group's subscription for good; its name stays taken
// until RemoveGroup (see consumergroup.Group.Cancel).
func (a *Admin) CancelGroup(ctx context.Context, topic, group string) error {
	return a.withGroup(ctx, topic, group, (*consumergroup.Group).Cancel)
}

// RemoveGroup cancels a group and deletes its subscription, so its name is
// free (the maintenance service's removal path, see
// consumergroup.Maintainer.RemoveGroup). The topic's other groups and its
// producers are not disturbed.
func (a *Admin) RemoveGroup(ctx context.Context, topic, group string) error {
	if _, err := a.group(ctx, topic, group); err != nil {
		return err
	}
	return a.maint.RemoveGroup(ctx, topic, group)
}

// DeadLetters lists dead letters after afterID (0: from the start), at
// most limit: a QUEUE topic's when group is "", else a group's.
func (a *Admin) DeadLetters(ctx context.Context, topic, group string, afterID int64, limit int) ([]outbox.DeadLetter, error) {
	if afterID < 0 {
		return nil, fmt.Errorf("%w: admin: after id %d is negative", outbox.ErrInvalidConfig, afterID)
	}
	if group == "" {
		g, err := a.queueGroupOf(ctx, topic, deadLettersHint)
		if err != nil || g == nil {
			return nil, err
		}
		return g.DeadLetters(ctx, afterID, limit)
	}
	g, err := a.group(ctx, topic, group)
	if err != nil {
		return nil, err
	}
	return g.DeadLetters(ctx, afterID, limit)
}

// ReplayDeadLetters delivers dead letters again with a fresh attempt
// budget: a QUEUE topic's when group is "", else a group's; all of them
// when no ids are given. It returns how many it replayed; ids that are
// not dead letters there make an error wrapping outbox.ErrNotFound (the
// others are still replayed).
func (a *Admin) ReplayDeadLetters(ctx context.Context, topic, group string, ids ...int64) (int64, error) {
	g, err := a.deadLettersOf(ctx, topic, group, ids)
	if err != nil || g == nil {
		return 0, err
	}
	return g.ReplayDeadLetters(ctx, ids...)
}

// DiscardDeadLetters deletes dead letters for good, as ReplayDeadLetters
// picks them (the CLI's and the web UI's purge).
func (a *Admin) DiscardDeadLetters(ctx context.Context, topic, group string, ids ...int64) (int64, error) {
	g, err := a.deadLettersOf(ctx, topic, group, ids)
	if err != nil || g == nil {
		return 0, err
	}
	return g.DiscardDeadLetters(ctx, ids...)
}

// deadLettersOf is the group whose dead letters ids are: a QUEUE topic's
// when group is "", else group. A QUEUE topic that has no group yet has
// no dead letters: nil, and an error wrapping outbox.ErrNotFound when ids
// were named.
func (a *Admin) deadLettersOf(ctx context.Context, topic, group string, ids []int64) (*consumergroup.Group, error) {
	if group != "" {
		return a.group(ctx, topic, group)
	}
	g, err := a.queueGroupOf(ctx, topic, deadLettersHint)
	if err == nil && g == nil {
		err = noneOf(topic, ids)
	}
	return g, err
}

// queueTopic loads a QUEUE topic, or fails with ErrNotFound or, for
// another kind, ErrWrongSemantics saying hint.
func (a *Admin) queueTopic(ctx context.Context, topic, hint string) (outbox.TopicConfig, error) {
	cfg, err := a.topicConfig(ctx, topic)
	if err == nil && cfg.Semantics != outbox.Queue {
		err = fmt.Errorf("%w: %q is a %s topic; %s", outbox.ErrWrongSemantics, topic, cfg.Semantics, hint)
	}
	return cfg, err
}

// queueGroup returns a Group value (never started) for the one group of
// QUEUE topic cfg, whose members are the topic's consumers.
func (a *Admin) queueGroup(cfg outbox.TopicConfig) (*consumergroup.Group, error) {
	return consumergroup.New(a.pool, consumergroup.Config{Topic: cfg.Name, Group: sqlq.QueueGroup, Client: a.client})
}

// queueGroupOf returns a Group value (never started) for the one group
// of QUEUE topic, or nil when the topic has none (it holds messages but
// was never configured: it has no dead letters and no blocked message
// groups either).
func (a *Admin) queueGroupOf(ctx context.Context, topic, hint string) (*consumergroup.Group, error) {
	cfg, err := a.queueTopic(ctx, topic, hint)
	if err != nil || !cfg.Configured {
		return nil, err
	}
	return a.queueGroup(cfg)
}

// noneOf is what a replay or discard of ids finds on a QUEUE topic
// without a group: nothing, so any id is not found.
func noneOf(topic string, ids []int64) error {
	if len(ids) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %d ids are not dead letters of topic %q", outbox.ErrNotFound, len(ids), topic)
}

// deadLettersHint is queueTopic's hint for dead letters.
const deadLettersHint = "name the group whose dead letters you mean"

// group returns a Group value (never started) for a group subscribed to
// a PUB_SUB topic, or an error wrapping ErrNotFound.
func (a *Admin) group(ctx context.Context, topic, group string) (*consumergroup.Group, error) {
	g, err := a.groupValue(ctx, topic, group)
	if err != nil {
		return nil, err
	}
	if _, err := g.State(ctx); err != nil {
		return nil, err
	}
	return g, nil
}

// groupValue is group without the check that the group is subscribed.
func (a *Admin) groupValue(ctx context.Context, topic, group string) (*consumergroup.Group, error) {
	if err := consumergroup.ValidateGroup(group); err != nil {
		return nil, err
	}
	cfg, err := a.topicConfig(ctx, topic)
	if err != nil {
		return nil, err
	}
	if cfg.Semantics != outbox.PubSub {
		return nil, fmt.Errorf("%w: %q is a %s topic; it has no groups", outbox.ErrWrongSemantics, topic, cfg.Semantics)
	}
	return consumergroup.New(a.pool, consumergroup.Config{Topic: topic, Group: group, Client: a.client})
}

func (a *Admin) withGroup(ctx context.Context, topic, group string, f func(*consumergroup.Group, context.Context) error) error {
	g, err := a.group(ctx, topic, group)
	if err != nil {
		return err
	}
	return f(g, ctx)
}

// DeadLetterView is a dead letter as the operator's tools (the CLI, the
// web UI and its JSON API) show it: its payload and headers only when
// asked for, since they may hold personal data.
type DeadLetterView struct {
	ID             int64             `json:"id"`
	MessageGroup   string            `json:"message_group,omitempty"`
	Attempts       int               `json:"attempts"`
	CreatedAt      time.Time         `json:"created_at"`
	DeadLetteredAt time.Time         `json:"dead_lettered_at"`
	LastError      string            `json:"last_error"`
	Payload        json.RawMessage   `json:"payload,omitempty"`
	Headers        map[string]string `json:"headers,omitempty"`
}

// View returns d as shown, with its payload and headers when payload is
// set.
func View(d outbox.DeadLetter, payload bool) DeadLetterView {
	v := DeadLetterView{ID: d.ID, MessageGroup: d.Group, Attempts: d.Attempt, CreatedAt: d.CreatedAt,
		DeadLetteredAt: d.DeadLetteredAt, LastError: d.LastError}
	if payload {
		v.Payload, v.Headers = d.Payload, d.Headers
	}
	return v
}

// Stuck is what has waited longer than a bound: QUEUE topics whose oldest
// deliverable message has waited longer, and groups (of every state)
// whose oldest unfinished message is older.
type Stuck struct {
	Topics []Topic                `json:"topics"`
	Groups []consumergroup.Health `json:"groups"`
}

// Stuck lists the QUEUE topics and groups whose oldest waiting message is
// older than olderThan, the seed's "stuck messages" alert as a read: what
// to look at first when messages do not move.
func (a *Admin) Stuck(ctx context.Context, olderThan time.Duration) (Stuck, error) {
	s := Stuck{Topics: []Topic{}, Groups: []consumergroup.Health{}}
	if olderThan < 0 {
		return s, fmt.Errorf("%w: admin: stuck: bound %s is negative", outbox.ErrInvalidConfig, olderThan)
	}
	topics, err := a.Topics(ctx)
	if err != nil {
		return s, err
	}
	for _, t := range topics {
		if t.Semantics == outbox.Queue {
			if t.OldestReady > olderThan {
				s.Topics = append(s.Topics, t)
			}
			continue
		}
		hs, err := a.healths(ctx, t)
		if err != nil {
			return s, err
		}
		for _, h := range hs {
			if h.Lag > olderThan {
				s.Groups = append(s.Groups, h)
			}
		}
	}
	return s, nil
}
