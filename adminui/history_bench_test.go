package adminui_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/adminui"
	"github.com/pgoutbox/pgoutbox/consumergroup"
)

// A sample, and a group's page with its charts, beside a topic that
// stores many messages (PGOUTBOX_BENCH_ROWS, 10,000,000 by default) and a
// group that has read none of them: every read stops at the count limit
// or reads only what was sent since the sample before.
//
//	go test -run '^$' -bench BenchmarkHistory -benchtime 20x ./adminui/
func BenchmarkHistory(b *testing.B) {
	rows := 10_000_000
	if v := os.Getenv("PGOUTBOX_BENCH_ROWS"); v != "" {
		var err error
		rows, err = strconv.Atoi(v)
		require.NoError(b, err)
	}
	f := newChartsFixture(b)
	ctx := context.Background()
	g := f.group(b)
	require.NoError(b, g.Start(ctx, consumergroup.FromNow()))
	f.stop(b, g)
	// Sent as a busy service sends: a transaction per 1,000 messages.
	start := time.Now()
	for done := 0; done < rows; done += 100_000 {
		_, err := f.db.Pool.Exec(ctx, fmt.Sprintf(`DO $$ BEGIN FOR k IN 1..%d LOOP
			INSERT INTO %q.outbox_published (topic, payload, correlation_id, status)
			SELECT 'events', jsonb_build_object('n', i), 'c', 'PUBLISHED' FROM generate_series(1, 1000) AS i;
			COMMIT; END LOOP; END $$`, min(100_000, rows-done)/1000, f.db.Schema))
		require.NoError(b, err)
	}
	_, err := f.db.Pool.Exec(ctx, fmt.Sprintf(`VACUUM ANALYZE %q.outbox_published`, f.db.Schema))
	require.NoError(b, err)
	b.Logf("%d messages stored in %s", rows, time.Since(start).Round(time.Second))
	srv := httptest.NewServer(handler(b, adminui.Config{Admin: f.admin, History: f.history, CacheFor: -1}))
	b.Cleanup(srv.Close)

	b.Run("sample", func(b *testing.B) {
		for b.Loop() {
			f.send(b, "events", 100, 0)
			f.sample(b)
		}
	})
	b.Run("group page", func(b *testing.B) {
		for b.Loop() {
			code, _ := get(b, srv, "/topics/events/groups/audit")
			require.Equal(b, 200, code)
		}
	})
}
