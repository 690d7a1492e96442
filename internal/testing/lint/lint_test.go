package lint_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const mod = "github.com/pgreorder/pgreorder/"

// root is the module's directory, relative to this package's.
var root = filepath.Join("..", "..", "..")

// core lists the packages that depend on the standard library and on each other only, with the
// packages of this module each may depend on. It is checked on the transitive dependencies of
// the shipped code (go list -deps), so that a core package cannot reach another module, or a
// package above it, through a package in between.
var core = map[string][]string{
	"heap":           {},
	"decoding":       {},
	"vfs":            {},
	"internal/ilist": {},
	"spill":          {"vfs", "internal/ilist"},
	"reorderbuffer":  {"heap", "decoding", "spill", "vfs", "internal/ilist"},
}

// allowed lists, for every other library package, the packages of this module it may import
// directly (imports point down only). Every package of the module except commands (cmd/...),
// programs (examples/...) and benchmarks (bench/...) is here or in core: a new package has to
// take its place in the layering.
var allowed = map[string][]string{
	// PostgreSQL sessions: connecting (ordinary and walsender connections), the pinned session
	// settings, redaction, backends, SQLSTATE classes, quoting. Under every package that talks
	// to a server; it imports nothing of the module.
	"internal/pgsession": {},
	// The error that names a field of a configuration, which the packages with a Config return
	// (each under its own name) and the command maps to its flags. It imports nothing of the
	// module.
	"internal/configerr": {},
	// The one rule of what is retried and the one backoff: over pgsession (its table of transient
	// SQLSTATEs) and spill (a corrupt log), under every package that retries.
	"internal/retry": {"internal/pgsession", "spill"},
	"replication":    {"internal/pgsession", "internal/configerr", "internal/retry", "reorderbuffer", "decoding", "spill", "heap"},
	"metrics":        {"replication", "reorderbuffer", "decoding"},
	"spillcompress":  {"spill"},
	// The consumer entry point: over the toolkit, below apply (which uses its copy), never
	// importing it.
	"changefeed": {"catalog", "replication", "snapshot", "pgvalue", "format", "reorderbuffer", "decoding",
		"internal/pgsession", "internal/configerr", "internal/retry", "vfs"},
	// The Kafka output: a changefeed store and handler over the format's events.
	"kafkasink": {"catalog", "changefeed", "decoding", "format", "internal/configerr", "internal/retry"},
	// The toolkit.
	"pgvalue": {"decoding"},
	"format":  {"pgvalue", "reorderbuffer", "decoding", "vfs"},
	// What the events need of the source's catalog, read for format.
	"catalog":  {"format", "decoding", "internal/pgsession"},
	"snapshot": {"replication", "decoding", "internal/copycodec", "internal/pgsession", "internal/configerr", "internal/retry"},
	// The subscriber: apply orchestrates; its conflict vocabulary is a public leaf over decoding
	// only, and the COPY codec it shares with snapshot another; its scheduling (commit order,
	// queues, dependencies) touches no server; its target side (the connections, the statements
	// and batches they send) calls conflict detection, below it; neither knows the stream's
	// transactions (reorderbuffer) nor apply.
	"apply": {"apply/conflict", "changefeed", "snapshot", "replication", "reorderbuffer", "decoding", "spill",
		"apply/internal/schedule", "apply/internal/target", "apply/internal/detect",
		"apply/internal/engine", "apply/internal/plan", "apply/internal/initcopy", "apply/internal/ddl", "internal/pgsession",
		"internal/configerr", "internal/retry"},
	// The initial copy's side on the target: the copy table, the chunks written; the snapshot's
	// chunks in, the target's statements out. Also the tables added to the publications.
	"apply/internal/initcopy": {"apply/internal/target", "snapshot", "decoding", "internal/pgsession"},
	// The target's tables made to follow the source's: the source's catalog in (through a
	// function the Applier gives), the target's statements out.
	"apply/internal/ddl": {"apply/internal/target", "internal/pgsession"},
	// The engine that applies a session's stream (leader, workers, queues, commit order,
	// acknowledgements): over the decision core, the scheduling and the target connections;
	// what it needs of the session comes in through its Session and Host, never from apply.
	"apply/internal/engine": {"apply/internal/plan", "apply/internal/schedule", "apply/internal/target", "apply/internal/detect",
		"replication", "reorderbuffer", "decoding", "spill", "internal/retry"},
	"apply/conflict":          {"decoding"},
	"apply/internal/schedule": {"decoding", "spill"},
	// The decisions of eager and parallel apply as plain state: no goroutine, no clock, no
	// connection (TestCoreHasNoGoroutinesOrClock).
	"apply/internal/plan": {"decoding"},
	"apply/internal/target": {"apply/conflict", "apply/internal/detect", "decoding", "internal/copycodec", "internal/pgsession",
		"internal/configerr", "internal/retry"},
	"apply/internal/detect": {"apply/conflict", "decoding", "internal/pgsession"},
	"internal/copycodec":    {"decoding"},
	// What the commands link besides the library.
	"internal/tools/capture":  {"decoding"},
	"internal/tools/pgserver": {"decoding", "internal/tools/capture", "internal/pgsession"},
	// Test machinery.
	"internal/testing/lint":      {},
	"internal/testing/pgtest":    {"internal/tools/pgserver", "internal/pgsession"},
	"internal/testing/kafkatest": {"internal/testing/pgtest"},
	"internal/testing/scrape":    {},
	"internal/testing/cputime":   {},
	"internal/testing/cotenant":  {},
	"vfs/faultfs":                {"vfs"},
}

