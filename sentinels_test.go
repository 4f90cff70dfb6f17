package pgoutbox_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/relay"
	"github.com/pgoutbox/pgoutbox/router"
)

// Every package's configuration, "already started" and "not found" errors
// are the shared sentinels (or match them), so a caller branches on
// outbox.ErrInvalidConfig, outbox.ErrAlreadyStarted and outbox.ErrNotFound
// whatever package the error came from.
func TestSharedSentinels(t *testing.T) {
	t.Parallel()
	for name, err := range map[string]error{
		"relay.ErrInvalidConfig":  relay.ErrInvalidConfig,
		"router.ErrInvalidConfig": router.ErrInvalidConfig,
		"relay.ErrUnorderedTopic": relay.ErrUnorderedTopic,
	} {
		require.ErrorIs(t, err, outbox.ErrInvalidConfig, name)
	}
	for name, err := range map[string]error{
		"outbox.ErrUnknownTopic":            outbox.ErrUnknownTopic,
		"consumergroup.ErrUnknownMember":    consumergroup.ErrUnknownMember,
		"consumergroup.ErrSubscriptionGone": consumergroup.ErrSubscriptionGone,
		"router.ErrUnknownSource":           router.ErrUnknownSource,
	} {
		require.ErrorIs(t, err, outbox.ErrNotFound, name)
	}
	require.ErrorIs(t, router.ErrStarted, outbox.ErrAlreadyStarted)
}

// No package makes a private copy of a shared sentinel: a package-level
// error named like one (ErrInvalidConfig, ErrAlreadyStarted, ErrStarted,
// ErrNotFound, ErrUnknown…, Err…Gone) is never a fresh errors.New outside
// internal/cfgcheck, where the shared ones live. The list above cannot
// know of a sentinel added later; this reads every package's source.
func TestNoPrivateCopiesOfSharedSentinels(t *testing.T) {
	t.Parallel()
	shared := func(name string) bool {
		switch {
		case name == "ErrInvalidConfig", name == "ErrAlreadyStarted", name == "ErrStarted", name == "ErrNotFound":
			return true
		case strings.HasPrefix(name, "ErrUnknown"), strings.HasSuffix(name, "Gone"), strings.HasSuffix(name, "NotFound"):
			return true
		}
		return false
	}
	var copies []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path == filepath.Join("internal", "cfgcheck") || path == "examples" || (path != "." && strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.VAR {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if i < len(vs.Values) && shared(n.Name) && isErrorsNew(vs.Values[i]) {
						copies = append(copies, path+": "+n.Name)
					}
				}
			}
		}
		return nil
	})
	require.NoError(t, err)
	require.Empty(t, copies, "make these the shared sentinels of internal/cfgcheck (or cfgcheck.NotFound/Invalid)")
}

// isErrorsNew reports whether e is a call errors.New(...).
func isErrorsNew(e ast.Expr) bool {
	call, ok := e.(*ast.CallExpr)
	if !ok {
		return false
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	pkg, ok := sel.X.(*ast.Ident)
	return ok && pkg.Name == "errors" && sel.Sel.Name == "New"
}
