package consumergroup_test

import (
	"context"
	"fmt"
	"log"
	"sort"
	"sync"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/outboxtest"
)

// Two groups subscribe to one PUB_SUB topic; each receives every message.
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
	client, _ := outbox.NewClient(pool, outbox.Config{Schema: schema})
	err = client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "orders.placed", Semantics: outbox.PubSub, Tracking: outbox.Bitmap})
	if err != nil {
		log.Fatal(err)
	}

	var mu sync.Mutex
	var got []string
	var wg sync.WaitGroup
	wg.Add(4) // 2 messages × 2 groups
	var groups []*consumergroup.Group
	for _, name := range []string{"billing", "shipping"} {
		g, err := consumergroup.New(pool, consumergroup.Config{Topic: "orders.placed", Group: name, Client: client})
		if err != nil {
			log.Fatal(err)
		}
		_ = g.AddConsumer(name+"-1", func(ctx context.Context, d *outbox.Delivery) error {
			mu.Lock()
			got = append(got, fmt.Sprintf("%s got %s", name, d.Payload))
			mu.Unlock()
			wg.Done()
			return nil
		}, nil)
		if err := g.Start(ctx, consumergroup.FromNow()); err != nil {
			log.Fatal(err)
		}
		groups = append(groups, g)
	}

	producer, _ := outbox.NewProducer(outbox.ProducerConfig{Schema: schema})
	for _, order := range []string{`{"order":1}`, `{"order":2}`} {
		if _, err := producer.Send(ctx, pool, outbox.Message{Topic: "orders.placed", Payload: []byte(order)}); err != nil {
			log.Fatal(err)
		}
	}
	wg.Wait()
	for _, g := range groups {
		_ = g.Stop(ctx)
	}
	sort.Strings(got)
	for _, line := range got {
		fmt.Println(line)
	}
	// Output:
	// billing got {"order": 1}
	// billing got {"order": 2}
	// shipping got {"order": 1}
	// shipping got {"order": 2}
}
