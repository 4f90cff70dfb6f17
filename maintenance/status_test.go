package maintenance_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/maintenance"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// Each job's status follows its passes: a pass that succeeds within the
// job's interval records its success; passes that overrun the interval
// (here the cleanup job's is a nanosecond, which no pass can keep) make the
// job fall behind after BehindPasses of them, logged at WARN; one that
// keeps up again clears it.
func TestJobStatusFollowsThePasses(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.topic(t, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: outbox.Offset})
	svc := b.service(t, maintenance.Config{CleanupInterval: time.Nanosecond})
	for i := range maintenance.BehindPasses {
		_, err := svc.RunOnce(ctx)
		require.NoError(t, err)
		cleanup := status(t, svc, "cleanup")
		require.Equal(t, i+1, cleanup.Behind)
		require.Equal(t, i+1 >= maintenance.BehindPasses, cleanup.FallingBehind())
		require.False(t, cleanup.LastSuccess.IsZero())
		require.Zero(t, cleanup.Failures)
		require.Zero(t, status(t, svc, "dead-groups").Behind, "a job within its interval keeps up")
	}
	require.Len(t, b.logs.Lines("level=WARN", "falling behind", "job=cleanup"), 1)

	svc2 := b.service(t, maintenance.Config{})
	_, err := svc2.RunOnce(ctx)
	require.NoError(t, err)
	for _, j := range svc2.Status() {
		require.Zero(t, j.Behind, j.Job)
		require.False(t, j.LastSuccess.IsZero(), j.Job)
	}
}

func status(t *testing.T, svc *maintenance.Service, job string) maintenance.JobStatus {
	t.Helper()
	for _, j := range svc.Status() {
		if j.Job == job {
			return j
		}
	}
	t.Fatalf("no job %s in %+v", job, svc.Status())
	return maintenance.JobStatus{}
}
