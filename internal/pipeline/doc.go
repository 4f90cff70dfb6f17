// Package pipeline holds what the two delivery pipelines share: the QUEUE
// consumer (package outbox) and a consumer group instance (package
// consumergroup) both run fetch → execute → complete, and the rules of
// each step are written here once:
//
//   - Fetch: one goroutine runs a [Loop]. It asks its Look function for a
//     claim as large as the [Window] allows, backs off after a failed one,
//     looks again at once while claims come back full, and otherwise waits
//     for a producer's notification, freed room, or a follow-up delay that
//     doubles from 1ms up to the poll interval while nothing is found.
//   - Execute: workers take claimed jobs from a channel. On an ordered
//     topic a claim holds runs, a message group's head and the messages
//     behind it: [Runs] links each run in id (commit) order, so one worker
//     handles it in order and hands back untried what follows a message
//     that did not succeed. Every job handled or handed back frees its
//     place in the window at once. What a failure leads to (retry after
//     which delay, snooze, dead letter) is outbox.TopicConfig.Judge, for
//     both.
//   - Complete: one goroutine writes outcomes in batches ([Complete]):
//     whatever arrived while the previous write ran, in one statement or
//     transaction, then signals the fetcher (on an ordered topic the
//     messages behind the written ones may be claimable now).
//
// What differs stays with each pipeline: the claim (a QUEUE consumer
// leases rows of the queue; a group instance reads its stream by snapshot
// pairs and leases batches, or, when ordered, queues what it reads and
// leases runs), how a lease is kept while a job waits or runs (per message
// for the QUEUE consumer, per batch and a handler timeout with a watchdog
// for groups), and what a completion writes.
package pipeline
