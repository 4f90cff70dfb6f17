package outbox

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/pgoutbox/internal/ident"
	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/internal/tracing"
	"github.com/pgoutbox/pgoutbox/migrations"
)

// Executor is what Send needs from the caller: pgx.Tx, *pgxpool.Pool and
// *pgx.Conn all satisfy it. Pass the transaction the message belongs to;
// with a pool or a bare connection each Send commits on its own.
type Executor interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Defaults of ProducerConfig.
const (
	DefaultNotifyInterval     = time.Millisecond
	DefaultBusyNotifyInterval = 10 * time.Millisecond
)

// ProducerConfig configures a Producer.
type ProducerConfig struct {
	// Schema holds pgoutbox's tables. Defaults to "public".
	Schema string
	// NotifyInterval is the least time between two wake-up notifications
	// for the same topic from this producer, and the pause after which a
	// send notifies: a send notifies when this producer's previous send to
	// the topic is at least NotifyInterval old (its consumers may have gone
	// idle since). NOTIFY serialises committing transactions on a
	// database-wide lock, so notifying on every send halves throughput under
	// concurrency. A message whose send did not notify is picked up by a
	// busy consumer when it claims again (within about a millisecond of a
	// claim that found work), or by an idle one at the next notification or
	// within its poll interval. Zero means DefaultNotifyInterval; negative
	// disables notifications (consumers then rely on polling).
	NotifyInterval time.Duration
	// BusyNotifyInterval is how often, at most, a producer notifies a topic
	// while its sends to it come less than NotifyInterval apart: busy
	// consumers need no wake-up then, and an idle one waits at most this
	// long. Zero means DefaultBusyNotifyInterval; shorter than
	// NotifyInterval means NotifyInterval.
	BusyNotifyInterval time.Duration
	// MaxPayloadBytes is the largest payload Send and SendBatch accept;
	// a larger one is refused with ErrInvalidPayload before any statement
	// runs, the caller's transaction still usable. Defaults to
	// DefaultMaxPayloadBytes (1 MiB); at most MaxStorablePayloadBytes.
	MaxPayloadBytes int
	// Logger defaults to a logger that discards everything.
	Logger *slog.Logger
	// MeterProvider defaults to the no-op provider.
	MeterProvider metric.MeterProvider
	// TracerProvider receives a "send {topic}" span per Send or SendBatch
	// (OpenTelemetry messaging conventions). Whether or not it is set, a
	// send puts the trace context of its span (or of ctx, when nothing
	// records) into each message's headers as W3C traceparent and
	// tracestate, so handlers and router deliveries join the sender's
	// trace. Defaults to recording nothing.
	TracerProvider trace.TracerProvider
	// Clock replaces database time as the base of Message.Delay, and the
	// system clock in the notification intervals. Defaults to nil: the
	// database's now() and the system's clock.
	Clock Clock
	// AllowUnconfiguredTopics lets Send and SendBatch write to a topic that
	// was never configured (Client.ConfigureTopic), as a QUEUE topic with
	// the defaults. Defaults to false: such a send fails with
	// ErrUnknownTopic, so a misspelt topic name is an error at the send
	// instead of messages nobody reads. The admin API, the CLI's topics
	// and the web UI list topics that hold messages without a
	// configuration, flagged as such.
	AllowUnconfiguredTopics bool
}

// Producer writes messages inside the caller's transaction. It holds no
// connection and is safe for concurrent use.
type Producer struct {
	maxPayload int
	anyTopic   bool // AllowUnconfiguredTopics
	sql        *sqlq.Outbox
	channel    string
	notifier   *notifier
	semantics  sync.Map // topic -> learnedSemantics
	metrics    *metrics
	tracer     *tracing.Tracer
	clock      Clock
}

// learnedSemantics is what a producer last read of a topic's semantics,
// ordering and storage. Semantics and ordering never change once
// configured, so a configured topic is read once; a topic without
// configuration is read again after recheckUnconfigured, in case it has
// been configured meanwhile. A QUEUE topic configured by an earlier
// release is not on the log (onLog false) until a consumer of this one
// starts: its sends go to the queue table, whose trigger moves each to
// the log as it is written (see migration 18).
type learnedSemantics struct {
	semantics Semantics // "" while the topic is not configured
	ordered   bool
	onLog     bool // a QUEUE topic whose messages live on the log
	readAt    time.Time
}

