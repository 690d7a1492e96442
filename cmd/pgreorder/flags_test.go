package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/apply"
	"github.com/pgreorder/pgreorder/apply/conflict"
	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/internal/configerr"
	"github.com/pgreorder/pgreorder/kafkasink"
	"github.com/pgreorder/pgreorder/replication"
	"github.com/pgreorder/pgreorder/snapshot"
)

// configTypes are the configurations whose fields the libraries name in errors, by package.
var configTypes = map[string]reflect.Type{
	"apply":       reflect.TypeFor[apply.Config](),
	"replication": reflect.TypeFor[replication.Config](),
	"snapshot":    reflect.TypeFor[snapshot.Config](),
	"changefeed":  reflect.TypeFor[changefeed.Config](),
	"kafkasink":   reflect.TypeFor[kafkasink.Config](),
}

// libraryFieldDirs are the packages that name configuration fields in their errors, with the
// package whose Config their field("X") calls name.
var libraryFieldDirs = map[string]string{
	"apply": "apply", "apply/internal/target": "apply", "replication": "replication", "snapshot": "snapshot",
	"changefeed": "changefeed", "kafkasink": "kafkasink",
}

// namedFields reads the library sources and returns the keys (package.Path) of every field
// their errors name: calls field("Path") and configerr.Field{Config: ..., Path: ...} literals,
// whose names must be constants so that they can be checked here.
func namedFields(t *testing.T) map[string][]string {
	t.Helper()
	keys := map[string][]string{}
	fset := token.NewFileSet()
	str := func(e ast.Expr) (string, bool) {
		lit, ok := e.(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING {
			return "", false
		}
		s, err := strconv.Unquote(lit.Value)
		return s, err == nil
	}
	for dir, cfgPkg := range libraryFieldDirs {
		files, err := filepath.Glob(filepath.Join("..", "..", dir, "*.go"))
		require.NoError(t, err)
		for _, name := range files {
			if strings.HasSuffix(name, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, name, nil, 0)
			require.NoError(t, err)
			for _, decl := range f.Decls {
				fd, isFunc := decl.(*ast.FuncDecl)
				if isFunc && fd.Name.Name == "field" && fd.Recv == nil {
					continue // the helper itself
				}
				ast.Inspect(decl, func(n ast.Node) bool {
					switch n := n.(type) {
					case *ast.CallExpr:
						if id, ok := n.Fun.(*ast.Ident); ok && id.Name == "field" && len(n.Args) == 1 {
							path, ok := str(n.Args[0])
							require.True(t, ok, "%s: field(...) of a name that is not a constant", fset.Position(n.Pos()))
							keys[cfgPkg+"."+path] = append(keys[cfgPkg+"."+path], fset.Position(n.Pos()).String())
						}
					case *ast.CompositeLit:
						if !isFieldType(n.Type) {
							return true
						}
						var cfg, path string
						for _, el := range n.Elts {
							kv, ok := el.(*ast.KeyValueExpr)
							if !ok {
								continue
							}
							switch kv.Key.(*ast.Ident).Name {
							case "Config":
								cfg, ok = str(kv.Value)
								require.True(t, ok, "%s: a Field's Config is not a constant", fset.Position(n.Pos()))
							case "Path":
								path, ok = str(kv.Value)
								require.True(t, ok, "%s: a Field's Path is not a constant", fset.Position(n.Pos()))
							}
						}
						require.True(t, cfg != "" && path != "", "%s: a Field without Config or Path", fset.Position(n.Pos()))
						keys[cfg+"."+path] = append(keys[cfg+"."+path], fset.Position(n.Pos()).String())
					}
					return true
				})
			}
		}
	}
	return keys
}

// isFieldType says whether e is configerr.Field or a package's alias of it (Field).
func isFieldType(e ast.Expr) bool {
	switch e := e.(type) {
	case *ast.SelectorExpr:
		x, ok := e.X.(*ast.Ident)
		return ok && x.Name == "configerr" && e.Sel.Name == "Field"
	case *ast.Ident:
		return e.Name == "Field"
	}
	return false
}

// fieldExists says whether path names a field of t, through nested structs.
func fieldExists(t reflect.Type, path string) bool {
	for part := range strings.SplitSeq(path, ".") {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct {
			return false
		}
		f, ok := t.FieldByName(part)
		if !ok || !f.IsExported() {
			return false
		}
		t = f.Type
	}
	return true
}

// TestConfigErrorFieldsHaveFlags: every field of a configuration that a library's error can name
// has its entry in fieldFlags (a flag, or "" where no flag sets it), every entry names a field
// that exists, and every flag there is one a command has. A field renamed in a library, or a new
// one named in an error, fails here instead of reaching users under its Go name.
func TestConfigErrorFieldsHaveFlags(t *testing.T) {
	named := namedFields(t)
	require.NotEmpty(t, named)
	for _, k := range []string{"apply.Workers", "apply.Conflicts.Off", "replication.CreateSlot", "kafkasink.Brokers", "changefeed.Replication.Slot"} {
		require.Contains(t, named, k, "the scan finds the fields the libraries name")
	}
	for key, where := range named {
		_, ok := fieldFlags[key]
		require.True(t, ok, "%s, named in an error at %s, is not in fieldFlags: give its flag, or \"\" if no flag sets it", key, where)
	}
	flags := map[string]bool{}
	for _, register := range commandFlags {
		fs := flag.NewFlagSet("", flag.ContinueOnError)
		register(fs)
		fs.VisitAll(func(f *flag.Flag) { flags["-"+f.Name] = true })
	}
	for key, fl := range fieldFlags {
		pkg, path, _ := strings.Cut(key, ".")
		if pkg != "pgoutput" {
			typ, ok := configTypes[pkg]
			require.True(t, ok, "%s: no Config of package %s", key, pkg)
			require.True(t, fieldExists(typ, path), "%s: %s.Config has no field %s", key, pkg, path)
		}
		if fl != "" {
			require.True(t, flags[fl], "%s maps to %s, which no command has", key, fl)
		}
	}
}

// TestUsageGroups: every flag of apply, stream and kafka is shown in exactly one section of its
// usage, and every flag a section lists exists.
func TestUsageGroups(t *testing.T) {
	for name, groups := range map[string][]flagGroup{"apply": applyGroups, "stream": streamGroups, "kafka": kafkaGroups} {
		fs := flag.NewFlagSet(name, flag.ContinueOnError)
		commandFlags[name](fs)
		seen := map[string]string{}
		for _, g := range groups {
			for _, f := range g.flags {
				require.NotNil(t, fs.Lookup(f), "%s: section %q lists -%s, which the command does not have", name, g.title, f)
				require.NotContains(t, seen, f, "%s: -%s is in sections %q and %q", name, f, seen[f], g.title)
				seen[f] = g.title
			}
		}
		fs.VisitAll(func(f *flag.Flag) {
			require.Contains(t, seen, f.Name, "%s: -%s is in no section of the usage", name, f.Name)
		})
		var b bytes.Buffer
		printFlags(&b, fs, groups)
		require.NotContains(t, b.String(), "\nother:", name)
		require.Equal(t, len(seen), strings.Count(b.String(), "\n  -"), "%s: each flag printed once", name)
	}
}

// TestHelpGrouped: apply -h shows the connection flags first, then the sections in order, each
// flag with its default as flag.PrintDefaults shows it.
func TestHelpGrouped(t *testing.T) {
	out, errOut, code := runCLI(t, "apply", "-h")
	require.Equal(t, 0, code, errOut)
	var at []int
	for _, g := range applyGroups {
		i := strings.Index(out, "\n"+g.title+":\n")
		require.GreaterOrEqual(t, i, 0, "section %q", g.title)
		at = append(at, i)
	}
	require.True(t, slices.IsSorted(at), "sections in order")
	require.Less(t, strings.Index(out, "\n  -source DSN\n"), strings.Index(out, "\n  -work-mem string\n"))
	require.Contains(t, out, "(default \"64MB\")")
	require.Contains(t, out, "(default 1m30s)", "a default of a flag.Value of our own")
	require.Contains(t, out, "  -dsn DSN\n    \tdeprecated: the old name of -source")
	for _, cmd := range []string{"stream", "kafka"} {
		out, errOut, code := runCLI(t, cmd, "-h")
		require.Equal(t, 0, code, errOut)
		require.Contains(t, out, "\nconnection:\n  -source DSN\n", cmd)
	}
}

// TestDeprecatedFlagAlias: -dsn still sets the source's connection string, in every command
// that had it, and says once on stderr that it is going.
func TestDeprecatedFlagAlias(t *testing.T) {
	var notices bytes.Buffer
	old := deprecationOutput
	deprecationOutput = &notices
	defer func() { deprecationOutput = old }()
	for _, name := range []string{"apply", "stream", "kafka"} {
		notices.Reset()
		fs := flag.NewFlagSet(name, flag.ContinueOnError)
		commandFlags[name](fs)
		require.NoError(t, parseFlags(fs, []string{"-dsn", "host=/x dbname=src"}))
		require.Equal(t, "host=/x dbname=src", fs.Lookup("source").Value.String(), name)
		require.Equal(t, "pgreorder "+name+": -dsn is deprecated and will be removed: use -source\n", notices.String())
	}
	var f recordFlags
	fs := flag.NewFlagSet("record", flag.ContinueOnError)
	sourceVar(fs, &f.dsn, "")
	require.NoError(t, parseFlags(fs, []string{"-dsn", "x"}))
	require.Equal(t, "x", f.dsn)
}

// TestConfigErrorsNameFlags: the libraries' configuration errors, and the hints of their other
// errors, name the command's flags once explained, through their types: the same errors read
// as Go code elsewhere.
func TestConfigErrorsNameFlags(t *testing.T) {
	base := apply.Config{Source: replication.Config{ConnString: "host=/x", Slot: "s", Publications: []string{"p"}}, Target: "host=/y"}
	for _, c := range []struct {
		cfg        func(*apply.Config)
		lib, shown string
	}{
		{func(c *apply.Config) { c.Conflicts = conflict.Config{Off: true, Retention: time.Minute} },
			"Conflicts.Retention needs detection, which Conflicts.Off turns off", "-conflict-retention needs detection, which -no-conflict-detection turns off"},
		{func(c *apply.Config) { c.Workers = 100 }, "Workers 100 (want", "-workers 100 (want"},
		{func(c *apply.Config) { c.CommitOrder = apply.CommitRelaxed },
			"CommitOrder relaxed needs Mode = Parallel", "-commit-order relaxed needs -mode parallel"},
		{func(c *apply.Config) { c.Source.ConnString = "" }, "Source.ConnString is required", "-source is required"},
		{func(c *apply.Config) { c.Conflicts.MaxLoggedValue = -1 }, "Conflicts.MaxLoggedValue -1", "Conflicts.MaxLoggedValue -1"},
	} {
		cfg := base
		c.cfg(&cfg)
		_, err := apply.New(cfg)
		require.ErrorIs(t, err, apply.ErrInvalidConfig)
		var ce *apply.ConfigError
		require.True(t, errors.As(err, &ce), "%v", err)
		require.Contains(t, err.Error(), c.lib)
		require.Contains(t, explain("apply", err), c.shown)
	}

	_, err := kafkasink.Open(kafkasink.Config{})
	require.ErrorIs(t, err, kafkasink.ErrInvalidConfig)
	require.Contains(t, err.Error(), "Brokers is required")
	require.Contains(t, explain("kafka", err), "-kafka-brokers is required")
	_, err = kafkasink.Open(kafkasink.Config{Brokers: []string{"x:1"}, TopicPrefix: "a/b"})
	require.Contains(t, explain("kafka", err), "-kafka-topic-prefix is not valid")

	// A field of a library's Config that this command does not set keeps its Go name.
	store, err := changefeed.OpenFile(filepath.Join(t.TempDir(), "pos"))
	require.NoError(t, err)
	defer store.Close()
	_, err = changefeed.New(changefeed.Config{Replication: replication.Config{Slot: "s", TemporarySlot: true}}, store,
		func(context.Context, *changefeed.Batch) error { return nil })
	require.ErrorIs(t, err, changefeed.ErrInvalidConfig)
	require.Contains(t, explain("kafka", err), "Replication.TemporarySlot is set")

	// The replication's own fields are named by the flags of the commands that have them.
	_, err = (&replication.Config{Slot: "s", Publications: []string{"p"}, Failover: true, TemporarySlot: true}).Negotiate(17)
	require.ErrorIs(t, err, replication.ErrInvalidConfig)
	require.Contains(t, err.Error(), "Failover is set, and so is TemporarySlot")
	require.Contains(t, explain("stream", err), "-failover is set, and so is -temporary")
	require.Contains(t, explain("kafka", err), "-failover is set, and so is Config.TemporarySlot")

	// A boolean flag's false value is written as the command line takes it.
	hint := configerr.WithHint(errors.New("blocked"), "; ", "or set %s",
		configerr.Field{Config: "apply", Path: "NewTables", Value: "changefeed.NewTablesStream", Arg: "false"})
	require.Contains(t, hint.Error(), "or set Config.NewTables = changefeed.NewTablesStream")
	require.Contains(t, explain("apply", hint), "or set -copy-new-tables=false")
}

// TestNoRegexpInErrorPath: the command's own code maps errors by their types, not their words.
func TestNoRegexpInErrorPath(t *testing.T) {
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		b, err := os.ReadFile(name)
		require.NoError(t, err)
		require.NotContains(t, string(b), `"regexp"`, name)
	}
}
