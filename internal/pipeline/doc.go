// Package pipeline holds the rules of a consumer group instance's fetch →
// execute → complete steps (package consumergroup), each written here
// once:
//
//   - Fetch: one goroutine runs a [Loop]. It asks its Look function for a
//     claim as large as the [Window] allows, backs off after a failed one,
//     looks again at once while claims come back full, and otherwise waits
//     for a producer's notification, freed room, or a follow-up delay that
//     doubles from 1ms up to the poll interval while nothing is found.
//   - Execute: an [Executor]'s workers take dispatched [Job]s from a
//     channel. On an ordered topic a claim holds runs, a message group's
//     head and the messages behind it: [Runs] links each run in id
//     (commit) order, so one worker handles it in order and hands back
//     untried what follows a message that did not succeed. Every job
//     handled or handed back frees its place in the window at once. What
//     a failure leads to (retry after which delay, snooze, dead letter) is
//     outbox.TopicConfig.Judge; the result is one [Outcome] with its
//     [Failure], gathered per [Batch], and a watchdog gives up on handler
//     calls that overrun their timeout.
//   - Complete: one goroutine writes outcomes in batches ([Complete]):
//     whatever arrived while the previous write ran, in one statement or
//     transaction, then signals the fetcher (on an ordered topic the
//     messages behind the written ones may be claimable now).
package pipeline
