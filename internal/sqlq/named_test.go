package sqlq_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/sqlq"
)

// A Named statement's names are numbered once, and a call binds exactly
// them: a missing or unknown name fails the statement, naming it.
func TestNamedStatementsBindEveryNameAndNoOther(t *testing.T) {
	n := sqlq.ForPubSub("s").CatchupSize
	if strings.Contains(n.Numbered, "@") || !strings.Contains(n.SQL, "@limit") {
		t.Fatalf("numbered %q from %q", n.Numbered, n.SQL)
	}
	args := sqlq.Args{"topic": "t", "prev": "1:1:", "cur": "2:2:", "limit": int64(7)}
	values := n.Bind(args)
	if len(values) != 4 || !strings.Contains(n.Numbered, "$4") || strings.Contains(n.Numbered, "$5") {
		t.Fatalf("bound %v to %s", values, n.Numbered)
	}
	seen := map[any]bool{}
	for _, v := range values {
		seen[v] = true
	}
	for _, v := range args {
		if !seen[v] {
			t.Errorf("%v is not bound", v)
		}
	}

	for _, c := range []struct {
		args sqlq.Args
		want string
	}{
		{sqlq.Args{"topic": "t", "prev": "1:1:", "cur": "2:2:"}, "no value for @limit"},
		{sqlq.Args{"topic": "t", "prev": "1:1:", "cur": "2:2:", "limit": 1, "extra": 1}, "has no @extra"},
	} {
		values := n.Bind(c.args)
		r, ok := values[0].(pgx.QueryRewriter)
		if len(values) != 1 || !ok {
			t.Fatalf("%v bound as %v", c.args, values)
		}
		if _, _, err := r.RewriteQuery(context.Background(), nil, n.Numbered, nil); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
}
