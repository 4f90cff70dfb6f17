package relay

import (
	"errors"
	"fmt"
	"strings"
	"unicode"

	"github.com/pgoutbox/pgoutbox/outbox"
)

// ErrInvalidSubject reports a subject template that cannot be parsed, or
// a message whose rendered subject is not a valid subject to publish to
// (the message is dead-lettered with it).
var ErrInvalidSubject = errors.New("relay: invalid subject")

// DefaultSubject publishes each message to its topic's name.
const DefaultSubject = "{topic}"

// emptyValue stands for a placeholder whose value is empty: a message
// without a message group, a header the message does not have.
const emptyValue = "_"

// subjectTemplate is a parsed Config.Subject: literal text and
// placeholders, in order.
type subjectTemplate struct {
	parts []subjectPart
}

type subjectPart struct {
	literal string
	value   func(d *outbox.Delivery, consumerGroup string) string // nil for a literal
}

// parseSubject parses a subject template. Placeholders are {topic},
// {group} (the relay's consumer group), {message_group} and
// {header.NAME}; everything else is literal.
func parseSubject(tmpl string) (subjectTemplate, error) {
	var t subjectTemplate
	rest := tmpl
	for rest != "" {
		open := strings.IndexByte(rest, '{')
		if open < 0 {
			t.parts = append(t.parts, subjectPart{literal: rest})
			break
		}
		if open > 0 {
			t.parts = append(t.parts, subjectPart{literal: rest[:open]})
		}
		end := strings.IndexByte(rest[open:], '}')
		if end < 0 {
			return t, fmt.Errorf("%w: %q: unclosed {", ErrInvalidSubject, tmpl)
		}
		name := rest[open+1 : open+end]
		v, err := placeholder(name)
		if err != nil {
			return t, fmt.Errorf("%w: %q: %v", ErrInvalidSubject, tmpl, err)
		}
		t.parts = append(t.parts, subjectPart{value: v})
		rest = rest[open+end+1:]
	}
	if strings.ContainsRune(tmpl, '}') && strings.Count(tmpl, "{") != strings.Count(tmpl, "}") {
		return t, fmt.Errorf("%w: %q: unmatched }", ErrInvalidSubject, tmpl)
	}
	// A template's literal text must be valid on its own: render it with
	// every placeholder as "x".
	var probe strings.Builder
	for _, p := range t.parts {
		if p.value == nil {
			probe.WriteString(p.literal)
		} else {
			probe.WriteString("x")
		}
	}
	if err := validSubject(probe.String()); err != nil {
		return t, fmt.Errorf("%w: template %q: %v", ErrInvalidSubject, tmpl, err)
	}
	return t, nil
}

func placeholder(name string) (func(*outbox.Delivery, string) string, error) {
	switch {
	case name == "topic":
		return func(d *outbox.Delivery, _ string) string { return d.Topic }, nil
	case name == "group":
		return func(_ *outbox.Delivery, g string) string { return g }, nil
	case name == "message_group":
		return func(d *outbox.Delivery, _ string) string { return d.Group }, nil
	case strings.HasPrefix(name, "header.") && len(name) > len("header."):
		h := name[len("header."):]
		return func(d *outbox.Delivery, _ string) string { return d.Headers[h] }, nil
	}
	return nil, fmt.Errorf("unknown placeholder {%s} (want {topic}, {group}, {message_group} or {header.NAME})", name)
}

// render returns d's subject. An empty value renders as "_".
func (t subjectTemplate) render(d *outbox.Delivery, consumerGroup string) (string, error) {
	var b strings.Builder
	for _, p := range t.parts {
		if p.value == nil {
			b.WriteString(p.literal)
			continue
		}
		v := p.value(d, consumerGroup)
		if v == "" {
			v = emptyValue
		}
		b.WriteString(v)
	}
	s := b.String()
	if err := validSubject(s); err != nil {
		if len(s) > 100 {
			s = s[:100] + "..."
		}
		return "", fmt.Errorf("%w: %q: %v", ErrInvalidSubject, s, err)
	}
	return s, nil
}

// MaxSubjectLength is the longest subject the relay publishes to. A
// NATS server refuses a longer protocol line than 4,096 bytes (subject,
// reply subject and sizes) by closing the connection, so a message whose
// subject is longer is dead-lettered with ErrInvalidSubject instead.
const MaxSubjectLength = 1024

// validSubject reports whether s can be published to: dot-separated
// tokens, none empty, no wildcard token, no white space or control
// characters, at most MaxSubjectLength bytes.
func validSubject(s string) error {
	if s == "" {
		return errors.New("empty")
	}
	if len(s) > MaxSubjectLength {
		return fmt.Errorf("%d bytes, more than %d", len(s), MaxSubjectLength)
	}
	for _, tok := range strings.Split(s, ".") {
		switch tok {
		case "":
			return errors.New("empty token")
		case "*", ">":
			return errors.New("wildcard token")
		}
	}
	for _, r := range s {
		if unicode.IsSpace(r) || unicode.IsControl(r) || r == unicode.ReplacementChar {
			return fmt.Errorf("character %q", r)
		}
	}
	return nil
}
