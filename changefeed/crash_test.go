package changefeed_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/pgvalue"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/replication"
	"github.com/pgreorder/pgreorder/snapshot"
)

// The crash test: a consumer (this test binary, re-executed) copies two tables and streams
// what follows while writers change them, and is killed with SIGKILL at random moments, first
// during the copy, then during the stream, and started again each time. Two consumers:
//
//   - file: a FileStore, the handler appending one line per change to a file that it fsyncs,
//     recording the file's length with SetState and cutting the file back to it on Resume (to
//     nothing on Reset);
//   - table: a TableStore in another database, the handler writing the rows into that
//     database's tables in the store's transaction (COPY for copied rows; inserts, updates and
//     deletes that must each touch exactly one row).
//
// In the end the output, applied to an empty model that refuses an insert of a present row and
// an update or delete of a missing one (file), or the target tables (table), must equal the
// source's tables: every row exactly once, copy and stream together.

// crashConsumerEnv makes the test binary run the consumer instead of the tests.
const crashConsumerEnv = "PGREORDER_CHANGEFEED_CRASH"

// crashConsumer runs the consumer: mode, replication DSN, target DSN and output path,
// tab-separated. It prints "chunk" and "txn" to stdout as it handles batches.
func crashConsumer(spec string) int {
	f := strings.Split(spec, "\t")
	if len(f) != 5 {
		fmt.Fprintf(os.Stderr, "crash consumer: bad spec %q\n", spec)
		return 2
	}
	mode, repl, target, path, stall := f[0], f[1], f[2], f[3], f[4] == "stall"
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg := changefeed.Config{
		Replication: replication.Config{ConnString: repl, Slot: "crash", Publications: []string{"p"},
			Buffer: reorderbuffer.Config{WorkMem: 64 << 10}},
		Copy:   snapshot.Config{Workers: 2, ChunkSize: 32 << 10},
		Logger: slog.New(slog.NewTextHandler(os.Stderr, nil)),
	}
	var (
		store changefeed.Store
		h     changefeed.Handler
		err   error
	)
	out := bufio.NewWriter(os.Stdout)
	var outMu sync.Mutex
	mark := func(b *changefeed.Batch) {
		outMu.Lock()
		defer outMu.Unlock()
		switch {
		case b.Kind == changefeed.Snapshot && b.Table != nil:
			out.WriteString("tchunk\n") // of a table added to the publication
			if stall {                  // hold the copy of the added table until the test kills the process
				out.Flush()
				select {}
			}
		case b.Kind == changefeed.Snapshot:
			out.WriteString("chunk\n")
		case b.Kind == changefeed.Transaction:
			out.WriteString("txn\n")
		}
		out.Flush()
	}
	switch mode {
	case "file":
		store, err = changefeed.OpenFile(path + ".pos")
		if err == nil {
			var o *fileOutput
			o, err = openFileOutput(path)
			h = o.handle
		}
	case "table":
		store, err = changefeed.OpenTableStore(ctx, changefeed.TableConfig{ConnString: target})
		h = tableHandle
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "crash consumer:", err)
		return 1
	}
	err = changefeed.Run(ctx, cfg, store, func(ctx context.Context, b *changefeed.Batch) error {
		if err := h(ctx, b); err != nil {
			return err
		}
		mark(b)
		return nil
	})
	if ctx.Err() != nil {
		return 0
	}
	fmt.Fprintln(os.Stderr, "crash consumer:", err)
	return 1
}

// fileOutput is the file consumer's output: one line per change, fsynced per batch.
type fileOutput struct {
	mu sync.Mutex
	f  *os.File
}

func openFileOutput(path string) (*fileOutput, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, err
	}
	if _, err := f.Seek(0, io.SeekEnd); err != nil { // Reset or Resume cuts it back
		f.Close()
		return nil, err
	}
	return &fileOutput{f: f}, nil
}

