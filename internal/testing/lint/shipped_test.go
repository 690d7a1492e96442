package lint_test

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The folders of internal say what their packages are for: internal/testing holds test
// machinery (servers and databases for tests, these checks), internal/tools what the commands
// link besides the library (throwaway servers, the capture format), and the packages directly
// under internal are parts of the library itself.
const (
	testingDir = "internal/testing/"
	toolsDir   = "internal/tools/"
)

// TestShippedCodeLinksNoTestMachinery: what users run (the pgreorder command, the examples) and
// every library package are built without the testing package and without any package of
// internal/testing. Only internal/testing's own packages may link them; the commands start
// servers through internal/tools/pgserver.
func TestShippedCodeLinksNoTestMachinery(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}:{{join .Deps " "}}`, mod+"...").Output()
	require.NoError(t, err)
	checked := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, deps, _ := strings.Cut(line, ":")
		own := strings.TrimPrefix(pkg, mod)
		if strings.HasPrefix(own, testingDir) {
			continue
		}
		checked[own] = true
		for _, dep := range strings.Fields(deps) {
			if testMachinery(dep) {
				t.Errorf("%s links %s (go list -deps %s)", pkg, dep, pkg)
			}
		}
	}
	for _, pkg := range []string{"cmd/pgreorder", toolsDir + "pgserver", "reorderbuffer", "replication"} {
		require.True(t, checked[pkg], "package %s not listed", pkg)
	}
}

// testMachinery reports whether a package (an import path) is there for tests only.
func testMachinery(pkg string) bool {
	return pkg == "testing" || strings.HasPrefix(pkg, "testing/") || strings.HasPrefix(pkg, mod+testingDir)
}

// TestLibraryLinksNoTools: the library packages (all but the commands, the examples, the
// benchmarks and internal's tools and test machinery) do not link internal/tools.
func TestLibraryLinksNoTools(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}:{{join .Deps " "}}`, mod+"...").Output()
	require.NoError(t, err)
	libraries := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, deps, _ := strings.Cut(line, ":")
		own := strings.TrimPrefix(pkg, mod)
		if !library(own) {
			continue
		}
		libraries++
		for _, dep := range strings.Fields(deps) {
			if strings.HasPrefix(dep, mod+toolsDir) {
				t.Errorf("library package %s links the tool %s", pkg, dep)
			}
		}
	}
	require.Greater(t, libraries, 5)
}

// library reports whether a package of this module (a path relative to it) is library code.
func library(own string) bool {
	for _, prefix := range []string{"cmd/", "examples/", "bench", toolsDir, testingDir} {
		if strings.HasPrefix(own, prefix) {
			return false
		}
	}
	return true
}

func TestFolders(t *testing.T) {
	require.True(t, testMachinery("testing"))
	require.True(t, testMachinery(mod+testingDir+"pgtest"))
	require.False(t, testMachinery(mod+toolsDir+"pgserver"))
	require.False(t, testMachinery("testing-not"))
	require.True(t, library("replication"))
	require.True(t, library("internal/dirfile"))
	require.False(t, library(toolsDir+"capture"))
	require.False(t, library("cmd/pgreorder"))
}

// maxFileLines bounds the lines of a shipped Go file (the library's, the commands' and the
// examples'; the benchmarks and internal/tools aside): past it, a file holds more than one job
// and is to be split by job.
const maxFileLines = 1000

// TestFileSize: no shipped Go file is longer than maxFileLines.
func TestFileSize(t *testing.T) {
	files := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel == "bench" || rel == strings.TrimSuffix(toolsDir, "/") || rel == "testdata" ||
				strings.HasSuffix(rel, "/testdata") || strings.HasPrefix(d.Name(), ".") && rel != "." {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		files++
		if n := bytes.Count(b, []byte("\n")); n > maxFileLines {
			t.Errorf("%s has %d lines, more than %d: split it by job", rel, n, maxFileLines)
		}
		return nil
	})
	require.NoError(t, err)
	require.Greater(t, files, 100, "the walk found too few files")
}

// maxApplyLines bounds the lines of package apply's own Go files (tests aside): the public API
// and each session's setup. What applies the stream, schedules workers and talks to the target
// lives in apply's internal packages; apply growing past this means such work crept back in.
const maxApplyLines = 3500

// TestApplyPackageSize: package apply's shipped files hold at most maxApplyLines lines.
func TestApplyPackageSize(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(root, "apply", "*.go"))
	require.NoError(t, err)
	lines, n := 0, 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		lines += bytes.Count(b, []byte("\n"))
		n++
	}
	require.Greater(t, n, 10, "the glob found too few files")
	if lines > maxApplyLines {
		t.Errorf("package apply has %d lines in %d files, more than %d: move what is not its API or session setup into its internal packages",
			lines, n, maxApplyLines)
	}
}
