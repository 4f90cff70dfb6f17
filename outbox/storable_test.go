package outbox_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/outbox"
)

// What PostgreSQL cannot store is refused with a typed error before any
// statement runs: nothing is written and the caller's transaction stays
// usable.
func TestSendRejectsWhatPostgresCannotStore(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	ctx := context.Background()
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "fanout", Semantics: outbox.PubSub}))
	good := seqMessage("orders", 1)
	with := func(f func(m *outbox.Message)) outbox.Message {
		m := good
		f(&m)
		return m
	}
	cases := []struct {
		name string
		msg  outbox.Message
		want error
	}{
		{"payload with \\u0000", with(func(m *outbox.Message) { m.Payload = []byte(`{"a":"x\u0000y"}`) }), outbox.ErrInvalidPayload},
		{"payload with a lone high surrogate", with(func(m *outbox.Message) { m.Payload = []byte(`["\ud800"]`) }), outbox.ErrInvalidPayload},
		{"payload with a lone low surrogate", with(func(m *outbox.Message) { m.Payload = []byte(`"\udc00x"`) }), outbox.ErrInvalidPayload},
		{"payload with invalid UTF-8", with(func(m *outbox.Message) { m.Payload = []byte("\"\xff\xfe\"") }), outbox.ErrInvalidPayload},
		{"NUL in group", with(func(m *outbox.Message) { m.Group = "a\x00b" }), outbox.ErrInvalidMessage},
		{"invalid UTF-8 in correlation id", with(func(m *outbox.Message) { m.CorrelationID = "\xc3\x28" }), outbox.ErrInvalidMessage},
		{"NUL in idempotency key", with(func(m *outbox.Message) { m.IdempotencyKey = "k\x00" }), outbox.ErrInvalidMessage},
		{"NUL in header value", with(func(m *outbox.Message) { m.Headers = map[string]string{"h": "v\x00"} }), outbox.ErrInvalidMessage},
		{"invalid UTF-8 in header value", with(func(m *outbox.Message) { m.Headers = map[string]string{"h": "\xff"} }), outbox.ErrInvalidMessage},
		{"invalid UTF-8 in header name", with(func(m *outbox.Message) { m.Headers = map[string]string{"\xff": "v"} }), outbox.ErrInvalidMessage},
		{"not-before past year 294276", with(func(m *outbox.Message) { m.NotBefore = time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC) }), outbox.ErrInvalidMessage},
	}
	for _, topic := range []string{"orders", "fanout"} {
		for _, tc := range cases {
			t.Run(topic+"/"+tc.name, func(t *testing.T) {
				tc.msg.Topic = topic
				tx, err := b.db.Pool.Begin(ctx)
				require.NoError(t, err)
				defer tx.Rollback(ctx)
				_, err = b.producer.Send(ctx, tx, tc.msg)
				require.ErrorIs(t, err, tc.want)
				_, err = b.producer.SendBatch(ctx, tx, []outbox.Message{good, tc.msg})
				require.ErrorIs(t, err, tc.want)
				_, err = tx.Exec(ctx, `SELECT 1`)
				require.NoError(t, err, "the caller's transaction is still usable")
				require.NoError(t, tx.Commit(ctx))
			})
		}
	}
	require.Zero(t, b.count(t, "true"), "nothing written")

	// What jsonb can store passes: a surrogate pair, an escaped backslash
	// before a "u", other escapes.
	for _, p := range []string{`"\ud83d\ude00"`, `"\\u0000"`, `{"a":"\u00e9\n\t"}`} {
		_, err := b.producer.Send(ctx, b.db.Pool, outbox.Message{Topic: "orders", Payload: []byte(p)})
		require.NoError(t, err, p)
	}

	err := b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "orders", MaxAttempts: math.MaxInt32 + 1})
	require.ErrorIs(t, err, outbox.ErrInvalidConfig, "MaxAttempts beyond the integer column")
}
