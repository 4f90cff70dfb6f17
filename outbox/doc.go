// Package outbox is pgoutbox's core: topics and their configuration, the
// Producer that writes messages inside the caller's transaction, and the
// QUEUE Consumer that processes them with competing consumers.
//
// # Producing
//
// Producer.Send and Producer.SendBatch write with whatever Executor they are
// given, normally the caller's pgx.Tx: a rollback means the message never
// existed, and no second connection is ever opened. On commit, listening
// consumers are woken with NOTIFY, at most once per NotifyInterval per topic
// and producer: NOTIFY serialises committing transactions database-wide, so
// notifying every send would halve producer throughput. A message whose
// wake-up was skipped is picked up by a busy consumer's next claim, or by an
// idle one within its PollInterval.
//
// A topic's semantics are fixed by its first ConfigureTopic. A producer reads
// them once per topic, so a configured QUEUE topic's Send is a plain
// single-row INSERT; the messages of a PUB_SUB topic are written by a
// statement that also reads the topic row (a PUB_SUB message records the
// groups it needs as it is written). A send to a topic that was never
// configured fails with ErrUnknownTopic, unless
// ProducerConfig.AllowUnconfiguredTopics makes it a QUEUE topic with the
// defaults.
//
// # Consuming
//
// A Consumer claims batches with FOR UPDATE SKIP LOCKED, so any number of
// consumers in any number of processes share a topic without handing a
// message to two of them at once. Each claim sets a lease (the topic's
// Lease, the visibility timeout); handlers run with no transaction open, and
// their outcomes are written back in batches:
//
//   - nil: the message is deleted (acked);
//   - an error: retried after exponential backoff with jitter
//     (TopicConfig.BackoffInitial doubling up to BackoffMax), or after the
//     delay given with RetryAfter;
//   - Permanent(err), or an error on the last of MaxAttempts: dead-lettered.
//
// A message whose lease expires (its consumer crashed or hung) is available
// again: the next claim by any consumer of the topic takes it back and
// redelivers it; when that was its last attempt it is dead-lettered instead.
// Nothing stays leased forever. Dead letters live in a table of their own
// (Client.DeadLetters, Client.ReplayDeadLetters).
//
// Ordering is not promised: handlers run concurrently and retries reorder
// messages. Higher Message.Priority values are claimed first.
//
// # Stopping
//
// Consumer.Stop stops claiming, gives back claimed messages no handler has
// started (they are redelivered at once, their attempt not counted), and
// waits for running handlers until its context ends; then it cancels them
// and releases their messages too.
//
// # Time
//
// Leases, backoff and availability use the database's clock, which every
// instance shares. Tests inject a Clock instead to move time without
// sleeping.
package outbox