// unrestricted reports whether a package of the module is above the layering: a command, a
// program, a benchmark, or the module's root package (its documentation).
func unrestricted(pkg string) bool {
	return pkg == "" || pkg == "bench" || strings.HasPrefix(pkg, "bench/") ||
		strings.HasPrefix(pkg, "cmd/") || strings.HasPrefix(pkg, "examples/")
}

// network reports whether an import path is a networking package of the standard library.
func network(pkg string) bool {
	return pkg == "net" || strings.HasPrefix(pkg, "net/") || pkg == "crypto/tls"
}

// pkgInfo is what go list says about one package.
type pkgInfo struct {
	standard bool
	imports  []string // direct, non-test
	deps     []string // transitive, non-test
}

// list runs go list on every package of the module and on their dependencies.
func list(t *testing.T) map[string]pkgInfo {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", "-f",
		`{{.ImportPath}}|{{.Standard}}|{{join .Imports " "}}|{{join .Deps " "}}`, mod+"...").Output()
	require.NoError(t, err)
	m := map[string]pkgInfo{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "|")
		require.Len(t, f, 4, line)
		m[f[0]] = pkgInfo{standard: f[1] == "true", imports: strings.Fields(f[2]), deps: strings.Fields(f[3])}
	}
	return m
}

// coreViolations returns what is wrong with the transitive dependencies of core package pkg
// (a path relative to the module), given what go list reports.
func coreViolations(pkg string, pkgs map[string]pkgInfo) []string {
	info, ok := pkgs[mod+pkg]
	if !ok {
		return []string{fmt.Sprintf("package %s not found", pkg)}
	}
	var bad []string
	for _, dep := range info.deps {
		own, isOwn := strings.CutPrefix(dep, mod)
		switch {
		case pkgs[dep].standard && network(dep):
			bad = append(bad, fmt.Sprintf("%s depends on the network package %s", pkg, dep))
		case pkgs[dep].standard:
		case !isOwn:
			bad = append(bad, fmt.Sprintf("%s depends on %s, outside the standard library", pkg, dep))
		case !slices.Contains(core[pkg], own):
			bad = append(bad, fmt.Sprintf("%s must not depend on %s", pkg, dep))
		}
	}
	return bad
}

func TestCoreDependsOnStandardLibraryAndCoreOnly(t *testing.T) {
	pkgs := list(t)
	for pkg := range core {
		for _, v := range coreViolations(pkg, pkgs) {
			t.Error(v)
		}
	}
}

