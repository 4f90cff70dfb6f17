package conformance

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// The liveness scenarios: a process holding messages under a long lease
// is killed, or frozen. A killed process's database session ends with it,
// and its messages come back at once; a frozen one keeps its session, and
// its messages stay its own until the lease ends.

// ownerGoneBound bounds how soon after a kill every message the killed
// process held is delivered again, far below the scenarios' 10-minute
// lease: the killed process's lock is found free within reapEvery and
// reapGrace (outbox.Client.LiveInstance), a look of the group takes the
// messages over, and the survivor handles them. That takes 1.0–1.4 s on
// a quiet machine (BENCHMARKS.md: each scenario logs it); the bound leaves
// room for a busy one, since speed is measured, not asserted.
const ownerGoneBound = 10 * time.Second

// holdInChild starts an instance in a child process whose handlers start
// every message they get and never finish (for a router subject: the
// receiver never answers), sends n messages, and waits until the child
// holds them all: it started every message it can start at once (on an
// ordered subject, one per message group), the rest being leased behind
// those. It returns the child, the ids sent and the handlings started.
func holdInChild(t *testing.T, e *Env, n int) (*Child, []int64) {
	t.Helper()
	started := e.startedCounter(t)
	child := e.StartChild(t, ChildSpec{Spec: Spec{Group: "g1", Instance: "holder", Concurrency: n, BatchSize: n,
		HandlerTimeout: time.Hour, RequestTimeout: time.Hour}, Hang: true})
	ids := e.Send(t, n)
	want := n
	if e.Subject.Ordered {
		want = min(n, OrderedGroups)
	}
	pgtest.Eventually(t, 30*time.Second, "the child holding every message", func() bool { return started() >= want })
	// A client records its instances alive once its session is made (a
	// connection and a notification round trip), and an instance leases
	// nothing before that for up to 2 s (see docs/guarantees.md). A
	// loaded machine can take longer: these scenarios are about a
	// recorded instance.
	e.waitRecordedAlive(t, 1)
	return child, ids
}

// waitRecordedAlive waits until n instances are recorded alive (see
// docs/guarantees.md): their clients' sessions are made, and their
// instances may lease messages.
func (e *Env) waitRecordedAlive(t *testing.T, n int) {
	t.Helper()
	pgtest.Eventually(t, 30*time.Second, fmt.Sprintf("%d instances recorded alive", n), func() bool {
		var recorded int
		require.NoError(t, e.DB.Pool.QueryRow(context.Background(), `SELECT count(*) FROM `+e.DB.Table("outbox_live_instances")).Scan(&recorded))
		return recorded >= n
	})
}

// startedCounter returns how many handlings a hanging child (or, for a
// router subject, the receiver hanging for it) started. From now on the
// receiver hangs until its request ends; releaseReceiver answers again.
func (e *Env) startedCounter(t *testing.T) func() int {
	if e.receiver != nil {
		var n atomic.Int64
		e.receiver.setBehaviour(func(ctx context.Context, _ *outbox.Delivery, _ int) error {
			n.Add(1)
			<-ctx.Done()
			return ctx.Err()
		})
		return func() int { return int(n.Load()) }
	}
	return func() int {
		var n int
		require.NoError(t, e.DB.Pool.QueryRow(context.Background(), `SELECT count(*) FROM `+e.DB.Table("conformance_started")).Scan(&n))
		return n
	}
}

// releaseReceiver makes a router subject's receiver answer at once again.
func (e *Env) releaseReceiver() {
	if e.receiver != nil {
		e.receiver.setBehaviour(func(context.Context, *outbox.Delivery, int) error { return nil })
	}
}

