package lint_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const mod = "github.com/pgreorder/pgreorder/"

// allowed lists, for each library package, the packages of this module it may import
// (docs/architecture.md: arrows only point down).
var allowed = map[string][]string{
	"heap":          {},
	"decoding":      {},
	"spill":         {},
	"reorderbuffer": {"heap", "decoding", "spill"},
	"replication":   {"reorderbuffer", "decoding", "spill", "heap"},
}

// imports returns the non-test imports of every package in the module.
func imports(t *testing.T) map[string][]string {
	t.Helper()
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}:{{join .Imports " "}}`, mod+"...").Output()
	require.NoError(t, err)
	m := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imps, _ := strings.Cut(line, ":")
		m[strings.TrimPrefix(pkg, mod)] = strings.Fields(imps)
	}
	return m
}

func TestImportsPointDown(t *testing.T) {
	all := imports(t)
	for pkg, ok := range allowed {
		imps, found := all[pkg]
		require.True(t, found, "package %s not found", pkg)
		for _, imp := range imps {
			if !strings.HasPrefix(imp, mod) {
				continue
			}
			require.Contains(t, ok, strings.TrimPrefix(imp, mod), "%s must not import %s", pkg, imp)
		}
	}
}

func TestOnlyReplicationTalksToPostgres(t *testing.T) {
	for pkg, imps := range imports(t) {
		for _, imp := range imps {
			if strings.HasPrefix(imp, "github.com/jackc/pgx/v5/pgconn") || imp == "net" {
				// internal/pgtest starts servers for tests and the demo; examples are programs.
				ok := pkg == "replication" || pkg == "internal/pgtest" || pkg == "internal/pgserver" || strings.HasPrefix(pkg, "examples/")
				require.True(t, ok, "%s imports %s: only replication may talk to the server", pkg, imp)
			}
		}
	}
}

// TestCoreHasNoGoroutinesOrClock: the reorder buffer is driven by calls, like etcd's raft
// RawNode, so that it is deterministic under test.
func TestCoreHasNoGoroutinesOrClock(t *testing.T) {
	for _, dir := range []string{"reorderbuffer", "decoding", "heap"} {
		files, err := filepath.Glob(filepath.Join("..", "..", dir, "*.go"))
		require.NoError(t, err)
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			file, err := parser.ParseFile(token.NewFileSet(), f, nil, 0)
			require.NoError(t, err)
			ast.Inspect(file, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.GoStmt:
					t.Errorf("%s starts a goroutine", f)
				case *ast.SelectorExpr:
					if id, ok := n.X.(*ast.Ident); ok && id.Name == "time" {
						switch n.Sel.Name {
						case "Now", "Since", "Until", "After", "AfterFunc", "Sleep", "NewTimer", "NewTicker", "Tick":
							t.Errorf("%s reads the clock (time.%s)", f, n.Sel.Name)
						}
					}
				}
				return true
			})
		}
	}
}