func (o *fileOutput) handle(ctx context.Context, b *changefeed.Batch) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	switch b.Kind {
	case changefeed.Reset, changefeed.Resume, changefeed.TableReset:
		var n int64
		if len(b.State) > 0 {
			var err error
			if n, err = strconv.ParseInt(string(b.State), 10, 64); err != nil {
				return err
			}
		}
		if err := o.f.Truncate(n); err != nil {
			return err
		}
		if _, err := o.f.Seek(n, io.SeekStart); err != nil {
			return err
		}
		return o.f.Sync()
	}
	o.mu.Unlock()
	ls, err := lines(b)
	o.mu.Lock()
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	for _, l := range ls {
		buf.WriteString(l + "\n")
	}
	if _, err := o.f.Write(buf.Bytes()); err != nil {
		return err
	}
	if err := o.f.Sync(); err != nil {
		return err
	}
	end, err := o.f.Seek(0, io.SeekCurrent)
	if err != nil {
		return err
	}
	return b.SetState([]byte(strconv.FormatInt(end, 10)))
}

// tableHandle writes the rows into the target database, in the store's transaction.
func tableHandle(ctx context.Context, b *changefeed.Batch) error {
	tx := changefeed.Tx(b)
	switch b.Kind {
	case changefeed.Reset:
		_, err := tx.Exec(ctx, "TRUNCATE t, u")
		return err
	case changefeed.Resume:
		return nil
	case changefeed.TableReset:
		_, err := tx.Exec(ctx, "DELETE FROM "+pgx.Identifier{b.Table.Name}.Sanitize())
		return err
	}
	dec := pgvalue.NewDecoder(nil)
	var rows [][]any
	for ch, err := range dec.Changes(b) {
		if err != nil {
			return err
		}
		vals := func(r pgvalue.Row) ([]any, error) {
			var out []any
			for c := range r.Columns() {
				v, err := c.Value()
				if err != nil {
					return nil, err
				}
				out = append(out, v)
			}
			return out, nil
		}
		table := pgx.Identifier{ch.Relation.Name}.Sanitize()
		var tag interface{ RowsAffected() int64 }
		switch ch.Op {
		case decoding.MsgInsert:
			v, err := vals(ch.New)
			if err != nil {
				return err
			}
			if b.Kind == changefeed.Snapshot {
				rows = append(rows, v)
				continue
			}
			tag, err = tx.Exec(ctx, "INSERT INTO "+table+" (id, v, n) VALUES ($1, $2, $3)", v...)
			if err != nil {
				return err
			}
		case decoding.MsgUpdate:
			v, err := vals(ch.New)
			if err != nil {
				return err
			}
			key := v[0]
			if ch.Old.Present() {
				c, _ := ch.Old.Lookup("id")
				if key, err = c.Value(); err != nil {
					return err
				}
			}
			tag, err = tx.Exec(ctx, "UPDATE "+table+" SET id = $1, v = $2, n = $3 WHERE id = $4", append(v, key)...)
			if err != nil {
				return err
			}
		case decoding.MsgDelete:
			c, _ := ch.Old.Lookup("id")
			key, err := c.Value()
			if err != nil {
				return err
			}
			tag, err = tx.Exec(ctx, "DELETE FROM "+table+" WHERE id = $1", key)
			if err != nil {
				return err
			}
		default:
			return fmt.Errorf("unexpected %s", ch)
		}
		if tag.RowsAffected() != 1 {
			return fmt.Errorf("%s touched %d rows, not one", ch, tag.RowsAffected())
		}
	}
	if len(rows) > 0 {
		_, err := tx.CopyFrom(ctx, pgx.Identifier{b.Chunk.Table.Name}, []string{"id", "v", "n"}, pgx.CopyFromRows(rows))
		return err
	}
	return nil
}

func TestCrash(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("PGREORDER_SEED"); s != "" {
		_, err := fmt.Sscan(s, &seed)
		require.NoError(t, err)
	}
	t.Logf("seed %d (set PGREORDER_SEED to replay)", seed)
	self, err := os.Executable()
	require.NoError(t, err)
	majors := pgtest.Majors(t)
	major := majors[len(majors)-1] // the newest installed: the test takes seconds per consumer
	for i, mode := range []string{"file", "table"} {
		t.Run(fmt.Sprintf("pg%d/%s", major, mode), func(t *testing.T) {
			crash(t, pgtest.Shared(t, major), mode, self, rand.New(rand.NewPCG(seed, uint64(i))), false)
		})
	}
}

