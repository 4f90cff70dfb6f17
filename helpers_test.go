package pgoutbox_test

import (
	"log/slog"
	"strings"

	"github.com/pgoutbox/pgoutbox/internal/testsupport/testlog"
)

// lines collects log output.
type lines struct{ testlog.Buffer }

func (l *lines) logger() *slog.Logger { return l.Logger() }

func (l *lines) contains(s string) bool { return strings.Contains(l.String(), s) }

// count returns how many lines contain every one of parts.
func (l *lines) count(parts ...string) int { return len(l.Lines(parts...)) }
