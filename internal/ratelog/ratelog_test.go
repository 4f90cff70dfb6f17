package ratelog_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/internal/ratelog"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/clocktest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/testlog"
)

// Sum writes at most a record of a key per interval; the next one says how
// many were left out and carries their counts added to its own, and keys
// are limited apart. Pruning keeps a key with records left out.
func TestSumKeepsTheCountsOfWhatItLeavesOut(t *testing.T) {
	clock := clocktest.New(time.Now())
	logs := &testlog.Buffer{}
	l := ratelog.New(logs.Logger(), time.Minute, clock.Now)
	for range 5 {
		l.Sum(slog.LevelWarn, "takeover|a", "taken over", "messages", 3)
	}
	l.Sum(slog.LevelWarn, "takeover|b", "taken over", "messages", 7)
	require.Len(t, logs.Lines("taken over"), 2)
	require.Len(t, logs.Lines("messages=3"), 1)
	require.Len(t, logs.Lines("messages=7"), 1)

	clock.Advance(2 * time.Minute)
	l.Prune()
	l.Sum(slog.LevelWarn, "takeover|a", "taken over", "messages", 1)
	require.Len(t, logs.Lines("taken over"), 3)
	require.Len(t, logs.Lines("messages=13", "suppressed=4"), 1, "4 left out with 3 each, and this one's 1:\n%s", logs.String())
	l.Sum(slog.LevelWarn, "takeover|a", "taken over", "messages", 1)
	require.Len(t, logs.Lines("taken over"), 3, "within the interval again")
}