// TestCrashTableAdded is TestCrash with u added to the publication while the consumer streams:
// the consumer is also killed during u's copy, twice (the second time during the copy made
// again after a TableReset), and the output must equal the source's tables all the same.
func TestCrashTableAdded(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("PGREORDER_SEED"); s != "" {
		_, err := fmt.Sscan(s, &seed)
		require.NoError(t, err)
	}
	t.Logf("seed %d (set PGREORDER_SEED to replay)", seed)
	self, err := os.Executable()
	require.NoError(t, err)
	majors := pgtest.Majors(t)
	major := majors[len(majors)-1]
	for i, mode := range []string{"file", "table"} {
		t.Run(fmt.Sprintf("pg%d/%s", major, mode), func(t *testing.T) {
			crash(t, pgtest.Shared(t, major), mode, self, rand.New(rand.NewPCG(seed, uint64(i))), true)
		})
	}
}

// crash runs the crash test; with late, u is added to the publication after the initial copy.
func crash(t *testing.T, srv *pgtest.Server, mode, self string, rng *rand.Rand, late bool) {
	ctx := pgtest.Context(t, 4*time.Minute)
	db, tdb := pgtest.NewDatabase(t, srv), pgtest.NewDatabase(t, srv)
	dsn, target := srv.ConnString(db), srv.ConnString(tdb)
	const initial = 6000
	schema := []string{`CREATE TABLE t (id int PRIMARY KEY, v text, n int)`, `CREATE TABLE u (id int PRIMARY KEY, v text, n int)`}
	publication := `CREATE PUBLICATION p FOR TABLE t, u`
	if late {
		publication = `CREATE PUBLICATION p FOR TABLE t`
	}
	pgtest.ExecAll(t, dsn, append(schema,
		fmt.Sprintf(`INSERT INTO t SELECT g, repeat('x', 20) || g, g FROM generate_series(1, %d) g`, initial),
		fmt.Sprintf(`INSERT INTO u SELECT g, 'u' || g, NULL FROM generate_series(1, %d) g`, initial/4),
		publication)...)
	pgtest.ExecAll(t, target, schema...)
	path := filepath.Join(t.TempDir(), "out")

	// The writers, throughout.
	var nextID atomic.Int64
	nextID.Store(initial + 1)
	wctx, stopWriters := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var werr atomic.Value
	for w := range 2 {
		wrng := rand.New(rand.NewPCG(rng.Uint64(), uint64(w)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := write(wctx, dsn, wrng, &nextID); err != nil && wctx.Err() == nil {
				werr.Store(err)
			}
		}()
	}
	defer func() {
		stopWriters()
		wg.Wait()
	}()

	var logs pgtest.LockedBuffer
	type child struct {
		cmd  *exec.Cmd
		out  chan string
		done chan error
	}
	// launch starts the consumer; with stall, it holds the first chunk of an added table's copy
	// it handles (before that chunk is stored) until it is killed.
	launch := func(stall bool) *child {
		cmd := exec.Command(self, "-test.run=^$")
		how := "run"
		if stall {
			how = "stall"
		}
		cmd.Env = append(os.Environ(), crashConsumerEnv+"="+strings.Join([]string{mode, srv.ReplicationConnString(db), target, path, how}, "\t"))
		cmd.Stderr = &logs
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { cmd.Process.Kill() }) // a test that fails leaves none running
		c := &child{cmd: cmd, out: make(chan string, 1024), done: make(chan error, 1)}
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				c.out <- sc.Text()
			}
			close(c.out)
			c.done <- cmd.Wait()
		}()
		return c
	}
	// waitLines waits for n lines saying what, while the child runs.
	waitLines := func(c *child, what string, n int) {
		t.Helper()
		for got := 0; got < n; {
			select {
			case l, ok := <-c.out:
				if !ok {
					t.Fatalf("the consumer ended by itself:\n%s", logs.String())
				}
				if l == what {
					got++
				}
			case <-time.After(time.Minute):
				t.Fatalf("waiting for %d %q lines (writer error: %v):\n%s", n, what, werr.Load(), logs.String())
			}
		}
	}
	kill := func(c *child) {
		c.cmd.Process.Signal(syscall.SIGKILL)
		for range c.out {
		}
		<-c.done
	}
	copyDone := func() bool {
		if mode == "file" {
			s, err := changefeed.OpenFile(path + ".pos")
			require.NoError(t, err)
			defer s.Close()
			p, ok, err := s.Load(ctx, "crash")
			require.NoError(t, err)
			return ok && p.CopyDone
		}
		conn, err := pgx.Connect(ctx, target)
		require.NoError(t, err)
		defer conn.Close(ctx)
		var done bool
		err = conn.QueryRow(ctx, "SELECT copy_done FROM "+changefeed.DefaultTable+" WHERE slot = 'crash'").Scan(&done)
		if errors.Is(err, pgx.ErrNoRows) {
			return false
		}
		require.NoError(t, err)
		return done
	}

	// tableSync reports whether the stored position records a copy of an added table that began.
	tableSync := func() bool {
		if mode == "file" {
			s, err := changefeed.OpenFile(path + ".pos")
			require.NoError(t, err)
			defer s.Close()
			p, ok, err := s.Load(ctx, "crash")
			require.NoError(t, err)
			return ok && p.Sync != nil
		}
		conn, err := pgx.Connect(ctx, target)
		require.NoError(t, err)
		defer conn.Close(ctx)
		var syncing bool
		require.NoError(t, conn.QueryRow(ctx, "SELECT sync IS NOT NULL FROM "+changefeed.DefaultTable+" WHERE slot = 'crash'").Scan(&syncing))
		return syncing
	}

	duringCopy, duringStream, duringTableCopy := 0, 0, 0
	for range 3 { // during the copy: after a few chunks, at a random moment
		c := launch(false)
		waitLines(c, "chunk", 1+rng.IntN(3))
		// Not a wait for anything: the kill comes at a random moment after the chunks.
		time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
		kill(c)
		if copyDone() {
			duringStream++
		} else {
			duringCopy++
		}
	}
	if late {
		// During u's copy: held after its first chunk (a small table's copy can end within
		// any random delay); then during the copy made again, at a random moment.
		for i := range 2 {
			c := launch(i == 0)
			waitLines(c, "txn", 1)
			if i == 0 {
				pgtest.ExecAll(t, dsn, `ALTER PUBLICATION p ADD TABLE u`)
			}
			waitLines(c, "tchunk", 1)
			if i > 0 {
				// Not a wait for anything: the kill comes at a random moment after the chunks.
				time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
			}
			kill(c)
			if tableSync() {
				duringTableCopy++
			}
		}
		t.Logf("killed %d times during the added table's copy", duringTableCopy)
		require.GreaterOrEqual(t, duringTableCopy, 1, "no kill hit the added table's copy")
	}
	for range 4 { // during the stream
		c := launch(false)
		waitLines(c, "txn", 1+rng.IntN(15))
		// Not a wait for anything: the kill comes at a random moment after the transactions.
		time.Sleep(time.Duration(rng.IntN(150)) * time.Millisecond)
		kill(c)
		duringStream++
	}
	c := launch(false)
	waitLines(c, "txn", 1)
	stopWriters()
	wg.Wait()
	if err, _ := werr.Load().(error); err != nil {
		t.Fatalf("writer: %v", err)
	}
	t.Logf("killed %d times during the copy, %d during the stream", duringCopy, duringStream)
	require.GreaterOrEqual(t, duringCopy, 1, "no kill hit the copy")

	want := map[string]map[string]string{"t": tableRows(ctx, t, dsn, "t"), "u": tableRows(ctx, t, dsn, "u")}
	var got map[string]map[string]string
	var why string
	require.NoError(t, waitFor(ctx, func() bool {
		got, why = output(ctx, t, mode, path, target)
		return why != "" || diff(got["t"], want["t"]) == "" && diff(got["u"], want["u"]) == ""
	}))
	require.True(t, why == "" && diff(got["t"], want["t"]) == "" && diff(got["u"], want["u"]) == "",
		"the output does not equal the source: %s\n%s\n%s\n%s", why, diff(got["t"], want["t"]), diff(got["u"], want["u"]), logs.String())
	c.cmd.Process.Signal(syscall.SIGTERM)
	for range c.out {
	}
	require.NoError(t, <-c.done, "the consumer's exit:\n%s", logs.String())
	t.Logf("rows: t %d, u %d", len(want["t"]), len(want["u"]))
}