// killedOwnerComesBackAtOnce: a process holding 50 messages under a
// 10-minute lease is killed (SIGKILL); a survivor, running beside it
// with nothing to do, handles every one of them within ownerGoneBound.
func killedOwnerComesBackAtOnce(t *testing.T, s *Subject) {
	e := newEnv(t, s, func(tc *outbox.TopicConfig) { tc.Lease = 10 * time.Minute })
	child, ids := holdInChild(t, e, 50)
	e.releaseReceiver()
	// As many handlers as the killed process had: a router's pool sends
	// back to the source, for a second, what it has no room for.
	e.StartInstance(t, e.DB.Pool, Spec{Group: "g1", Instance: "survivor", Concurrency: 50, BatchSize: 50}, nil)
	time.Sleep(100 * time.Millisecond) // the survivor's first looks find nothing to take
	require.Empty(t, e.Handled(t, "g1"), "nothing is handled while its owner lives")
	killed := time.Now()
	child.Kill()
	<-child.Exited()
	e.WaitDelivered(t, "g1", ids, time.Minute)
	took := time.Since(killed)
	var first time.Time
	require.NoError(t, e.DB.Pool.QueryRow(context.Background(), `SELECT min(handled_at) FROM `+e.DB.Table("conformance_ledger")).Scan(&first))
	t.Logf("the killed process's messages were handled from %v to %v after the kill",
		first.Sub(killed).Round(time.Millisecond), took.Round(time.Millisecond))
	require.LessOrEqual(t, took, ownerGoneBound, "the killed process's messages come back at once, not when their 10-minute lease ends")
	e.Check(t, "g1", ids, nil)
}

// frozenOwnerKeepsItsLeases: a process holding 50 messages is frozen
// (SIGSTOP), as a long GC pause or a suspended VM would: it is alive, and
// its session with it. Frozen for 5 s under a 10-minute lease, it keeps
// every message (a survivor beside it handles none); frozen for 20 s
// under a 10 s lease (on the queue subject: every path keeps its leases
// with the one lease keeper), it loses them when the lease ends, not
// earlier.
func frozenOwnerKeepsItsLeases(t *testing.T, s *Subject) {
	for _, c := range []struct {
		name          string
		lease, freeze time.Duration
	}{{"Lease10m", 10 * time.Minute, 5 * time.Second}, {"Lease10s", 10 * time.Second, 20 * time.Second}} {
		if c.name == "Lease10s" && s.Name != "queue" {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, s, func(tc *outbox.TopicConfig) { tc.Lease = c.lease })
			child, ids := holdInChild(t, e, 50)
			e.releaseReceiver()
			e.StartInstance(t, e.DB.Pool, Spec{Group: "g1", Instance: "survivor"}, nil)
			frozen := time.Now()
			child.Freeze()
			// The lease keeper extends leases every third of the lease:
			// the last extension before the freeze was at most a third
			// of it earlier.
			earliest := frozen.Add(c.lease - c.lease/3)
			var first time.Time
			for time.Since(frozen) < c.freeze {
				if len(e.Handled(t, "g1")) > 0 && first.IsZero() {
					first = time.Now()
				}
				time.Sleep(50 * time.Millisecond)
			}
			if c.freeze < c.lease {
				require.True(t, first.IsZero(), "a frozen process's messages were taken %v into a %v freeze, under a %v lease",
					first.Sub(frozen), c.freeze, c.lease)
				child.Thaw()
				child.Kill()
				<-child.Exited()
				e.WaitDelivered(t, "g1", ids, time.Minute)
				return
			}
			require.False(t, first.IsZero(), "the lease ended during the freeze, and the survivor took nothing")
			require.False(t, first.Before(earliest), "a frozen process's messages were taken %v into the freeze, before its %v lease could end",
				first.Sub(frozen), c.lease)
			child.Thaw()
			e.WaitDelivered(t, "g1", ids, time.Minute)
			e.Check(t, "g1", ids, nil)
		})
	}
}

// restartedWithTheSameID: a process holding 50 messages under a 10-minute
// lease is killed and started again at once with the same instance id (a
// pod restarted in place): the new instance takes back what its
// predecessor held as it starts, and handles every message within
// ownerGoneBound of the kill; none of its own leases is taken from it.
func restartedWithTheSameID(t *testing.T, s *Subject) {
	e := newEnv(t, s, func(tc *outbox.TopicConfig) { tc.Lease = 10 * time.Minute })
	child, ids := holdInChild(t, e, 50)
	killed := time.Now()
	child.Kill()
	<-child.Exited()
	e.StartInstance(t, e.DB.Pool, Spec{Group: "g1", Instance: "holder", Concurrency: 50, BatchSize: 50}, nil)
	e.WaitDelivered(t, "g1", ids, time.Minute)
	took := time.Since(killed)
	t.Logf("the restarted instance handled its predecessor's messages %v after the kill", took.Round(time.Millisecond))
	require.LessOrEqual(t, took, ownerGoneBound, "the predecessor's messages come back at once, not when their 10-minute lease ends")
	e.Check(t, "g1", ids, nil)
	e.CheckNoDuplicates(t, "g1")
}