// TestCoreViolations checks that the check above fails where it must.
func TestCoreViolations(t *testing.T) {
	std := pkgInfo{standard: true}
	pkgs := map[string]pkgInfo{
		"fmt": std, "net": std, "net/netip": std, "crypto/tls": std, "crypto/sha256": std,
		mod + "heap":                 {},
		mod + "spill":                {},
		mod + "decoding":             {},
		"github.com/jackc/pglogrepl": {},
	}
	tests := []struct {
		pkg  string
		deps []string
		want int
	}{
		{"decoding", []string{"fmt", "crypto/sha256"}, 0},
		{"reorderbuffer", []string{"fmt", mod + "heap", mod + "spill", mod + "decoding"}, 0},
		{"decoding", []string{"fmt", "github.com/jackc/pglogrepl"}, 1}, // another module, reached through anything
		{"decoding", []string{"net/netip"}, 1},
		{"spill", []string{"crypto/tls", "net"}, 2},
		{"heap", []string{mod + "decoding"}, 1},             // the leaves import nothing of ours
		{"reorderbuffer", []string{mod + "replication"}, 1}, // nothing above
		{"reorderbuffer", []string{mod + "internal/knobs"}, 1},
		{"reorderbuffer", []string{mod + "internal/tools/capture"}, 1},
	}
	for _, tt := range tests {
		p := maps.Clone(pkgs)
		p[mod+tt.pkg] = pkgInfo{deps: tt.deps}
		require.Len(t, coreViolations(tt.pkg, p), tt.want, "%s -> %v", tt.pkg, tt.deps)
	}
	require.Len(t, coreViolations("nosuch", pkgs), 1)
}

func TestImportsPointDown(t *testing.T) {
	pkgs := list(t)
	for pkg, ok := range allowed {
		info, found := pkgs[mod+pkg]
		require.True(t, found, "package %s not found", pkg)
		for _, imp := range info.imports {
			if own, isOwn := strings.CutPrefix(imp, mod); isOwn {
				require.Contains(t, ok, own, "%s must not import %s", pkg, imp)
			}
		}
	}
}

// TestEveryPackageHasItsPlace: each library package of the module is in core or allowed.
func TestEveryPackageHasItsPlace(t *testing.T) {
	for path := range list(t) {
		pkg, isOwn := strings.CutPrefix(path, mod)
		if path == strings.TrimSuffix(mod, "/") {
			pkg, isOwn = "", true
		}
		if !isOwn || unrestricted(pkg) {
			continue
		}
		_, isCore := core[pkg]
		_, isAllowed := allowed[pkg]
		if !isCore && !isAllowed {
			t.Errorf("package %s has no place in the layering: add it to core or allowed", pkg)
		}
	}
}

// pgx is the module path of the PostgreSQL driver.
const pgx = "github.com/jackc/pgx/v5"

// serverPackage reports whether an import path is a package of the driver that talks to a
// server (its connections, configuration, protocol, pools), not one that only encodes values
// (pgtype).
func serverPackage(imp string) bool {
	if imp == pgx {
		return true
	}
	for _, p := range []string{pgx + "/pgconn", pgx + "/pgproto3", pgx + "/pgxpool", pgx + "/stdlib"} {
		if imp == p || strings.HasPrefix(imp, p+"/") {
			return true
		}
	}
	return false
}

// connectors are the functions that open a connection to a server, by package.
var connectors = map[string][]string{
	pgx + "/pgconn":  {"Connect", "ConnectConfig", "ConnectWithOptions"},
	pgx:              {"Connect", "ConnectConfig", "ConnectWithOptions"},
	pgx + "/pgxpool": {"New", "NewWithConfig"},
	pgx + "/stdlib":  {"OpenDB", "OpenDBFromPool", "RegisterConnConfig"},
}

// talks lists the library packages, besides internal/pgsession, that may import the driver's
// server packages or net, and what for; none of them opens a connection.
var talks = map[string]string{
	"internal/retry":        "the errors of the driver and of the network, classified (*pgconn.PgError, net.Error)",
	"replication":           "the walsender protocol on the connection pgsession opens, read from the socket itself (net)",
	"snapshot":              "statements on the connections pgsession opens, and a *pgconn.Config in its Config",
	"catalog":               "statements on the connection pgsession opens, and a *pgconn.Config in its Config",
	"changefeed":            "the TableStore's pgx configuration and transactions",
	"apply":                 "*pgconn.Config in its Config, and the server's errors it reports",
	"apply/internal/target": "statements, batches and COPY on the connections pgsession opens",
	"apply/internal/engine": "the server's errors that concurrency causes (deadlocks, serialization failures), classified",
	"apply/internal/detect": "statements on the target connections",
}

// mayOpen reports whether a package of the module may open connections itself: pgsession, for
// the library; the tools and test machinery (throwaway servers and brokers); and the programs
// above the layering (commands, examples, benchmarks).
func mayOpen(pkg string) bool {
	return pkg == "internal/pgsession" || strings.HasPrefix(pkg, "internal/tools/") ||
		strings.HasPrefix(pkg, "internal/testing/") || unrestricted(pkg)
}

