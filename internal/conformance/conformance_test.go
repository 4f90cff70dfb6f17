package conformance_test

import (
	"testing"

	"github.com/pgoutbox/pgoutbox/internal/conformance"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

func TestMain(m *testing.M) {
	if conformance.IsChild() {
		conformance.ChildMain()
	}
	pgtest.Main(m)
}

// TestConformance runs the suite over every delivery path of packages
// outbox, consumergroup and router.
func TestConformance(t *testing.T) {
	for _, s := range append(conformance.Subjects, conformance.RouterSubjects...) {
		t.Run(s.Name, func(t *testing.T) {
			t.Parallel()
			conformance.Run(t, s)
		})
	}
}

// TestExecModes runs the core scenarios with every pool in each of pgx's
// query exec modes, over QUEUE consumers and one tracking mode.
func TestExecModes(t *testing.T) {
	for _, s := range conformance.Subjects {
		if s.Name != "queue" && s.Name != "bitmap" {
			continue
		}
		t.Run(s.Name, func(t *testing.T) { conformance.RunExecModes(t, s) })
	}
}

// TestThroughPgBouncer runs the core scenarios with every pool going through
// a PgBouncer in transaction pooling mode.
func TestThroughPgBouncer(t *testing.T) {
	for _, s := range conformance.Subjects {
		if s.Name != "queue" && s.Name != "counter" {
			continue
		}
		t.Run(s.Name, func(t *testing.T) { conformance.RunThroughPgBouncer(t, s) })
	}
}
