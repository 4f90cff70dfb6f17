package pipeline

import (
	"slices"
	"testing"
)

type testJob struct {
	group string
	id    int64
	next  *testJob
}

func TestRunsLinksEachGroupInIDOrder(t *testing.T) {
	// A claim sorted by priority, not id: the runs still follow ids.
	a3, b1, a1, u, a2, b2 := &testJob{"a", 3, nil}, &testJob{"b", 1, nil}, &testJob{"a", 1, nil},
		&testJob{"", 4, nil}, &testJob{"a", 2, nil}, &testJob{"b", 5, nil}
	jobs := []*testJob{a3, b1, a1, u, a2, b2}
	first := Runs(jobs, func(j *testJob) (string, int64) { return j.group, j.id },
		func(prev, next *testJob) { prev.next = next })
	if want := []*testJob{b1, a1, u}; !slices.Equal(first, want) {
		t.Fatalf("first of each run: got %v, want %v", ids(first), ids(want))
	}
	if a1.next != a2 || a2.next != a3 || a3.next != nil {
		t.Fatalf("group a's run is not 1, 2, 3")
	}
	if b1.next != b2 || b2.next != nil || u.next != nil {
		t.Fatalf("group b's run is not 1, 5, or the ungrouped job was linked")
	}
	if len(jobs) != 6 || jobs[0] != a3 {
		t.Fatal("Runs changed its input")
	}
}

func TestRunsLeavesUngroupedJobsApart(t *testing.T) {
	jobs := []*testJob{{"", 1, nil}, {"", 2, nil}}
	first := Runs(jobs, func(j *testJob) (string, int64) { return j.group, j.id },
		func(prev, next *testJob) { t.Fatalf("linked %d to %d", prev.id, next.id) })
	if len(first) != 2 {
		t.Fatalf("got %d jobs, want both", len(first))
	}
}

func ids(js []*testJob) []int64 {
	out := make([]int64, len(js))
	for i, j := range js {
		out[i] = j.id
	}
	return out
}

func TestCapacity(t *testing.T) {
	if got := Capacity(100, 10, false); got != 110 {
		t.Fatalf("unordered: %d, want 110", got)
	}
	if got := Capacity(100, 10, true); got != 100+10*OrderedRun {
		t.Fatalf("ordered: %d, want %d", got, 100+10*OrderedRun)
	}
}
