package relay

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/outbox"
)

func TestSubjectTemplates(t *testing.T) {
	d := &outbox.Delivery{Topic: "orders", Group: "customer-7", Headers: map[string]string{"region": "eu", "bad": "a b", "star": "*"}}
	for tmpl, want := range map[string]string{
		"{topic}":                          "orders",
		"out.{topic}.{message_group}":      "out.orders.customer-7",
		"{group}.{header.region}":          "nats.eu",
		"x.{header.missing}":               "x._",
		"lit":                              "lit",
		"{topic}-{header.region}.v1":       "orders-eu.v1",
		"a.{header.bad}":                   "error",
		"a.{header.star}":                  "error",
		"{topic}.{message_group}.{header.": "parse error",
		"a.{what}":                         "parse error",
		"a..b":                             "parse error",
		"a.>":                              "parse error",
		"a b":                              "parse error",
		"":                                 "parse error",
		"a}":                               "parse error",
	} {
		st, err := parseSubject(tmpl)
		if want == "parse error" {
			require.ErrorIs(t, err, ErrInvalidSubject, tmpl)
			continue
		}
		require.NoError(t, err, tmpl)
		got, err := st.render(d, "nats")
		if want == "error" {
			require.True(t, errors.Is(err, ErrInvalidSubject), "%s: %v", tmpl, err)
			continue
		}
		require.NoError(t, err, tmpl)
		require.Equal(t, want, got, tmpl)
	}
	// A message without a message group.
	st, err := parseSubject("e.{message_group}")
	require.NoError(t, err)
	got, err := st.render(&outbox.Delivery{Topic: "t"}, "g")
	require.NoError(t, err)
	require.Equal(t, "e._", got)
}
