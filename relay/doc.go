// Package relay forwards a topic's committed messages to a distributed log,
// NATS JetStream first, so that other services and teams consume them from
// there and the log does the fan-out.
//
// A relay is a consumer group of the topic (usually in Offset mode, which
// records nothing per message) whose handler publishes each batch and acks
// it only once the broker confirmed every message of it:
//
//	nc, err := natsrelay.Connect(natsrelay.NATSConfig{URL: "nats://nats:4222", CredentialsFile: "relay.creds"})
//	js, err := jetstream.New(nc)
//	_, err = natsrelay.EnsureStream(ctx, js, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
//	pub, err := natsrelay.NewJetStreamPublisher(natsrelay.JetStreamConfig{Conn: nc, Stream: "ORDERS"})
//	r, err := relay.New(pool, relay.Config{
//		Consumer:  consumergroup.Config{Topic: "orders", Client: client.Outbox()},
//		Publisher: pub,
//		Subject:   "orders.{message_group}",
//	})
//	err = r.Start(ctx, consumergroup.FromBeginning(false))
//
// # What reaches the stream
//
// Each message is published to the subject Config.Subject renders for it,
// with its payload, its headers as sent (among them the trace context of
// its send: traceparent, tracestate) and the relay's own: HeaderTopic,
// HeaderID, HeaderMessageGroup, HeaderCorrelationID, HeaderCreatedAt. A
// sender's headers that start with "Nats-" are JetStream's own (they would
// tell the stream to expect a sequence, or to roll it up) and are not
// forwarded. Its
// Nats-Msg-Id is Config.DedupPrefix + "{topic}:{id}", the same for every
// publish of it by any instance, so JetStream stores a republish within
// the stream's duplicate window as nothing new.
//
// # Order
//
// On an ordered topic (outbox.TopicConfig.Ordered) the messages of a
// message group reach the stream in the order their transactions
// committed, however many relay instances run and whatever fails:
//
//   - the group's claims hand out a message group's messages one run at a
//     time, to one instance, and never the next while one is leased (see
//     package consumergroup), so instances share the topic without
//     reordering it;
//   - within a batch, a natsrelay.JetStreamPublisher sends a message group's next
//     message only once JetStream confirmed the one before it (other
//     message groups' messages go at the same time). Asynchronous
//     publishing with every message in flight at once would reorder a
//     message group whenever an earlier message is lost while a later one
//     is stored: a connection cut between the two, a publish JetStream
//     answers with "no responders" while it restarts and the client
//     retries on its own, a leader change in a cluster;
//   - a message still unconfirmed when its batch's time is up is handed
//     back and holds its message group until it is stored.
//
// On a topic that is not ordered, instances publish batches concurrently
// and a retried message comes after newer ones: a relay refuses such a
// topic (ErrUnorderedTopic) unless Config.AllowUnordered says order does
// not matter.
//
// # Faults
//
//   - The NATS server is down, slow or unreachable: publishes fail or time
//     out (natsrelay.JetStreamConfig.AckTimeout), and the relay publishes them again
//     with backoff (Config.RetryInitial to RetryMax) under the same message
//     id. Nothing is acked that JetStream did not confirm. While a batch
//     waits, the group fetches no more than its window: back-pressure, not
//     a growing buffer. A batch still unconfirmed when its handler's time
//     is up (consumergroup.Config.HandlerTimeout, the topic's lease by
//     default) is handed back without spending an attempt, so an outage
//     never dead-letters anything.
//   - A relay instance is killed between the publish and the ack: its
//     lease runs out and another instance (or its restart) publishes the
//     messages again; JetStream drops them as duplicates within the window.
//   - JetStream refuses a message for itself (bigger than the stream's
//     MaxMsgSize or the server's max_payload), or its subject is not
//     valid (longer than MaxSubjectLength, too: a server closes a
//     connection that sends one): it is dead-lettered at once with the
//     reason (ErrRejected, ErrInvalidSubject); on an ordered topic its
//     message group then waits as the topic's OrderedDeadLetters says.
//   - No stream captures the subject, the relay's user may not publish
//     to it, or the connection was closed for good (its authorization
//     expired): a configuration fault (ErrMisconfigured). The relay
//     retries with backoff, counts it in
//     pgoutbox.relay.failures{reason="misconfigured"}, logs a warning, and
//     an ERROR (at most once a minute) once it lasted 5 s (JetStream
//     answers "no responders" for a moment while it starts), and
//     dead-letters nothing; once the stream or permission exists,
//     everything flows, in order.
//
// # The duplicate window
//
// JetStream drops a republished message only within the stream's duplicate
// window (StreamConfig.Duplicates, two minutes unless set). A republish
// comes at most this long after the first publish:
//
//	the longest outage of NATS or PostgreSQL to ride out (a publish whose
//	confirmation was lost is repeated when NATS is back; a batch whose ack
//	could not be written is published again once PostgreSQL is)
//	+ the topic's Lease (a killed instance's batch is taken over after it)
//	+ Config.RetryMax
//
// natsrelay.EnsureStream sets natsrelay.DefaultDuplicateWindow, 15 minutes: outages up to about
// 14 minutes with the default lease. JetStream keeps every message id of
// the window in memory: at 1,000 messages a second, 15 minutes is 900,000
// ids, so size the window to the outage, not beyond. A republish after the window is
// stored again; consumers that must not see a message twice check
// HeaderID (or Nats-Msg-Id) themselves.
//
// # Other brokers
//
// Publisher is the whole contract between the relay and a broker. A Kafka
// relay with franz-go would take: a kgo.Client with the idempotent
// producer (franz-go's default) and acks from all in-sync replicas; each
// Message as a record with Topic from Subject, Key from Key (so a message
// group stays on one partition, where the idempotent producer keeps order
// through its own retries), Headers as record headers; Publish producing
// the batch and waiting for every record's promise; kerr.MessageTooLarge
// mapped to ErrRejected, unknown topics and authorization failures to
// ErrMisconfigured, and records after a failed one of their key to
// ErrHeldBack (franz-go fails a partition's buffered records after a
// non-retryable error, which keeps that promise). Kafka deduplicates
// only within one producer's session, so a republish after a relay crash
// is a duplicate in the log: Kafka consumers deduplicate by HeaderID.
//
// # Metrics
//
// Beside the consumer group's own: pgoutbox.relay.published (messages
// JetStream confirmed), pgoutbox.relay.latency (seconds from a message's
// write to its confirmation), pgoutbox.relay.failures by reason, and the
// gauges pgoutbox.relay.lag (seconds: the age of the oldest message not
// yet relayed) and pgoutbox.relay.unrelayed (how many), read from the
// database when collected. All carry the topic and group.
package relay
