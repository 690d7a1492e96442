package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestCopyThenStream builds the command and runs it against PostgreSQL 15 and 18: the rows
// there are first, as reads; the changes made afterwards, as inserts, updates and deletes; a
// table added to the publication later, as reads of all its rows (also the one inserted just
// before the copy, which the stream sends too but the copy holds already) and then its changes.
func TestCopyThenStream(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "initial-copy")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ran := false
	for _, major := range pgtest.Majors(t) {
		if major != 15 && major != 18 {
			continue
		}
		ran = true
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			srv := pgtest.Shared(t, major)
			db := pgtest.NewDatabase(t, srv)
			cs := srv.ConnString(db)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			run := func(sql ...string) {
				t.Helper()
				if err := pgtest.Exec(ctx, cs, sql...); err != nil {
					t.Fatal(err)
				}
			}
			run(`CREATE TABLE t (id int PRIMARY KEY, v text)`, `INSERT INTO t VALUES (1, 'a'), (2, 'b'), (3, NULL)`,
				`CREATE TABLE t2 (id int PRIMARY KEY)`, `INSERT INTO t2 VALUES (1), (2)`,
				`CREATE PUBLICATION pub FOR TABLE t`)
			cmd := exec.CommandContext(ctx, bin, cs, "ic", "pub")
			cmd.Stderr = os.Stderr
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
			lines := make(chan string)
			go func() {
				sc := bufio.NewScanner(stdout)
				for sc.Scan() {
					lines <- sc.Text()
				}
				close(lines)
			}()
			expect := func(want ...string) {
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
				slices.Sort(got)
				slices.Sort(want)
				if !slices.Equal(got, want) {
					t.Fatalf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
				}
			}
			expect(`{"op":"read","row":{"id":"1","v":"a"},"table":"public.t"}`,
				`{"op":"read","row":{"id":"2","v":"b"},"table":"public.t"}`,
				`{"op":"read","row":{"id":"3","v":null},"table":"public.t"}`)
			run(`INSERT INTO t VALUES (4, 'd')`)
			expect(`{"op":"insert","row":{"id":"4","v":"d"},"table":"public.t"}`)
			run(`UPDATE t SET v = 'x' WHERE id = 1`, `DELETE FROM t WHERE id = 2`)
			expect(`{"op":"update","row":{"id":"1","v":"x"},"table":"public.t"}`)
			expect(`{"op":"delete","row":{"id":"2"},"table":"public.t"}`)
			run(`ALTER PUBLICATION pub ADD TABLE t2`, `INSERT INTO t2 VALUES (3)`)
			expect(`{"op":"read","row":{"id":"1"},"table":"public.t2"}`,
				`{"op":"read","row":{"id":"2"},"table":"public.t2"}`,
				`{"op":"read","row":{"id":"3"},"table":"public.t2"}`)
			run(`INSERT INTO t2 VALUES (4)`)
			expect(`{"op":"insert","row":{"id":"4"},"table":"public.t2"}`)
		})
	}
	if !ran {
		pgtest.Unavailable(t, "neither PostgreSQL 15 nor 18 is installed")
	}
}
