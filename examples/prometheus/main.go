// Command prometheus shows a service exposing pgoutbox's metrics to
// Prometheus through the OpenTelemetry Prometheus exporter, with the
// backlog gauges and the admin UI mounted beside them. It is a module of
// its own, so that pgoutbox's go.mod does not carry exporters.
//
//	cd examples/prometheus && go run .          # serves :9464/metrics and :9464/pgoutbox/
//	cd examples/prometheus && go run . -once    # sends, consumes, prints the scrape's pgoutbox lines, exits
//
// It connects to DATABASE_URL, or to the postgres database of a local
// server, and works in the schema "prometheus_example". grafana.json
// beside it is a dashboard for these metrics.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/adminui"
	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/outbox"
)

func main() {
	once := flag.Bool("once", false, "send and consume a few messages, print one scrape's pgoutbox lines, and exit")
	addr := flag.String("addr", "127.0.0.1:9464", "where to serve /metrics and /pgoutbox/")
	flag.Parse()
	if err := run(context.Background(), *addr, *once); err != nil {
		fmt.Fprintln(os.Stderr, "prometheus example:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, addr string, once bool) error {
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
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
	const schema = "prometheus_example"
	if err := migrations.Up(ctx, pool, migrations.Config{Schema: schema, Logger: logger}); err != nil {
		return err
	}

	// The exporter is a reader of an SDK meter provider; its registry is
	// what /metrics serves.
	registry := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(registry))
	if err != nil {
		return err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer mp.Shutdown(context.WithoutCancel(ctx))

	client, err := pgoutbox.NewClient(ctx, pool, pgoutbox.Config{Schema: schema, Logger: logger, MeterProvider: mp})
	if err != nil {
		return err
	}
	gauges, err := client.Admin().RegisterGauges(mp) // the backlog and lag gauges
	if err != nil {
		return err
	}
	defer gauges.Unregister()
	if err := client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "emails", Semantics: outbox.Queue}); err != nil {
		return err
	}
	handled := make(chan struct{}, 100)
	if _, err := client.NewConsumer(ctx, outbox.ConsumerConfig{Topic: "emails", PollInterval: 100 * time.Millisecond,
		Handler: func(ctx context.Context, d *outbox.Delivery) error {
			handled <- struct{}{}
			return nil
		}}); err != nil {
		return err
	}
	history, err := adminui.NewHistory(adminui.HistoryConfig{Admin: client.Admin()})
	if err != nil {
		return err
	}
	historyCtx, stopHistory := context.WithCancel(ctx) // the UI's charts: sampled every 10 s until run returns
	historyDone := make(chan struct{})
	go func() { defer close(historyDone); _ = history.Run(historyCtx) }()
	defer func() { stopHistory(); <-historyDone }()
	ui, err := adminui.NewHandler(adminui.Config{Admin: client.Admin(), Prefix: "/pgoutbox", History: history})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	mux.Handle("/pgoutbox/", ui)
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	defer srv.Close()

	if err := client.Start(ctx); err != nil {
		return err
	}
	defer client.Stop(context.WithoutCancel(ctx))
	const n = 5
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for i := range n {
			msg, err := outbox.NewMessage("emails", map[string]int{"n": i})
			if err != nil {
				return err
			}
			if _, err := client.Send(ctx, tx, msg); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return err
	}
	for range n {
		select {
		case <-handled:
		case <-time.After(30 * time.Second):
			return errors.New("the messages were not handled within 30s")
		}
	}
	fmt.Fprintf(os.Stderr, "serving http://%s/metrics and http://%s/pgoutbox/\n", l.Addr(), l.Addr())
	if !once {
		<-ctx.Done()
		return nil
	}
	resp, err := http.Get("http://" + l.Addr().String() + "/metrics")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return printPgoutboxLines(os.Stdout, resp.Body)
}

// printPgoutboxLines prints the scrape's pgoutbox samples of the emails
// topic, and fails if the backlog gauge is missing.
func printPgoutboxLines(w io.Writer, scrape io.Reader) error {
	sc := bufio.NewScanner(scrape)
	found := false
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "pgoutbox_") && strings.Contains(line, `topic="emails"`) {
			fmt.Fprintln(w, line)
			found = found || strings.HasPrefix(line, "pgoutbox_queue_ready")
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if !found {
		return errors.New("no pgoutbox_queue_ready in the scrape")
	}
	return nil
}
