package sqlq

import (
	"context"
	"fmt"
	"regexp"
	"slices"

	"github.com/jackc/pgx/v5"
)

// Named is a statement whose parameters have names (@topic, @stream_bit,
// …), numbered once, when its statement set is built: pgx.NamedArgs would
// read the whole statement again on every call (29 µs and 11 kB for a
// look's read).
type Named struct {
	// SQL is the statement with its names, as written here.
	SQL string
	// Numbered is the statement as it is sent: each name replaced by its
	// number, in order of first appearance.
	Numbered string
	names    []string // names[i] is $i+1's
}

// Args are a Named statement's arguments, by name.
type Args = map[string]any

// parameterName finds the names in a statement. None of this package's
// statements uses @ in any other way.
var parameterName = regexp.MustCompile(`@([A-Za-z_][A-Za-z0-9_]*)`)

// named numbers sql's names.
func named(sql string) Named {
	byName := pgx.NamedArgs{}
	for _, m := range parameterName.FindAllStringSubmatch(sql, -1) {
		byName[m[1]] = m[1]
	}
	numbered, values, err := byName.RewriteQuery(context.Background(), nil, sql, nil)
	if err != nil { // a bug in a statement here: the prepare test fails on it
		return Named{SQL: sql, Numbered: sql}
	}
	n := Named{SQL: sql, Numbered: numbered, names: make([]string, len(values))}
	for i, v := range values {
		n.names[i] = v.(string)
	}
	return n
}

// Number returns sql with its names numbered, as pgx.StrictNamedArgs
// numbers them when the statement is sent: the text the server prepares.
func Number(sql string) string { return named(sql).Numbered }

// Bind returns the arguments of a call of n.Numbered: the values of args
// in the order of n's parameters. A name n uses that args lacks, or one
// args has that n does not use, is a bug: the statement then fails
// before it is sent, saying which.
func (n Named) Bind(args Args) []any {
	values := make([]any, len(n.names))
	for i, name := range n.names {
		v, ok := args[name]
		if !ok {
			return []any{failedBind{fmt.Errorf("sqlq: no value for @%s", name)}}
		}
		values[i] = v
	}
	if len(args) != len(n.names) {
		for name := range args {
			if !slices.Contains(n.names, name) {
				return []any{failedBind{fmt.Errorf("sqlq: the statement has no @%s", name)}}
			}
		}
	}
	return values
}

// failedBind fails the statement it is passed to with err.
type failedBind struct{ err error }

func (f failedBind) RewriteQuery(context.Context, *pgx.Conn, string, []any) (string, []any, error) {
	return "", nil, f.err
}
