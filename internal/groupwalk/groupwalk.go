// Package groupwalk keeps the starting point of ordered claims, which walk
// the message groups that have messages waiting in a fixed order (by their
// bytes), from the group after a starting point to the last, then from the
// first, so that every group's turn comes.
package groupwalk

import "cmp"

// End is where the next walk starts: after the last group a claim took a
// message of, in the order of a walk that started after the group after.
// group returns a claimed item's message group ("" for none, which does not
// count). It is only a starting point: where two claimers of a process
// share it, each still walks every group in turn.
func End[T any](after string, claimed []T, group func(T) string) string {
	var beyond, wrapped string // the last group taken past after, and before or at it
	for _, c := range claimed {
		g := group(c)
		switch {
		case g == "":
		case g > after:
			beyond = max(beyond, g)
		default:
			wrapped = max(wrapped, g)
		}
	}
	return cmp.Or(wrapped, beyond, after)
}
