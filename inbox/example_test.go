package inbox_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/outboxtest"
)

// A handler charges each order once, however often its message arrives:
// the charge and the inbox's record of the message commit together, and
// a second delivery of the message is skipped.
func Example() {
	ctx := context.Background()
	pool, schema, cleanup, err := outboxtest.Open(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer cleanup()
	if err := migrations.Up(ctx, pool, migrations.Config{Schema: schema}); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+pgx.Identifier{schema, "charges"}.Sanitize()+` (message_id bigint)`); err != nil {
		log.Fatal(err)
	}

	in, err := inbox.New(ctx, pool, inbox.Config{Name: "billing", Schema: schema})
	if err != nil {
		log.Fatal(err)
	}
	charge := func(ctx context.Context, tx pgx.Tx, d *outbox.Delivery) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+pgx.Identifier{schema, "charges"}.Sanitize()+` VALUES ($1)`, d.ID)
		return err
	}
	d := &outbox.Delivery{ID: 7, Attempt: 1}
	for attempt := 1; attempt <= 2; attempt++ { // the second is a redelivery
		d.Attempt = attempt
		ran, err := in.Handle(ctx, d, charge)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("attempt %d charged: %v\n", attempt, ran)
	}
	var charges int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{schema, "charges"}.Sanitize()).Scan(&charges)
	fmt.Println("charges:", charges)
	// Output:
	// attempt 1 charged: true
	// attempt 2 charged: false
	// charges: 1
}
