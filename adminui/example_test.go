package adminui_test

import (
	"context"
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
