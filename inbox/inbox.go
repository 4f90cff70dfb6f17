// Package inbox makes a handler's effects happen once per message, when
// the same message may reach it more than once: a redelivery after a lease
// ran out, the replay of a dead letter, or the same message through two
// consumer groups (or two paths) that share an inbox.
//
// An Inbox records the key of each message it handled (the message id, or
// a key the caller chooses) in a table of ours, in the handler's own
// transaction, before the handler's work: a message whose key is recorded
// already is skipped, and its handler never runs. The insert is the guard
// and always runs; a second delivery of a key in flight waits on it until
// the first one's transaction ends, then skips (or, if the first rolled
// back, runs).
//
// Before opening a transaction, the inbox may ask the table whether the
// key is recorded, so a duplicate costs one read instead of a
// transaction. A Bloom filter of the keys this process recorded (and,
// after a restart, the latest keys of the table) spares that read for the
// keys it has surely never seen, which is nearly every key: a filter is
// local to one process, so a key another process recorded is only caught
// by the insert, which is still correct.
//
// Keys are kept for Config.Retention; the maintenance service deletes
// them after that. A message delivered again after its key expired takes
// effect again.
//
// What is exactly once: writes the handler makes in the transaction it is
// given (the inbox row commits with them, or neither does). Effects
// outside it (an HTTP call, another database) may still repeat when a
// handler fails after them and before the commit.
package inbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/bits-and-blooms/bloom/v3"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/cfgcheck"
	"github.com/pgoutbox/pgoutbox/internal/ident"
	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// Defaults of Config.
const (
	// DefaultRetention is how long a key is kept: a redelivery later than
	// this takes effect again. It should outlast the longest time a
	// message can be redelivered after it was handled (a topic's leases
	// and retries, and how long dead letters wait for a replay): this one
	// outlasts the maintenance service's DefaultDeadLetterRetention (14
	// days).
	DefaultRetention = 15 * 24 * time.Hour
	// DefaultFilterCapacity is how many keys a filter generation holds at
	// DefaultFalsePositiveRate (about 1.2 MB each); two generations are
	// kept, the newest and the one before.
	DefaultFilterCapacity = 1_000_000
	// DefaultFalsePositiveRate is the share of new keys the filter takes
	// for recorded ones (each costs one read).
	DefaultFalsePositiveRate = 0.01
)

// MaxKeyBytes is the longest key an inbox records, and MaxNameBytes the
// longest inbox name.
const (
	MaxKeyBytes  = 512
	MaxNameBytes = 200
)

// ErrInvalidKey: Config.Key returned an empty key, one longer than
// MaxKeyBytes, or one PostgreSQL cannot store as text (invalid UTF-8, a
// NUL byte). The message is not handled.
var ErrInvalidKey = errors.New("inbox: invalid key")

// Handler does a message's work in tx, the inbox's transaction, which
// commits when it returns nil. It may ack the message there too
// (pgoutbox.Consumer.AckTx, consumergroup.Group.AckTx).
type Handler func(ctx context.Context, tx pgx.Tx, d *outbox.Delivery) error

