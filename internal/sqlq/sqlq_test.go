package sqlq_test

import (
	"context"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// Every statement pgoutbox runs is prepared against a schema migrated to
// the latest version: a statement a migration broke (a renamed column, a
// dropped table) or a typo fails here, in one place, naming the statement,
// instead of in whichever test happens to run it.
func TestEveryStatementPreparesAgainstTheMigratedSchema(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	n := 0
	var numberedLeft []string
	for _, set := range []any{sqlq.For(db.Schema), sqlq.ForPubSub(db.Schema), sqlq.ForMaintenance(db.Schema),
		sqlq.ForAdmin(db.Schema), sqlq.ForInbox(db.Schema), sqlq.ForPartitions(db.Schema), sqlq.ForLiveness(db.Schema), sqlq.ForRouter(db.Schema)} {
		v := reflect.ValueOf(set).Elem()
		for i := range v.NumField() {
			f := v.Type().Field(i)
			name := v.Type().Name() + "." + f.Name
			if !f.IsExported() {
				continue
			}
			var sql string
			switch field := v.Field(i).Interface(); {
			case f.Type.Kind() == reflect.String:
				// Sent with pgx.StrictNamedArgs, which numbers the names
				// on each call as named does once.
				sql = sqlq.Number(field.(string))
			case f.Type == reflect.TypeFor[sqlq.Named]():
				// A statement with named parameters is sent numbered, and
				// every name is numbered (a Bind call can set it).
				sql = field.(sqlq.Named).Numbered
				if strings.Contains(sql, "@") {
					t.Errorf("%s has names left: %s", name, sql)
				}
			default:
				continue
			}
			if sql == "" {
				t.Errorf("%s is empty", name)
				continue
			}
			if numbered.MatchString(rawSQL(v.Field(i).Interface())) {
				numberedLeft = append(numberedLeft, name)
			}
			if strings.HasPrefix(sql, "ANALYZE ") { // a utility statement does not prepare: it runs
				if _, err := conn.Exec(ctx, sql); err != nil {
					t.Errorf("%s does not run: %v\n%s", name, err, sql)
				}
				n++
				continue
			}
			if _, err := conn.Conn().Prepare(ctx, name, sql); err != nil {
				t.Errorf("%s does not prepare: %v\n%s", name, err, sql)
			}
			n++
		}
	}
	if len(numberedLeft) > 0 {
		t.Errorf("%d statements still number their parameters ($1, …) instead of naming them: %s",
			len(numberedLeft), strings.Join(numberedLeft, ", "))
	}
	if n < 50 {
		t.Fatalf("only %d statements found: the test no longer sees them all", n)
	}
	t.Logf("%d statements prepared", n)
}

// numbered finds a numbered parameter ($1) in a statement's text.
var numbered = regexp.MustCompile(`\$[0-9]`)

// rawSQL is a statement field's text as written, before numbering.
func rawSQL(field any) string {
	switch f := field.(type) {
	case string:
		return f
	case sqlq.Named:
		return f.SQL
	}
	return ""
}
