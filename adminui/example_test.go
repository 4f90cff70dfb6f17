package adminui_test

import (
	"context"
	"fmt"
	"log"
	"net/http"

	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/adminui"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/outboxtest"
)

// requireOperator stands for your authentication middleware.
func requireOperator(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, _, ok := r.BasicAuth(); !ok {
			w.Header().Set("WWW-Authenticate", `Basic realm="pgoutbox"`)
			http.Error(w, "operators only", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// Mount the UI under /pgoutbox, behind your authentication, with actions
// enabled.
func ExampleNewHandler() {
	ctx := context.Background()
	pool, schema, cleanup, err := outboxtest.Open(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer cleanup()
	client, err := outbox.NewClient(pool, outbox.Config{Schema: schema})
	if err != nil {
		log.Fatal(err)
	}
	adm, err := admin.New(client, admin.Options{})
	if err != nil {
		log.Fatal(err)
	}
	ui, err := adminui.NewHandler(adminui.Config{Admin: adm, Prefix: "/pgoutbox", Writable: true})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/pgoutbox/", requireOperator(ui))
	_ = mux // http.ListenAndServe(":8080", mux)
	// Output:
}

// Draw each topic's and group's charts over the last hour: a History
// samples every 10 seconds while it runs, and the UI draws what it kept.
func ExampleNewHistory() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pool, schema, cleanup, err := outboxtest.Open(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer cleanup()
	client, err := outbox.NewClient(pool, outbox.Config{Schema: schema})
	if err != nil {
		log.Fatal(err)
	}
	adm, err := admin.New(client, admin.Options{})
	if err != nil {
		log.Fatal(err)
	}
	history, err := adminui.NewHistory(adminui.HistoryConfig{Admin: adm})
	if err != nil {
		log.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- history.Run(ctx) }() // samples until ctx ends
	ui, err := adminui.NewHandler(adminui.Config{Admin: adm, History: history})
	if err != nil {
		log.Fatal(err)
	}
	_ = ui // mux.Handle("/pgoutbox/", requireOperator(ui))
	cancel()
	fmt.Println(<-done)
	// Output: <nil>
}
