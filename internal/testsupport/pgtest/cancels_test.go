package pgtest

import (
	"context"
	"testing"
	"time"
)

// TestAStatementCancelledThroughPgBouncer: a statement whose context ends
// through the harness's PgBouncer fails at once. Through a PgBouncer older
// than 1.21 no cancel request reaches the server, so the statement runs on
// there; through a newer one the cancel request ends it. Either way the
// PgBouncer still answers.
func TestAStatementCancelledThroughPgBouncer(t *testing.T) {
	db := NewDB(t)
	pooled := NewPool(t, PgBouncer(t, db)+"&default_query_exec_mode=simple_protocol")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	const sleep = "SELECT pg_sleep(4) -- cancelled through PgBouncer"
	started := time.Now()
	if _, err := pooled.Exec(ctx, sleep); err == nil {
		t.Fatal("a statement whose context ended succeeded")
	}
	if waited := time.Since(started); waited > 3*time.Second {
		t.Fatalf("the statement returned %v after its context ended", waited)
	}
	running := func() bool {
		var n int
		if err := db.Pool.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_activity WHERE query = $1 AND state = 'active'`, sleep).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
	if pgbouncerDropsOnCancel() {
		if !running() {
			t.Fatal("the statement stopped on the server: a cancel request reached it through a PgBouncer older than 1.21")
		}
	} else {
		Eventually(t, 3*time.Second, "the cancel request to end the statement", func() bool { return !running() })
	}
	var one int
	if err := pooled.QueryRow(context.Background(), "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("PgBouncer no longer answers: %v", err)
	}
}
