package outbox

import (
	"bytes"
	"strings"
	"time"
	"unicode/utf8"
)

// What PostgreSQL cannot store, found before a statement is sent: a
// statement that fails aborts the caller's transaction, and the database's
// error ("unsupported Unicode escape sequence") says little about which
// field of which message was wrong.

// jsonbProblem says why PostgreSQL's jsonb cannot store the valid JSON
// text b ("" when it can): invalid UTF-8, a \u0000 escape, or a \u
// surrogate escape that is not a high-low pair.
func jsonbProblem(b []byte) string {
	if !utf8.Valid(b) {
		return "not valid UTF-8"
	}
	// In valid JSON a backslash only starts an escape inside a string.
	for i := bytes.IndexByte(b, '\\'); i >= 0; {
		if i+1 >= len(b) {
			break
		}
		next := i + 2
		if b[i+1] == 'u' && i+6 <= len(b) {
			r := hex4(b[i+2 : i+6])
			switch {
			case r == 0:
				return `contains \u0000, which PostgreSQL's jsonb cannot store`
			case r >= 0xD800 && r <= 0xDBFF:
				if i+12 > len(b) || b[i+6] != '\\' || b[i+7] != 'u' {
					return "contains an unpaired UTF-16 surrogate escape"
				}
				if lo := hex4(b[i+8 : i+12]); lo < 0xDC00 || lo > 0xDFFF {
					return "contains an unpaired UTF-16 surrogate escape"
				}
				next = i + 12
			case r >= 0xDC00 && r <= 0xDFFF:
				return "contains an unpaired UTF-16 surrogate escape"
			default:
				next = i + 6
			}
		}
		j := bytes.IndexByte(b[next:], '\\')
		if j < 0 {
			break
		}
		i = next + j
	}
	return ""
}

// hex4 decodes four hex digits (valid JSON guarantees them after \u).
func hex4(b []byte) rune {
	var r rune
	for _, c := range b {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		}
	}
	return r
}

// textProblem says why a text column cannot store s ("" when it can).
func textProblem(s string) string {
	switch {
	case strings.IndexByte(s, 0) >= 0:
		return "contains a NUL byte"
	case !utf8.ValidString(s):
		return "is not valid UTF-8"
	}
	return ""
}

// The range of PostgreSQL's timestamptz.
var (
	minTimestamp = time.Date(-4713, time.November, 24, 0, 0, 0, 0, time.UTC)
	maxTimestamp = time.Date(294276, time.December, 31, 23, 59, 59, 0, time.UTC)
)

// StorableTime reports whether PostgreSQL's timestamptz can hold t.
func StorableTime(t time.Time) bool { return !t.Before(minTimestamp) && !t.After(maxTimestamp) }