// serverImportViolations returns what is wrong with the imports of package pkg: a server package
// of the driver where pkg neither may open connections nor is in talks, net where it is in
// neither and is not metrics (which listens for scrapes), pglogrepl anywhere.
func serverImportViolations(pkg string, imports []string) []string {
	_, talking := talks[pkg]
	var bad []string
	for _, imp := range imports {
		switch {
		case strings.HasPrefix(imp, "github.com/jackc/pglogrepl"):
			bad = append(bad, fmt.Sprintf("%s imports pglogrepl: only tests use it, as an independent decoder", pkg))
		case mayOpen(pkg) || talking:
		case serverPackage(imp):
			bad = append(bad, fmt.Sprintf("%s imports %s: it may not talk to a server", pkg, imp))
		case imp == "net" && pkg != "metrics":
			bad = append(bad, fmt.Sprintf("%s imports net: it may not talk to the network", pkg))
		}
	}
	return bad
}

// connectCalls returns the calls of f (and the function values it takes) that open a connection
// to a server, as "pkg.Func".
func connectCalls(f *ast.File) []string {
	local := map[string]string{} // the file's name of a package -> its path
	for _, imp := range f.Imports {
		path := strings.Trim(imp.Path.Value, `"`)
		if _, ok := connectors[path]; !ok {
			continue
		}
		name := filepath.Base(path)
		if path == pgx {
			name = "pgx"
		}
		if imp.Name != nil {
			name = imp.Name.Name
		}
		local[name] = path
	}
	var found []string
	ast.Inspect(f, func(n ast.Node) bool {
		sel, ok := n.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		if id, ok := sel.X.(*ast.Ident); ok && slices.Contains(connectors[local[id.Name]], sel.Sel.Name) {
			found = append(found, id.Name+"."+sel.Sel.Name)
		}
		return true
	})
	return found
}

