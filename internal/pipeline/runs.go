package pipeline

import (
	"cmp"
	"slices"
)

// OrderedRun is the most messages of one message group a claim on an
// ordered topic takes together: the group's head and the messages right
// behind it, which one worker handles one after another (BENCHMARKS.md,
// "runs", measures the choice).
const OrderedRun = 10

// Capacity is how many claimed messages a consumer holds at most: a batch
// waiting, and what each of its workers holds; on an ordered topic a
// worker may hold the rest of a run behind the message it handles.
func Capacity(batch, workers int, ordered bool) int {
	if ordered {
		return batch + workers*OrderedRun
	}
	return batch + workers
}

// Runs orders the jobs of a claim on an ordered topic into runs. key gives
// a job's message group ("" for none) and message id. Within each message
// group, in id order (on an ordered topic, commit order), link is called
// with each job and the one right behind it. Runs returns the first job
// of each message group and every job without one, in jobs' order: those
// go to the workers, and a worker handles the rest of a run behind its
// first, in order.
func Runs[J any](jobs []J, key func(J) (group string, id int64), link func(prev, next J)) []J {
	type keyed struct {
		j     J
		group string
		id    int64
		pos   int
	}
	byID := make([]keyed, len(jobs))
	for i, j := range jobs {
		g, id := key(j)
		byID[i] = keyed{j, g, id, i}
	}
	slices.SortFunc(byID, func(a, b keyed) int { return cmp.Compare(a.id, b.id) })
	behind := make([]bool, len(jobs))
	last := map[string]keyed{}
	for _, k := range byID {
		if k.group == "" {
			continue
		}
		if prev, ok := last[k.group]; ok {
			link(prev.j, k.j)
			behind[k.pos] = true
		}
		last[k.group] = k
	}
	first := make([]J, 0, len(jobs))
	for i, j := range jobs {
		if !behind[i] {
			first = append(first, j)
		}
	}
	return first
}
