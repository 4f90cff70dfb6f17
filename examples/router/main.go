// Command router delivers outbox messages to a local HTTP receiver through
// the router: FIFO within each message group, groups in parallel. It
// prints the order each group was received in and exits.
//
//	go run ./examples/router
//
// It connects to DATABASE_URL, or, when that is not set, to the postgres
// database of a local server (postgres://postgres@127.0.0.1:5432/postgres),
// and works in a schema of its own that it drops at the end.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/router"
)

// Event is the payload: which customer, which step.
type Event struct {
	Customer string `json:"customer"`
	Step     int    `json:"step"`
}

const customers, steps = 4, 5

func main() {
	if err := run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "router example:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()

	// The downstream service: records what each customer's stream received.
	var mu sync.Mutex
	received := map[string][]int{}
	total := 0
	done := make(chan struct{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var e Event
		if err := json.NewDecoder(r.Body).Decode(&e); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		time.Sleep(5 * time.Millisecond) // some work
		mu.Lock()
		received[e.Customer] = append(received[e.Customer], e.Step)
		if total++; total == customers*steps {
			close(done)
		}
		mu.Unlock()
		_, _ = w.Write([]byte(`{"ack":true}`))
	})}
	go srv.Serve(ln)
	defer srv.Close()
	target := "http://" + ln.Addr().String() + "/events"

	url, from := os.Getenv("DATABASE_URL"), "DATABASE_URL"
	if url == "" {
		url, from = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "the local server; set DATABASE_URL to use another"
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	cc := pool.Config().ConnConfig
	fmt.Fprintf(os.Stderr, "database %q at %s:%d (%s)\n", cc.Database, cc.Host, cc.Port, from)
	schema := fmt.Sprintf("router_example_%d", time.Now().UnixNano())
	defer pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`)
	if err := migrations.Up(ctx, pool, migrations.Config{Schema: schema}); err != nil {
		return err
	}
	client, err := pgoutbox.NewClient(ctx, pool, pgoutbox.Config{Schema: schema})
	if err != nil {
		return err
	}

	if err := client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "customer.events"}); err != nil {
		return err
	}

	// Interleaved steps of several customers; each customer is a message group.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for step := 1; step <= steps; step++ {
			for c := 1; c <= customers; c++ {
				msg, err := outbox.NewMessage("customer.events", Event{Customer: fmt.Sprintf("customer-%d", c), Step: step})
				if err != nil {
					return err
				}
				msg.Group = fmt.Sprintf("customer-%d", c)
				msg.Headers = map[string]string{router.HeaderPool: "WEBHOOKS", router.HeaderTarget: target}
				if _, err := client.Send(ctx, tx, msg); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return err
	}

	rt, err := client.NewRouter(router.Config{
		Pools:        []router.PoolConfig{{Code: "WEBHOOKS", Concurrency: 4, RateLimitPerMinute: 6000}},
		AllowedHosts: []string{ln.Addr().String()},
	})
	if err != nil {
		return err
	}
	src, err := router.NewQueueSource(router.QueueSourceConfig{Client: client.Outbox(), Topic: "customer.events"})
	if err != nil {
		return err
	}
	rt.AddSource(src)
	if err := client.Start(ctx); err != nil {
		return err
	}
	select {
	case <-done:
	case <-ctx.Done():
		return errors.New("timed out waiting for deliveries")
	}
	if err := client.Stop(ctx); err != nil {
		return err
	}

	mu.Lock()
	defer mu.Unlock()
	names := make([]string, 0, len(received))
	for name := range received {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		fmt.Printf("%s received steps %v\n", name, received[name])
		for i, step := range received[name] {
			if step != i+1 {
				return fmt.Errorf("%s: out of order", name)
			}
		}
	}
	fmt.Printf("delivered %d messages, FIFO within each customer\n", total)
	return nil
}
