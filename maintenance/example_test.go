package maintenance_test

import (
	"context"
	"fmt"
	"log"

	"github.com/pgoutbox/pgoutbox/maintenance"
	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/outboxtest"
)

// A service that uses the outbox and consumergroup packages directly runs
// its own maintenance service (pgoutbox.Client runs one for you). RunOnce
// runs every job now and reports what it did; Start runs them in the
// background until Stop.
func Example() {
	ctx := context.Background()
	// A pool on DATABASE_URL (default: the postgres database of a local
	// server), and a fresh schema in it.
	pool, schema, cleanup, err := outboxtest.Open(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer cleanup()
	if err := migrations.Up(ctx, pool, migrations.Config{Schema: schema}); err != nil {
		log.Fatal(err)
	}
	client, err := outbox.NewClient(pool, outbox.Config{Schema: schema})
	if err != nil {
		log.Fatal(err)
	}
	svc, err := maintenance.New(pool, maintenance.Config{Client: client})
	if err != nil {
		log.Fatal(err)
	}
	report, err := svc.RunOnce(ctx)
	if err != nil {
		log.Fatal(err)
	}
	// The first pass adds partitions for PUB_SUB messages ahead of the
	// writers (the one the migrations made is small).
	fmt.Println("partitions added:", report.PartitionsCreated > 0)

	if err := svc.Start(ctx); err != nil {
		log.Fatal(err)
	}
	if err := svc.Stop(ctx); err != nil {
		log.Fatal(err)
	}
	// Output: partitions added: true
}