// output reads what the consumer delivered, as tables; why says what is wrong with it.
func output(ctx context.Context, t *testing.T, mode, path, target string) (map[string]map[string]string, string) {
	if mode == "table" {
		return map[string]map[string]string{"t": tableRows(ctx, t, target, "t"), "u": tableRows(ctx, t, target, "u")}, ""
	}
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	m := newModel()
	for _, l := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		if l == "" {
			continue
		}
		if err := m.apply(l); err != nil {
			return nil, err.Error()
		}
	}
	return map[string]map[string]string{"t": m.rows["public.t"], "u": m.rows["public.u"]}, ""
}

// write runs small transactions of inserts, updates (some of the key), and deletes, and now and
// then a large one that the server streams, with a savepoint rolled back.
func write(ctx context.Context, dsn string, rng *rand.Rand, nextID *atomic.Int64) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	for ctx.Err() == nil {
		time.Sleep(time.Millisecond) // pacing, not a wait: a steady flow, not a flood, so the test stays short
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		table := []string{"t", "u"}[rng.IntN(2)]
		if rng.IntN(100) == 0 {
			base := nextID.Add(3000) - 2999 // Add returns the last id it reserves
			for _, sql := range []string{
				"INSERT INTO t SELECT g, repeat('big', 10), g FROM generate_series($1::int, $1::int + 1999) g",
				"SAVEPOINT s",
				"INSERT INTO t SELECT g, 'gone', g FROM generate_series($1::int + 2000, $1::int + 2999) g",
				"ROLLBACK TO SAVEPOINT s",
			} {
				var args []any
				if strings.Contains(sql, "$1") {
					args = []any{base}
				}
				if _, err = tx.Exec(ctx, sql, args...); err != nil {
					tx.Rollback(ctx)
					return fmt.Errorf("%s %v: %w", sql, args, err)
				}
			}
		}
		for range 1 + rng.IntN(4) {
			id := 1 + rng.Int64N(nextID.Load())
			var sql string
			var args []any
			switch rng.IntN(5) {
			case 0, 1:
				sql, args = "INSERT INTO "+table+" VALUES ($1, $2, $3) ON CONFLICT DO NOTHING", []any{nextID.Add(1), "new", rng.IntN(100)}
			case 2:
				sql, args = "UPDATE "+table+" SET v = $2, n = coalesce(n, 0) + 1 WHERE id = $1", []any{id, fmt.Sprint("up", rng.IntN(1000))}
			case 3:
				sql, args = "UPDATE "+table+" SET id = $2 WHERE id = $1", []any{id, nextID.Add(1)}
			case 4:
				sql, args = "DELETE FROM "+table+" WHERE id = $1", []any{id}
			}
			if _, err = tx.Exec(ctx, sql, args...); err != nil {
				err = fmt.Errorf("%s %v: %w", sql, args, err)
				break
			}
		}
		if err == nil {
			err = tx.Commit(ctx)
		}
		if err != nil {
			tx.Rollback(ctx)
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "40P01" { // two writers' row locks: a deadlock
				continue
			}
			return err
		}
	}
	return nil
}