// recheckUnconfigured is how long a producer trusts that a topic is not
// configured. Until it reads the configuration, it writes the topic's
// messages with the statement that checks the topic is not PUB_SUB (always
// correct, slightly slower).
const recheckUnconfigured = time.Second

// NewProducer returns a producer for the tables in cfg.Schema.
func NewProducer(cfg ProducerConfig) (*Producer, error) {
	schema, err := ident.Schema(cfg.Schema)
	if err != nil {
		return nil, err
	}
	cfg.MaxPayloadBytes = cmp.Or(cfg.MaxPayloadBytes, DefaultMaxPayloadBytes)
	if cfg.MaxPayloadBytes < 1 || cfg.MaxPayloadBytes > MaxStorablePayloadBytes {
		return nil, fmt.Errorf("%w: producer: MaxPayloadBytes %d is not between 1 and %d", ErrInvalidConfig, cfg.MaxPayloadBytes, MaxStorablePayloadBytes)
	}
	return &Producer{
		maxPayload: cfg.MaxPayloadBytes,
		anyTopic:   cfg.AllowUnconfiguredTopics,
		sql:        sqlq.For(schema),
		channel:    NotifyChannel(schema),
		notifier: newNotifier(cmp.Or(cfg.NotifyInterval, DefaultNotifyInterval),
			cmp.Or(cfg.BusyNotifyInterval, DefaultBusyNotifyInterval), cfg.Clock),
		metrics: newMetrics(cfg.MeterProvider),
		tracer:  tracing.New(cfg.TracerProvider),
		clock:   cfg.Clock,
	}, nil
}

// Send writes msg with tx and returns its id. The message exists only if tx
// commits. With an IdempotencyKey that is already present on the topic it
// writes nothing and returns the existing message's id. A topic that was
// never configured is refused with ErrUnknownTopic (unless
// ProducerConfig.AllowUnconfiguredTopics), and tx stays usable.
func (p *Producer) Send(ctx context.Context, tx Executor, msg Message) (id int64, err error) {
	ctx, span := p.tracer.Send(ctx, msg.Topic, 1)
	defer func() { tracing.Sent(span, id); tracing.End(span, err) }()
	msg.Headers = p.tracer.Inject(ctx, msg.Headers)
	if msg.IdempotencyKey == "" {
		return p.sendOne(ctx, tx, &msg)
	}
	ids, err := p.sendBatch(ctx, tx, []Message{msg})
	if err != nil {
		return 0, err
	}
	return ids[0], nil
}

// sendOne is Send without an idempotency key: one single-row INSERT, the
// cheapest the topic's semantics allow (see the Insert* statements of sqlq).
func (p *Producer) sendOne(ctx context.Context, tx Executor, m *Message) (int64, error) {
	if isNil(tx) {
		return 0, ErrNilExecutor
	}
	headers, err := m.validate(p.maxPayload)
	if err != nil {
		return 0, err
	}
	corrID := m.CorrelationID
	if corrID == "" {
		corrID = newCorrelationID()
	}
	// Pointers to copies, not into *m, so that Send's message stays on the stack.
	var group *string
	if m.Group != "" {
		g := m.Group
		group = &g
	}
	var notBefore *time.Time
	if !m.NotBefore.IsZero() {
		nb := m.NotBefore
		notBefore = &nb
	}
	topic, err := p.topicSemantics(ctx, tx, m.Topic, false)
	if err != nil {
		return 0, err
	}
	// A QUEUE message available at once is written with the six-argument
	// statement; every other statement also takes the delivery time.
	atOnce := topic.semantics == Queue && !topic.ordered && notBefore == nil && m.Delay == 0 && p.clock == nil
	// JSON travels as json.RawMessage, which pgx sends as json in every
	// query exec mode ([]byte would be bytea where pgx assumes types).
	args := sqlq.Args{"topic": m.Topic, "payload": m.Payload, "headers": json.RawMessage(headers),
		"correlation_id": corrID, "message_group": group, "priority": int16(m.Priority)}
	if !atOnce {
		args["not_before"], args["delay_us"], args["now"] = notBefore, m.Delay.Microseconds(), p.now()
	}
	notify := p.notifier.due(m.Topic, p.notifier.now())
	if notify {
		args["channel"] = p.channel
	}
	id, written, err := p.insertOne(ctx, tx, p.insertStatement(topic, atOnce, notify), args)
	if err == nil && !written && topic.semantics == "" {
		// The topic has been configured as PUB_SUB or ordered since the
		// producer last looked; insertUnconfigured wrote nothing.
		if topic, err = p.topicSemantics(ctx, tx, m.Topic, true); err != nil {
			return 0, err
		}
		id, written, err = p.insertOne(ctx, tx, p.insertStatement(topic, false, notify), args)
	}
	if err != nil {
		return 0, err
	}
	if !written { // the PUB_SUB topic's row was deleted by hand
		return 0, fmt.Errorf("outbox: send: topic %q lost its configuration; restart the producer", m.Topic)
	}
	p.metrics.sent.Add(ctx, 1)
	return id, nil
}

