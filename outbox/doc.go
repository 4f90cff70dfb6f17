// Package outbox is pgoutbox's core: topics and their configuration, the
// Producer that writes messages inside the caller's transaction, and what
// consumers share: the Handler, the errors that steer a retry (RetryAfter,
// RetryAt, Snooze, Permanent) and ConsumerConfig.
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
// Every topic's messages are written once to one log and read by consumer
// groups (package consumergroup): a PUB_SUB topic by each group
// subscribed to it, a QUEUE topic by its one group, whose members are the
// topic's consumers (pgoutbox.Client.NewConsumer, router.QueueSource). A
// Handler's result says what becomes of its message (TopicConfig.Judge):
//
//   - nil: acked;
//   - an error: retried after exponential backoff with jitter
//     (TopicConfig.BackoffInitial doubling up to BackoffMax), or after the
//     delay given with RetryAfter, or at the instant given with RetryAt;
//   - Snooze(delay, err), SnoozeUntil(at, err): back later without spending
//     an attempt;
//   - Permanent(err), or an error on the last of MaxAttempts: dead-lettered.
//
// # Time
//
// Leases, backoff and availability use the database's clock, which every
// instance shares. Tests inject a Clock instead to move time without
// sleeping.
package outbox
