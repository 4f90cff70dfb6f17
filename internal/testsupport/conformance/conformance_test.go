package conformance_test

import (
	"slices"
	"testing"

	"github.com/pgoutbox/pgoutbox/internal/testsupport/conformance"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
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
// query exec modes but the default (the rest of the suite runs in it), over
// one tracking mode; and over QUEUE consumers in the modes
// TestThroughPgBouncer does not run them in.
func TestExecModes(t *testing.T) {
	var modes []string
	for _, m := range conformance.ExecModes {
		if m != "cache_statement" {
			modes = append(modes, m)
		}
	}
	for _, s := range conformance.Subjects {
		switch s.Name {
		case "bitmap":
			t.Run(s.Name, func(t *testing.T) { conformance.RunExecModes(t, s, modes) })
		case "queue":
			queueModes := slices.DeleteFunc(slices.Clone(modes), func(m string) bool {
				return slices.Contains(conformance.PgBouncerExecModes, m)
			})
			t.Run(s.Name, func(t *testing.T) { conformance.RunExecModes(t, s, queueModes) })
		}
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
