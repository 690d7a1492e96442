package lint_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const mod = "github.com/pgreorder/pgreorder/"

// allowed lists, for each library package, the packages of this module it may import
// (DESIGN.md: arrows only point down).
var allowed = map[string][]string{
	"heap":          {},
	"decoding":      {},
	"spill":         {},
	"reorderbuffer": {"heap", "decoding", "spill", "internal/knobs"},
	"replication":   {"reorderbuffer", "decoding", "spill", "heap", "internal/knobs"},
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
				ok := pkg == "replication" || pkg == "internal/pgtest" || strings.HasPrefix(pkg, "examples/")
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

// TestSpillResolvesNamesInDirectories: below the directory its caller names, package spill
// reaches files only through directory handles (openat and its relatives, or os.Root), never by
// a path, which a co-tenant of a shared directory could redirect with a symbolic link. Path-based
// calls are allowed only in osFS.OpenDir, which opens the caller's own path.
func TestSpillResolvesNamesInDirectories(t *testing.T) {
	byPath := map[string][]string{
		"os": {"Chmod", "Chown", "Chtimes", "Create", "CreateTemp", "Lchown", "Link", "Lstat", "Mkdir",
			"MkdirAll", "MkdirTemp", "Open", "OpenFile", "OpenRoot", "ReadDir", "ReadFile", "Readlink", "Remove",
			"RemoveAll", "Rename", "Stat", "Symlink", "Truncate", "WriteFile"},
		"syscall": {"Access", "Chmod", "Chown", "Creat", "Lchown", "Link", "Lstat", "Mkdir", "Mkfifo", "Mknod",
			"Open", "Readlink", "Rename", "Rmdir", "Stat", "Symlink", "Truncate", "Unlink", "Utimes"},
	}
	files, err := filepath.Glob(filepath.Join("..", "..", "spill", "*.go"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(token.NewFileSet(), f, nil, 0)
		require.NoError(t, err)
		for _, decl := range file.Decls {
			if fn, ok := decl.(*ast.FuncDecl); ok && fn.Name.Name == "OpenDir" && receiver(fn) == "osFS" {
				continue
			}
			ast.Inspect(decl, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				if pkg, ok := sel.X.(*ast.Ident); ok && slices.Contains(byPath[pkg.Name], sel.Sel.Name) {
					t.Errorf("%s: %s.%s resolves a path; use a spill.Dir", f, pkg.Name, sel.Sel.Name)
				}
				return true
			})
		}
	}
}

// receiver returns the type name of fn's receiver, or "".
func receiver(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return ""
	}
	typ := fn.Recv.List[0].Type
	if star, ok := typ.(*ast.StarExpr); ok {
		typ = star.X
	}
	if id, ok := typ.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}