// TestOnlyPgsessionConnectsToPostgres: the library opens its connections to PostgreSQL in one
// place, internal/pgsession, which pins the session settings, prepares every attempt the same
// way and keeps passwords out of errors. The packages that still need the driver's types (a
// *pgconn.Config in a configuration, statements on a connection pgsession opened, the walsender
// protocol) are listed in talks, with what for; nothing else imports the driver's server
// packages or net (but metrics, which listens for scrapes), and nothing but pgsession, the tools
// and test machinery and the programs calls a function that connects.
func TestOnlyPgsessionConnectsToPostgres(t *testing.T) {
	pkgs := list(t)
	require.Contains(t, pkgs, mod+"internal/pgsession")
	for path, info := range pkgs {
		pkg, isOwn := strings.CutPrefix(path, mod)
		if !isOwn {
			continue
		}
		for _, v := range serverImportViolations(pkg, info.imports) {
			t.Error(v)
		}
	}
	for talker := range talks {
		require.Contains(t, pkgs, mod+talker, "talks names a package that does not exist")
	}
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}|{{.Dir}}|{{join .GoFiles " "}}`, mod+"...").Output()
	require.NoError(t, err)
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "|")
		require.Len(t, f, 3, line)
		pkg := strings.TrimPrefix(strings.TrimPrefix(f[0], strings.TrimSuffix(mod, "/")), "/")
		if mayOpen(pkg) {
			continue
		}
		for _, name := range strings.Fields(f[2]) {
			file, err := parser.ParseFile(token.NewFileSet(), filepath.Join(f[1], name), nil, 0)
			require.NoError(t, err)
			checked++
			for _, c := range connectCalls(file) {
				t.Errorf("%s/%s calls %s: only internal/pgsession opens connections", pkg, name, c)
			}
		}
	}
	require.Positive(t, checked)
}

// TestConnectViolations checks that the checks above fail where they must.
func TestConnectViolations(t *testing.T) {
	for _, tt := range []struct {
		pkg     string
		imports []string
		want    int
	}{
		{"internal/pgsession", []string{pgx, pgx + "/pgconn", pgx + "/pgconn/ctxwatch"}, 0},
		{"replication", []string{pgx + "/pgconn", pgx + "/pgproto3", "net"}, 0},
		{"metrics", []string{"net"}, 0},
		{"format", []string{pgx + "/pgtype"}, 0},
		{"internal/testing/kafkatest", []string{"net"}, 0},
		{"cmd/pgreorder", []string{pgx}, 0},
		{"format", []string{pgx + "/pgconn"}, 1},
		{"reorderbuffer", []string{pgx + "/pgxpool", "net"}, 2},
		{"metrics", []string{pgx}, 1},
		{"decoding", []string{"github.com/jackc/pglogrepl"}, 1},
		{"internal/tools/pgserver", []string{"github.com/jackc/pglogrepl"}, 1},
	} {
		require.Len(t, serverImportViolations(tt.pkg, tt.imports), tt.want, "%s imports %v", tt.pkg, tt.imports)
	}
	for src, want := range map[string][]string{
		`package p; import "github.com/jackc/pgx/v5/pgconn"; var _, _ = pgconn.Connect, pgconn.ConnectError{}`: {"pgconn.Connect"},
		`package p; import pg "github.com/jackc/pgx/v5"; func f() { pg.ConnectConfig(nil, nil) }`:              {"pg.ConnectConfig"},
		`package p; import "github.com/jackc/pgx/v5/pgxpool"; var _ = pgxpool.NewWithConfig`:                   {"pgxpool.NewWithConfig"},
		`package p; import "github.com/jackc/pgx/v5/pgconn"; var _ = pgconn.ParseConfig`:                       nil,
		`package p; type x struct{ Connect int }; var pgconn x; var _ = pgconn.Connect`:                        nil,
	} {
		file, err := parser.ParseFile(token.NewFileSet(), "p.go", src, 0)
		require.NoError(t, err)
		require.Equal(t, want, connectCalls(file), src)
	}
}

// TestOnlyReplicationSpeaksTheReplicationProtocol: the walsender's commands appear in package
// replication only (and in tests); everyone else goes through its API.
func TestOnlyReplicationSpeaksTheReplicationProtocol(t *testing.T) {
	commands := []string{"START_REPLICATION", "CREATE_REPLICATION_SLOT", "IDENTIFY_SYSTEM", "TIMELINE_HISTORY",
		"READ_REPLICATION_SLOT", "BASE_BACKUP"}
	var files []string
	for _, pattern := range []string{"*/*.go", "*/*/*.go", "*/*/*/*.go"} {
		more, err := filepath.Glob(filepath.Join(root, pattern))
		require.NoError(t, err)
		files = append(files, more...)
	}
	checked := 0
	for _, f := range files {
		rel, err := filepath.Rel(root, f)
		require.NoError(t, err)
		if strings.HasSuffix(f, "_test.go") || strings.HasPrefix(rel, "replication"+string(filepath.Separator)) {
			continue
		}
		file, err := parser.ParseFile(token.NewFileSet(), f, nil, 0)
		require.NoError(t, err)
		checked++
		ast.Inspect(file, func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				for _, c := range commands {
					if strings.Contains(lit.Value, c) {
						t.Errorf("%s sends %s: only package replication speaks the replication protocol", rel, c)
					}
				}
			}
			return true
		})
	}
	require.Positive(t, checked)
}

// TestCoreHasNoGoroutinesOrClock: the reorder buffer, and apply's decision core, are driven by
// calls, like etcd's raft RawNode, so that they are deterministic under test.
func TestCoreHasNoGoroutinesOrClock(t *testing.T) {
	for _, dir := range []string{"reorderbuffer", "decoding", "heap", "apply/internal/plan"} {
		files, err := filepath.Glob(filepath.Join(root, dir, "*.go"))
		require.NoError(t, err)
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			file, err := parser.ParseFile(token.NewFileSet(), f, nil, 0)
			require.NoError(t, err)
			for _, imp := range file.Imports {
				if p := strings.Trim(imp.Path.Value, `"`); dir == "apply/internal/plan" && (p == "context" || p == "sync" || network(p)) {
					t.Errorf("%s imports %s: the decision core takes no context, locks nothing and opens no connection", f, p)
				}
			}
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
	var files []string
	for _, dir := range []string{"spill", "vfs"} {
		m, err := filepath.Glob(filepath.Join(root, dir, "*.go"))
		require.NoError(t, err)
		require.NotEmpty(t, m, dir)
		files = append(files, m...)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(token.NewFileSet(), f, nil, 0)
		require.NoError(t, err)
		for _, decl := range file.Decls {
			// The one place a path is resolved: the FS opening (or making) the root directory.
			if fn, ok := decl.(*ast.FuncDecl); ok && (fn.Name.Name == "OpenDir" || fn.Name.Name == "MkdirAll") && receiver(fn) == "osFS" {
				continue
			}
			ast.Inspect(decl, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				if pkg, ok := sel.X.(*ast.Ident); ok && slices.Contains(byPath[pkg.Name], sel.Sel.Name) {
					t.Errorf("%s: %s.%s resolves a path; use a vfs.Dir", f, pkg.Name, sel.Sel.Name)
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

// prometheus is the module path prefix of the Prometheus client library and its dependencies.
const prometheus = "github.com/prometheus/"

// prometheusViolations returns the packages of this module, other than metrics, that import the
// Prometheus client directly, and the library packages below metrics (core and allowed) that
// depend on it at all.
func prometheusViolations(pkgs map[string]pkgInfo) []string {
	var bad []string
	for path, info := range pkgs {
		pkg, isOwn := strings.CutPrefix(path, mod)
		if !isOwn || pkg == "metrics" {
			continue
		}
		for _, imp := range info.imports {
			if strings.HasPrefix(imp, prometheus) {
				bad = append(bad, fmt.Sprintf("%s imports %s: only metrics may", pkg, imp))
			}
		}
		_, inCore := core[pkg]
		_, layered := allowed[pkg]
		if !inCore && !layered {
			continue
		}
		for _, dep := range info.deps {
			if strings.HasPrefix(dep, prometheus) {
				bad = append(bad, fmt.Sprintf("%s depends on %s", pkg, dep))
				break
			}
		}
	}
	slices.Sort(bad)
	return bad
}

// TestOnlyMetricsImportsPrometheus: the Prometheus client is a dependency of package metrics
// alone; the commands use it through metrics, and nothing below metrics links it.
func TestOnlyMetricsImportsPrometheus(t *testing.T) {
	pkgs := list(t)
	require.Contains(t, pkgs, mod+"metrics")
	for _, v := range prometheusViolations(pkgs) {
		t.Error(v)
	}
}

// TestPrometheusViolations checks that the check above fails where it must.
func TestPrometheusViolations(t *testing.T) {
	client := prometheus + "client_golang/prometheus"
	tests := []struct {
		pkg           string
		imports, deps []string
		want          int
	}{
		{"metrics", []string{client}, []string{client}, 0},
		{"cmd/pgreorder", []string{mod + "metrics"}, []string{mod + "metrics", client}, 0}, // through metrics: fine
		{"cmd/pgreorder", []string{client}, []string{client}, 1},
		{"replication", nil, []string{client}, 1},                // reached through something else
		{"reorderbuffer", []string{client}, []string{client}, 2}, // imported, and so a dependency
		{"replication", []string{"fmt"}, []string{"fmt"}, 0},
	}
	for _, tt := range tests {
		pkgs := map[string]pkgInfo{mod + tt.pkg: {imports: tt.imports, deps: tt.deps}}
		require.Len(t, prometheusViolations(pkgs), tt.want, "%s imports %v, deps %v", tt.pkg, tt.imports, tt.deps)
	}
}

// TestPublicPackagesHaveDocAndExample: every library package a user can import (not under an
// internal directory) states its contract in a package doc comment and has a runnable Example.
func TestPublicPackagesHaveDocAndExample(t *testing.T) {
	pkgs := slices.Sorted(maps.Keys(allowed))
	pkgs = append(pkgs, slices.Sorted(maps.Keys(core))...)
	for _, pkg := range pkgs {
		if strings.HasPrefix(pkg, "internal/") || strings.Contains(pkg, "/internal/") {
			continue
		}
		files, err := filepath.Glob(filepath.Join(root, filepath.FromSlash(pkg), "*.go"))
		require.NoError(t, err)
		require.NotEmpty(t, files, "package %s", pkg)
		var doc, example bool
		fset := token.NewFileSet()
		for _, name := range files {
			f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
			require.NoError(t, err)
			if !strings.HasSuffix(name, "_test.go") {
				doc = doc || (f.Doc != nil && strings.TrimSpace(f.Doc.Text()) != "")
				continue
			}
			for _, d := range f.Decls {
				if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && strings.HasPrefix(fd.Name.Name, "Example") {
					example = true
				}
			}
		}
		if !doc {
			t.Errorf("package %s has no package doc comment stating its contract", pkg)
		}
		if !example {
			t.Errorf("package %s has no Example test", pkg)
		}
	}
}
