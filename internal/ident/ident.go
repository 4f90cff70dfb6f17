// Package ident validates and quotes the identifiers pgoutbox puts into
// dynamic SQL (schema names today, partition names later).
package ident

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ErrInvalidSchema reports a schema name pgoutbox refuses to use.
var ErrInvalidSchema = errors.New("pgoutbox: invalid schema name")

// DefaultSchema is the schema used when the caller names none.
const DefaultSchema = "public"

// maxIdentifierBytes is PostgreSQL's NAMEDATALEN-1.
const maxIdentifierBytes = 63

// Schema returns the schema to use (DefaultSchema when name is empty) or an
// error wrapping ErrInvalidSchema. Names are limited to lower-case letters,
// digits and underscores, starting with a letter or underscore, at most 63
// bytes: the names PostgreSQL would not fold or truncate.
func Schema(name string) (string, error) {
	if name == "" {
		return DefaultSchema, nil
	}
	if len(name) > maxIdentifierBytes {
		return "", fmt.Errorf("%w: %q is longer than %d bytes", ErrInvalidSchema, name, maxIdentifierBytes)
	}
	for i, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r == '_':
		case r >= '0' && r <= '9' && i > 0:
		default:
			return "", fmt.Errorf("%w: %q (use lower-case letters, digits and underscores, not starting with a digit)", ErrInvalidSchema, name)
		}
	}
	return name, nil
}

// Quote returns name as a quoted SQL identifier.
func Quote(name string) string { return pgx.Identifier{name}.Sanitize() }
