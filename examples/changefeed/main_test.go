package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestShort: the whole consumer fits in 60 lines.
func TestShort(t *testing.T) {
	b, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n > 60 {
		t.Errorf("main.go has %d lines, want at most 60", n)
	}
}

// TestCopyStreamResume builds the command and runs it against PostgreSQL 15 and 18: the rows
// there before it started are printed as snapshot rows with their Go types (an enum as a string:
// text values), the changes after as transactions; its metrics are served; killed and started
// again, it prints only what followed, without copying again.
func TestCopyStreamResume(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "changefeed")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ran := false
	for _, major := range pgtest.Majors(t) {
		if major != 15 && major != 18 {
			continue
		}
		ran = true
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) { run(t, pgtest.Shared(t, major), bin) })
	}
	if !ran {
		pgtest.Unavailable(t, "neither PostgreSQL 15 nor 18 is installed")
	}
}

func run(t *testing.T, srv *pgtest.Server, bin string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db := pgtest.NewDatabase(t, srv)
	dsn := srv.ConnString(db)
	exec1 := func(sql ...string) {
		t.Helper()
		if err := pgtest.Exec(ctx, dsn, sql...); err != nil {
			t.Fatal(err)
		}
	}
	exec1(`CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')`,
		`CREATE TABLE t (id int PRIMARY KEY, m mood, n numeric, big text)`,
		`ALTER TABLE t ALTER big SET STORAGE EXTERNAL`,
		`INSERT INTO t VALUES (1, 'ok', 1.5, 'a'), (2, 'sad', NULL, 'b')`,
		`CREATE TABLE u (id bigint PRIMARY KEY)`, `INSERT INTO u VALUES (7)`,
		`CREATE PUBLICATION pub FOR TABLE t, u`)
	dir := t.TempDir()
	start := func() (lines chan string, metricsURL string, stop func()) {
		cmd := exec.CommandContext(ctx, bin, dsn, "cf", "pub")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "METRICS_PORT=0") // any free port
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		stderr, err := cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := regexp.MustCompile(`metrics on (http://\S+)`).FindStringSubmatch(sc.Text()); m != nil {
				metricsURL = m[1]
				break
			}
			t.Log(sc.Text())
		}
		go io.Copy(os.Stderr, stderr)
		lines = make(chan string, 100)
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				lines <- sc.Text()
			}
			close(lines)
		}()
		return lines, metricsURL, func() { cmd.Process.Kill(); cmd.Wait() }
	}
	expect := func(lines chan string, want ...string) {
		t.Helper()
		var got []string
		for len(got) < len(want) {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("the command ended; got %q, want %q", got, want)
				}
				got = append(got, l)
			case <-time.After(30 * time.Second):
				t.Fatalf("got %q, want %q", got, want)
			}
		}
		if strings.HasPrefix(want[0], "snapshot") { // copied in parallel: in any order
			slices.Sort(got)
			slices.Sort(want)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	}

	lines, url, stop := start()
	defer func() { stop() }()
	expect(lines,
		"snapshot Insert public.t id=int32(1) m=string(ok) n=pgtype.Numeric({15 -1 false finite true}) big=string(a)",
		"snapshot Insert public.t id=int32(2) m=string(sad) n=<nil>(<nil>) big=string(b)",
		"snapshot Insert public.u id=int64(7)")
	exec1(`INSERT INTO t VALUES (3, 'happy', 2, repeat('x', 5000))`,
		`UPDATE t SET n = 3 WHERE id = 3`) // big is TOASTed and unchanged: not sent, not printed
	before := lsn(ctx, t, dsn)
	exec1(`DELETE FROM t WHERE id = 1`)
	expect(lines,
		"transaction Insert public.t id=int32(3) m=string(happy) n=pgtype.Numeric({2 0 false finite true}) big=string("+strings.Repeat("x", 5000)+")",
		"transaction Update public.t id=int32(3) m=string(happy) n=pgtype.Numeric({3 0 false finite true})",
		"transaction Delete public.t id=int32(1)")

	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), "pgreorder_lag_bytes") {
		t.Fatalf("metrics: %s\n%s", resp.Status, body)
	}

	// Killed once the delete's position is stored (a kill before would print it again).
	for {
		s, err := changefeed.OpenFile(filepath.Join(dir, "cf.pos"))
		if err != nil {
			t.Fatal(err)
		}
		pos, _, err := s.Load(ctx, "cf")
		s.Close()
		if err != nil {
			t.Fatal(err)
		}
		if pos.EndLSN > before {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the position stays at %s", pos.EndLSN)
		case <-time.After(10 * time.Millisecond):
		}
	}
	stop()
	exec1(`INSERT INTO u VALUES (8)`, `TRUNCATE u`)
	lines, _, stop = start()
	expect(lines, "transaction Insert public.u id=int64(8)", "transaction Truncate public.u")
}

// lsn returns the server's current WAL insert position.
func lsn(ctx context.Context, t *testing.T, dsn string) decoding.LSN {
	t.Helper()
	conn := pgtest.Connect(t, dsn)
	defer conn.Close(ctx)
	res := pgtest.MustExec(t, conn, "SELECT pg_current_wal_insert_lsn()")
	l, err := decoding.ParseLSN(string(res[0].Rows[0][0]))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestREADME: the program the README shows is this one (its lines, in order, with the metrics
// left out).
func TestREADME(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	main, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	text := string(readme)
	i := strings.Index(text, "store, err := changefeed.OpenFile")
	j := strings.Index(text, "check(feed.Run(")
	if i < 0 || j < i {
		t.Fatal("the README does not show the program")
	}
	rest := string(main)
	for _, l := range strings.Split(text[i:j], "\n") {
		l = strings.TrimSpace(l)
		k := strings.Index(rest, l)
		if k < 0 {
			t.Fatalf("README line %q is not in main.go (in this order)", l)
		}
		rest = rest[k+len(l):]
	}
}