// insertStatement picks sendOne's statement for what the producer knows
// of the topic; atOnce selects insertQueued.
func (p *Producer) insertStatement(topic learnedSemantics, atOnce, notify bool) sqlq.Named {
	var query, notifyQuery sqlq.Named
	switch {
	case atOnce && topic.onLog:
		query, notifyQuery = p.sql.InsertLogged, p.sql.InsertLoggedNotify
	case atOnce:
		query, notifyQuery = p.sql.InsertQueued, p.sql.InsertQueuedNotify
	case topic.ordered && topic.semantics == PubSub:
		query, notifyQuery = p.sql.InsertPublishedOrdered, p.sql.InsertPublishedOrderedNotify
	case topic.ordered && topic.onLog:
		query, notifyQuery = p.sql.InsertLoggedOrdered, p.sql.InsertLoggedOrderedNotify
	case topic.ordered:
		query, notifyQuery = p.sql.InsertOrdered, p.sql.InsertOrderedNotify
	case topic.semantics == Queue && topic.onLog:
		query, notifyQuery = p.sql.InsertLoggedAt, p.sql.InsertLoggedAtNotify
	case topic.semantics == Queue:
		query, notifyQuery = p.sql.InsertQueuedAt, p.sql.InsertQueuedAtNotify
	case topic.semantics == PubSub:
		query, notifyQuery = p.sql.InsertPublished, p.sql.InsertPublishedNotify
	default:
		query, notifyQuery = p.sql.InsertUnconfigured, p.sql.InsertUnconfiguredNotify
	}
	if notify {
		return notifyQuery
	}
	return query
}

// insertOne runs a single-row insert statement; written is false when it
// wrote no row.
func (p *Producer) insertOne(ctx context.Context, tx Executor, query sqlq.Named, args sqlq.Args) (id int64, written bool, err error) {
	rows, err := tx.Query(ctx, query.Numbered, query.Bind(args)...)
	if err != nil {
		return 0, false, sendError(err)
	}
	if rows.Next() {
		written = true
		err = rows.Scan(&id)
	}
	rows.Close()
	if err == nil {
		err = rows.Err()
	}
	if err != nil {
		return 0, false, sendError(err)
	}
	return id, written, nil
}