// Config configures an Inbox.
type Config struct {
	// Name is the inbox: deliveries whose keys are equal take effect once
	// per inbox. Give two consumer groups the same Name (and Key) to have
	// a message handled by one of them only.
	Name string
	// Schema is where pgoutbox's tables are (default "public").
	Schema string
	// Key is a message's key (default: its id, as a decimal string).
	Key func(*outbox.Delivery) string
	// Retention is how long a key is kept (DefaultRetention).
	Retention time.Duration
	// FilterCapacity and FalsePositiveRate size the Bloom filter
	// (DefaultFilterCapacity, DefaultFalsePositiveRate).
	FilterCapacity    uint
	FalsePositiveRate float64
	// NoFilter: ask the table before every message (no Bloom filter).
	NoFilter bool
	// Clock replaces database time when keys are recorded (tests).
	Clock outbox.Clock
	// Logger receives the inbox's logs (default slog.Default()).
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	c.Schema = cmp.Or(c.Schema, "public")
	c.Retention = cmp.Or(c.Retention, DefaultRetention)
	c.FilterCapacity = cmp.Or(c.FilterCapacity, DefaultFilterCapacity)
	c.FalsePositiveRate = cmp.Or(c.FalsePositiveRate, DefaultFalsePositiveRate)
	if c.Key == nil {
		c.Key = func(d *outbox.Delivery) string { return strconv.FormatInt(d.ID, 10) }
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Config) validate() error {
	check := cfgcheck.New("inbox")
	if c.Name == "" || len(c.Name) > MaxNameBytes || !storable(c.Name) {
		check.Failf("Name", "%q is empty, longer than %d bytes, or not storable text", c.Name, MaxNameBytes)
	}
	check.Positive("Retention", c.Retention)
	if c.FalsePositiveRate <= 0 || c.FalsePositiveRate >= 1 {
		check.Failf("FalsePositiveRate", "is %v, not in (0, 1)", c.FalsePositiveRate)
	}
	return check.Err()
}

// Inbox drops the deliveries of messages it already handled. It is safe
// for concurrent use.
type Inbox struct {
	cfg    Config
	pool   *pgxpool.Pool
	q      *sqlq.Inbox
	filter *filter // nil: NoFilter

	handled, duplicates, lookups atomic.Int64
}

// New returns an inbox on pool, its filter loaded with the keys recorded
// last (up to FilterCapacity).
func New(ctx context.Context, pool *pgxpool.Pool, cfg Config) (*Inbox, error) {
	cfg = cfg.withDefaults()
	if pool == nil {
		return nil, fmt.Errorf("%w: nil pool", outbox.ErrInvalidConfig)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	schema, err := ident.Schema(cfg.Schema)
	if err != nil {
		return nil, err
	}
	in := &Inbox{cfg: cfg, pool: pool, q: sqlq.ForInbox(schema)}
	if cfg.NoFilter {
		return in, nil
	}
	in.filter = newFilter(cfg.FilterCapacity, cfg.FalsePositiveRate)
	rows, err := pool.Query(ctx, in.q.Recent,
		pgx.StrictNamedArgs{"inbox": cfg.Name, "limit": int64(cfg.FilterCapacity), "now": in.now()})
	if err != nil {
		return nil, fmt.Errorf("inbox: load recent keys: %w", err)
	}
	var key string
	n, err := pgx.ForEachRow(rows, []any{&key}, func() error { in.filter.add(key); return nil })
	if err != nil {
		return nil, fmt.Errorf("inbox: load recent keys: %w", err)
	}
	cfg.Logger.Debug("pgoutbox: inbox loaded its recent keys", slog.String("inbox", cfg.Name), slog.Int64("keys", n.RowsAffected()))
	return in, nil
}

// Handle runs h for d in a transaction that records d's key, unless the
// key is recorded already: then h does not run and Handle returns
// (false, nil), as it does when another delivery of the key committed
// while this one waited. It returns (true, nil) when h ran and committed,
// and h's error (the transaction rolled back, nothing recorded) when it
// failed.
func (in *Inbox) Handle(ctx context.Context, d *outbox.Delivery, h Handler) (bool, error) {
	key := in.cfg.Key(d)
	if key == "" || len(key) > MaxKeyBytes || !storable(key) {
		return false, fmt.Errorf("%w: message %d: key %q", ErrInvalidKey, d.ID, key)
	}
	if in.filter == nil || in.filter.mayContain(key) {
		in.lookups.Add(1)
		var seen bool
		if err := in.pool.QueryRow(ctx, in.q.Seen, pgx.StrictNamedArgs{"inbox": in.cfg.Name, "key": key}).Scan(&seen); err != nil {
			return false, fmt.Errorf("inbox: look up key: %w", err)
		}
		if seen {
			in.duplicates.Add(1)
			return false, nil
		}
	}
	var dup bool
	err := pgx.BeginFunc(ctx, in.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, in.q.Record, pgx.StrictNamedArgs{
			"inbox": in.cfg.Name, "key": key, "now": in.now(), "retention_us": in.cfg.Retention.Microseconds(),
		})
		if err != nil {
			return fmt.Errorf("inbox: record key: %w", err)
		}
		if dup = tag.RowsAffected() == 0; dup {
			return nil
		}
		return h(ctx, tx, d)
	})
	if err != nil {
		return false, err
	}
	if in.filter != nil {
		in.filter.add(key)
	}
	if dup {
		in.duplicates.Add(1)
		return false, nil
	}
	in.handled.Add(1)
	return true, nil
}

// Wrap returns a handler for a consumer or consumer group that handles
// each delivery through the inbox: a duplicate is acked without running h.
func (in *Inbox) Wrap(h Handler) outbox.Handler {
	return func(ctx context.Context, d *outbox.Delivery) error {
		_, err := in.Handle(ctx, d, h)
		return err
	}
}

// Stats are an inbox's counts since New.
type Stats struct {
	// Handled: deliveries whose handler ran and committed.
	Handled int64
	// Duplicates: deliveries skipped, their key recorded already.
	Duplicates int64
	// Lookups: reads of the table before a transaction (every delivery
	// without the filter; with it, those the filter may have seen).
	Lookups int64
	// FilterBytes: the filter's memory (0 without one).
	FilterBytes int
}

// Stats returns the inbox's counts.
func (in *Inbox) Stats() Stats {
	s := Stats{Handled: in.handled.Load(), Duplicates: in.duplicates.Load(), Lookups: in.lookups.Load()}
	if in.filter != nil {
		s.FilterBytes = in.filter.bytes()
	}
	return s
}

// storable reports whether PostgreSQL can store s as text.
func storable(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }

func (in *Inbox) now() *time.Time {
	if in.cfg.Clock == nil {
		return nil
	}
	t := in.cfg.Clock.Now()
	return &t
}

// filter is a Bloom filter of recorded keys in two generations: when the
// newest holds its capacity, it becomes the older one and a fresh one
// starts, so the false-positive rate stays near its target however many
// keys go by, and the keys of the last capacity..2×capacity additions are
// remembered.
type filter struct {
	mu            sync.Mutex
	cur, prev     *bloom.BloomFilter
	added, perGen uint
}

func newFilter(capacity uint, fp float64) *filter {
	return &filter{cur: bloom.NewWithEstimates(capacity, fp), prev: bloom.NewWithEstimates(capacity, fp), perGen: capacity}
}

func (f *filter) add(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.added >= f.perGen {
		f.prev, f.cur = f.cur, f.prev
		f.cur.ClearAll()
		f.added = 0
	}
	f.cur.AddString(key)
	f.added++
}

func (f *filter) mayContain(key string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cur.TestString(key) || f.prev.TestString(key)
}

// bytes is the memory of the two generations' bit sets.
func (f *filter) bytes() int {
	return int(f.cur.Cap()+f.prev.Cap()) / 8
}
