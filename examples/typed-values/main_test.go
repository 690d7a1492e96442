package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestShort: the whole consumer fits in 40 lines.
func TestShort(t *testing.T) {
	b, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n > 40 {
		t.Errorf("main.go has %d lines, want at most 40", n)
	}
}

// TestPrints builds the command, runs it against a server and checks what it prints for an
// insert, an update that leaves a TOASTed value alone, a delete and a truncate.
func TestPrints(t *testing.T) {
	majors := pgtest.Majors(t)
	srv := pgtest.Shared(t, majors[len(majors)-1])
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db := pgtest.NewDatabase(t, srv)
	if err := pgtest.Exec(ctx, srv.ConnString(db),
		`CREATE TYPE mood AS ENUM ('sad', 'happy')`,
		`CREATE TABLE t (id int PRIMARY KEY, n numeric, at timestamptz, m mood, big text)`,
		`ALTER TABLE t ALTER big SET STORAGE EXTERNAL`,
		`CREATE PUBLICATION pub FOR TABLE t`); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "typed-values")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := exec.CommandContext(ctx, bin, srv.ConnString(db), "typed", "pub")
	cmd.Stderr = os.Stderr
	cmd.Env = append(os.Environ(), "TZ=UTC") // timestamptz values decode in the local zone
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	if !pgtest.Until(ctx, func() bool {
		err = pgtest.Exec(ctx, srv.ConnString(db),
			`SELECT 1 / count(*)::int FROM pg_replication_slots WHERE slot_name = 'typed' AND active`)
		return err == nil
	}) {
		t.Fatalf("the slot never became active: %v", err)
	}
	if err := pgtest.Exec(ctx, srv.ConnString(db),
		`INSERT INTO t VALUES (1, 12.5, '2026-11-29 12:00:00+00', 'happy', repeat('x', 5000))`,
		`UPDATE t SET n = NULL WHERE id = 1`,
		`DELETE FROM t WHERE id = 1`,
		`TRUNCATE t`); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"Insert public.t",
		"  new id int4 = int32 1 <nil>",
		"  new n numeric = pgtype.Numeric {125 -1 false finite true} <nil>",
		"  new at timestamptz = time.Time 2026-11-29 12:00:00 +0000 UTC <nil>",
		"  new m mood = string happy <nil>", // text values: in binary, an enum is a []byte
		"Update public.t",
		"  new n numeric = <nil> <nil> <nil>",
		"  new big text = <nil> <nil> pgvalue: unchanged TOASTed value was not sent",
		"Delete public.t",
		"  old id int4 = int32 1 <nil>",
		"Truncate public.t",
	}
	sc := bufio.NewScanner(stdout)
	var got []string
	for len(want) > 0 && sc.Scan() {
		line := sc.Text()
		got = append(got, line)
		if line == want[0] {
			want = want[1:]
		}
	}
	if len(want) > 0 {
		t.Fatalf("missing %q in the output:\n%s", want[0], strings.Join(got, "\n"))
	}
}