// topicSemantics returns what the producer knows of topic: its semantics
// ("" for a topic that is not configured) and whether it is ordered. It
// reads the configuration with tx the first time, and again every
// recheckUnconfigured while the topic is not configured, or at once when
// fresh is set; a configured topic's semantics and ordering never change,
// so they are not read again (see learnedSemantics). Unless the producer allows unconfigured
// topics, a topic that is not configured fails with ErrUnknownTopic,
// after a fresh read (it may have been configured a moment ago).
func (p *Producer) topicSemantics(ctx context.Context, tx Executor, topic string, fresh bool) (learnedSemantics, error) {
	if v, ok := p.semantics.Load(topic); ok && !fresh {
		l := v.(learnedSemantics)
		if l.semantics != "" || (p.anyTopic && time.Since(l.readAt) < recheckUnconfigured) {
			return l, nil
		}
	}
	rows, err := tx.Query(ctx, p.sql.SelectSemantics.Numbered, p.sql.SelectSemantics.Bind(sqlq.Args{"topic": topic})...)
	if err != nil {
		return learnedSemantics{}, sendError(err)
	}
	l := learnedSemantics{readAt: time.Now()}
	var onLog bool
	_, err = pgx.ForEachRow(rows, []any{&l.semantics, &l.ordered, &onLog}, func() error { return nil })
	l.onLog = onLog && l.semantics == Queue
	if err != nil {
		return learnedSemantics{}, sendError(err)
	}
	p.semantics.Store(topic, l)
	if l.semantics == "" && !p.anyTopic {
		return l, fmt.Errorf("%w: %q was never configured (configure it with ConfigureTopic, or allow unconfigured topics in ProducerConfig)",
			ErrUnknownTopic, topic)
	}
	return l, nil
}

func (p *Producer) now() *time.Time {
	if p.clock == nil {
		return nil
	}
	t := p.clock.Now()
	return &t
}

// SendBatch writes msgs with tx in one statement and returns their ids in
// the same order. Either every message is valid and written, or none is.
func (p *Producer) SendBatch(ctx context.Context, tx Executor, msgs []Message) (ids []int64, err error) {
	if len(msgs) > 0 {
		var span trace.Span
		ctx, span = p.tracer.Send(ctx, msgs[0].Topic, len(msgs))
		defer func() { tracing.End(span, err) }()
		if traced := p.tracer.Inject(ctx, nil); traced != nil {
			msgs = slices.Clone(msgs) // the caller's messages keep their headers
			for i := range msgs {
				msgs[i].Headers = p.tracer.Inject(ctx, msgs[i].Headers)
			}
		}
	}
	return p.sendBatch(ctx, tx, msgs)
}

func (p *Producer) sendBatch(ctx context.Context, tx Executor, msgs []Message) ([]int64, error) {
	if isNil(tx) {
		return nil, ErrNilExecutor
	}
	if len(msgs) == 0 {
		return nil, nil
	}
	n := len(msgs)
	var (
		topics, corrIDs, groups, keys = make([]string, n), make([]string, n), make([]*string, n), make([]*string, n)
		payloads, headers             = make([]json.RawMessage, n), make([]json.RawMessage, n)
		priorities                    = make([]int16, n)
		notBefore                     = make([]*time.Time, n)
		delays                        = make([]int64, n)
	)
	for i := range msgs {
		m := &msgs[i]
		h, err := m.validate(p.maxPayload)
		if err == nil && !p.anyTopic && (i == 0 || m.Topic != msgs[i-1].Topic) {
			_, err = p.topicSemantics(ctx, tx, m.Topic, false)
		}
		if err != nil {
			if n > 1 {
				return nil, fmt.Errorf("message %d: %w", i, err)
			}
			return nil, err
		}
		topics[i], payloads[i], headers[i] = m.Topic, m.Payload, h
		corrIDs[i] = m.CorrelationID
		if corrIDs[i] == "" {
			corrIDs[i] = newCorrelationID()
		}
		if m.Group != "" {
			groups[i] = &m.Group
		}
		if m.IdempotencyKey != "" {
			keys[i] = &m.IdempotencyKey
		}
		priorities[i] = int16(m.Priority)
		if !m.NotBefore.IsZero() {
			notBefore[i] = &m.NotBefore
		}
		delays[i] = m.Delay.Microseconds()
	}

	args := sqlq.Args{"topics": topics, "payloads": payloads, "headers": headers, "correlation_ids": corrIDs,
		"message_groups": groups, "priorities": priorities, "idempotency_keys": keys, "not_befores": notBefore,
		"delays_us": delays, "now": p.now(), "idempotency_window_us": DefaultIdempotencyWindow.Microseconds()}
	query := p.sql.Insert
	if wake := p.notifier.dueTopics(topics); len(wake) > 0 {
		query = p.sql.InsertNotify
		args["channel"], args["notify_topics"] = p.channel, wake
	}
	rows, err := tx.Query(ctx, query.Numbered, query.Bind(args)...)
	if err != nil {
		return nil, sendError(err)
	}
	// Each written row comes back as (position, id); rows skipped for an
	// existing idempotency key are missing and looked up below.
	ids := make([]int64, n)
	var pos, id int64
	_, err = pgx.ForEachRow(rows, []any{&pos, &id}, func() error {
		if pos < 1 || pos > int64(n) {
			return fmt.Errorf("outbox: send: row position %d out of range", pos)
		}
		ids[pos-1] = id
		return nil
	})
	if err != nil {
		return nil, sendError(err)
	}
	var missing []int
	for i := range ids {
		if ids[i] == 0 {
			missing = append(missing, i)
		}
	}
	if len(missing) > 0 {
		if err := p.resolveIdempotent(ctx, tx, msgs, missing, ids); err != nil {
			return nil, err
		}
	}
	p.metrics.sent.Add(ctx, int64(n))
	return ids, nil
}

