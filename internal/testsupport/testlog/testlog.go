// Package testlog collects what a test's components log, for the test to
// read while they still run.
package testlog

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
)

// Buffer is a log destination safe for concurrent writers.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String is everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Logger logs to b in slog's text format, at Info and above.
func (b *Buffer) Logger() *slog.Logger { return slog.New(slog.NewTextHandler(b, nil)) }

// Lines are the lines written so far that contain every one of parts.
func (b *Buffer) Lines(parts ...string) []string {
	var out []string
	for line := range strings.Lines(b.String()) {
		if containsAll(line, parts) {
			out = append(out, strings.TrimSuffix(line, "\n"))
		}
	}
	return out
}

func containsAll(s string, parts []string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}
