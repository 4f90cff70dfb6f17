package pgtest

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// XidsAcrossPowerOfTen returns below+above consecutive transaction ids
// that straddle a power of ten P (the first below are P-below … P-1, the
// rest P, P+1, …), all of them already committed or aborted as far as any
// snapshot taken from now on can tell (below the current snapshot's xmin),
// and a group position (a pg_snapshot) that sees none of them.
//
// Tests write these ids into rows to check that xids are compared as
// numbers, never as text ("1000000" < "999999"). P is the largest power of
// ten that fits below the server's xmin, so the ids are in the past on any
// server: 10^6 on a busy one, 100 or 1,000 on a freshly initialised one.
// When even 100 does not fit, it burns transaction ids until it does.
func XidsAcrossPowerOfTen(tb testing.TB, pool *pgxpool.Pool, below, above int) (xids []string, position string) {
	tb.Helper()
	ctx := context.Background()
	for range 10 {
		var text string
		if err := pool.QueryRow(ctx, `SELECT pg_snapshot_xmin(pg_current_snapshot())::text`).Scan(&text); err != nil {
			tb.Fatalf("pgtest: read xmin: %v", err)
		}
		xmin, err := strconv.ParseUint(text, 10, 64)
		if err != nil {
			tb.Fatalf("pgtest: xmin %q: %v", text, err)
		}
		var p uint64
		for q := uint64(100); q+uint64(above) < xmin; q *= 10 {
			p = q
		}
		if p == 0 {
			// A brand-new cluster: use up enough ids for 100 to fit.
			need := 100 + above + 1 - int(xmin)
			if _, err := pool.Exec(ctx, fmt.Sprintf(
				`DO $$ BEGIN FOR i IN 1..%d LOOP PERFORM pg_current_xact_id(); COMMIT; END LOOP; END $$`, need)); err != nil {
				tb.Fatalf("pgtest: advance xids: %v", err)
			}
			continue
		}
		for i := range below + above {
			xids = append(xids, strconv.FormatUint(p-uint64(below)+uint64(i), 10))
		}
		before := strconv.FormatUint(p-uint64(below)-5, 10)
		return xids, before + ":" + before + ":"
	}
	tb.Fatalf("pgtest: the server's xmin does not advance past 100 + %d", above)
	return nil, ""
}