// resolveIdempotent fills ids[i] for messages skipped because their
// idempotency key already existed (earlier, or earlier in the same batch).
func (p *Producer) resolveIdempotent(ctx context.Context, tx Executor, msgs []Message, missing []int, ids []int64) error {
	byTopic := map[string][]string{}
	for _, i := range missing {
		if msgs[i].IdempotencyKey == "" {
			return fmt.Errorf("outbox: send: message %d was not written", i)
		}
		byTopic[msgs[i].Topic] = append(byTopic[msgs[i].Topic], msgs[i].IdempotencyKey)
	}
	found := map[[2]string]int64{}
	for topic, keys := range byTopic {
		rows, err := tx.Query(ctx, p.sql.SelectIdempotent.Numbered, p.sql.SelectIdempotent.Bind(sqlq.Args{"topic": topic, "keys": keys})...)
		if err != nil {
			return fmt.Errorf("outbox: send: idempotency lookup: %w", err)
		}
		var key string
		var id int64
		_, err = pgx.ForEachRow(rows, []any{&key, &id}, func() error {
			found[[2]string{topic, key}] = id
			return nil
		})
		if err != nil {
			return fmt.Errorf("outbox: send: idempotency lookup: %w", err)
		}
	}
	for _, i := range missing {
		id, ok := found[[2]string{msgs[i].Topic, msgs[i].IdempotencyKey}]
		if !ok {
			return fmt.Errorf("outbox: send: idempotency key %q of topic %q: conflicting message vanished; retry the transaction",
				msgs[i].IdempotencyKey, msgs[i].Topic)
		}
		ids[i] = id
	}
	return nil
}

// isNil reports whether e is nil or a typed nil pointer (a nil *pgxpool.Pool
// stored in the interface).
func isNil(e Executor) bool {
	if e == nil {
		return true
	}
	v := reflect.ValueOf(e)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// NotifyChannel is the LISTEN/NOTIFY channel of the tables in schema; the
// notification payload is the topic name. Channel names are limited to 63
// bytes, so a long schema name is cut (two schemas sharing a 54-byte prefix
// then only wake each other's consumers needlessly).
func NotifyChannel(schema string) string {
	const prefix, max = "pgoutbox.", 63
	if len(prefix)+len(schema) > max {
		schema = schema[:max-len(prefix)]
	}
	return prefix + schema
}

// sendError maps a write refused for lack of subscriptions (see
// sqlq.NoSubscriptionsMarker: the statement fails as a whole) to
// ErrNoSubscriptions, and wraps everything else.
func sendError(err error) error {
	var pgErr *pgconn.PgError
	const marker = "pgoutbox: no subscriptions on topic "
	if errors.As(err, &pgErr) && pgErr.Code == "22P02" && strings.Contains(pgErr.Message, marker) {
		topic := pgErr.Message[strings.Index(pgErr.Message, marker)+len(marker):]
		return fmt.Errorf("%w: topic %s", ErrNoSubscriptions, strings.TrimRight(topic, `"`))
	}
	if errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "3F000") { // undefined table or schema
		return fmt.Errorf("outbox: send: %w: %w", migrations.ErrNotMigrated, err)
	}
	return fmt.Errorf("outbox: send: %w", err)
}
