package router_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"

	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/outboxtest"
	"github.com/pgoutbox/pgoutbox/router"
)

// Deliver the messages of a QUEUE topic to an HTTP endpoint, in order
// within each message group.
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

	// The downstream endpoint.
	var mu sync.Mutex
	var got []string
	var wg sync.WaitGroup
	wg.Add(3)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]string
		_ = json.NewDecoder(r.Body).Decode(&body)
		mu.Lock()
		got = append(got, r.Header.Get("X-Message-Group")+": "+body["step"])
		mu.Unlock()
		_, _ = w.Write([]byte(`{"ack":true}`))
		wg.Done()
	}))
	defer srv.Close()
	host := srv.Listener.Addr().String()

	client, _ := outbox.NewClient(pool, outbox.Config{Schema: schema})
	if err := client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "orders"}); err != nil {
		log.Fatal(err)
	}
	producer, _ := outbox.NewProducer(outbox.ProducerConfig{Schema: schema})
	for _, step := range []string{"created", "paid", "shipped"} {
		msg, _ := outbox.NewMessage("orders", map[string]string{"step": step})
		msg.Group = "order-42"
		msg.Headers = map[string]string{router.HeaderPool: "ORDERS", router.HeaderTarget: (&url.URL{Scheme: "http", Host: host, Path: "/orders"}).String()}
		if _, err := producer.Send(ctx, pool, msg); err != nil {
			log.Fatal(err)
		}
	}

	rt, err := router.New(router.Config{
		Pools:        []router.PoolConfig{{Code: "ORDERS", Concurrency: 4}},
		AllowedHosts: []string{host},
	})
	if err != nil {
		log.Fatal(err)
	}
	src, _ := router.NewQueueSource(router.QueueSourceConfig{Client: client, Topic: "orders"})
	rt.AddSource(src)
	if err := rt.Start(ctx); err != nil {
		log.Fatal(err)
	}
	wg.Wait()
	_ = rt.Stop(ctx)
	for _, line := range got {
		fmt.Println(line)
	}
	// Output:
	// order-42: created
	// order-42: paid
	// order-42: shipped
}
