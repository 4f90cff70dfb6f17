// Package pgoutbox turns PostgreSQL into a reliable message backbone for Go
// services: a transactional outbox, QUEUE topics with competing consumers,
// PUB_SUB fan-out to consumer groups, and an HTTP router. A service creates
// one Client and everything else from it:
//
//   - [Client]: the settings every component needs (schema, logger, meter
//     provider, clock), sending, and one Start/Stop for every consumer,
//     group, router and relay created from it.
//   - [github.com/pgoutbox/pgoutbox/migrations]: create and upgrade the tables at boot.
//   - [github.com/pgoutbox/pgoutbox/outbox]: topics, the Producer, the QUEUE Consumer,
//     dead letters.
//   - [github.com/pgoutbox/pgoutbox/consumergroup]: PUB_SUB consumer groups (fan-out).
//   - [github.com/pgoutbox/pgoutbox/relay]: forwarding a topic to NATS JetStream.
//   - [github.com/pgoutbox/pgoutbox/admin]: the operator API (also [Client.Admin]).
//   - [github.com/pgoutbox/pgoutbox/router]: delivery to HTTP endpoints, FIFO per message group.
//   - [github.com/pgoutbox/pgoutbox/outboxtest]: helpers for the service's own tests.
//
// # Boot
//
// Run the migrations, then create the client:
//
//	if err := migrations.Up(ctx, pool, migrations.Config{Schema: "app"}); err != nil {
//		return err
//	}
//	client, err := pgoutbox.NewClient(ctx, pool, pgoutbox.Config{Schema: "app", Logger: logger})
//
// # Sending
//
// A message is written inside the caller's transaction, so it exists exactly
// when the business change it describes does:
//
//	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		if _, err := tx.Exec(ctx, `UPDATE orders SET state = 'paid' WHERE id = $1`, orderID); err != nil {
//			return err
//		}
//		msg, err := outbox.NewMessage("orders.paid", OrderPaid{ID: orderID})
//		if err != nil {
//			return err
//		}
//		_, err = client.Send(ctx, tx, msg)
//		return err
//	})
//
// # Consuming
//
//	_, err = client.NewConsumer(ctx, outbox.ConsumerConfig{
//		Topic: "orders.paid",
//		Handler: func(ctx context.Context, d *outbox.Delivery) error {
//			paid, err := outbox.Decode[OrderPaid](d)
//			if err != nil {
//				return outbox.Permanent(err) // dead-letter, never retry
//			}
//			return ship(ctx, paid)           // error: retry with backoff
//		},
//	})
//	err = client.Start(ctx)
//	defer client.Stop(shutdownCtx) // routers, then consumers and groups, then LISTEN
//
// # Guarantees
//
// Delivery is at least once. A claimed message carries a lease; a consumer
// that crashes or stalls loses it and the message is redelivered, so handlers
// must be idempotent (Delivery.ID and Delivery.Attempt help). A handler error
// retries with exponential backoff and jitter; after the topic's MaxAttempts
// the message is dead-lettered: kept, listable and replayable. QUEUE
// consumers do not keep messages of one group in order.
package pgoutbox
