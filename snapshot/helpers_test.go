package snapshot_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/pgvalue"
	"github.com/pgreorder/pgreorder/replication"
	"github.com/pgreorder/pgreorder/snapshot"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// testedMajors are the server versions the integration tests run against, when installed.
var testedMajors = []int{15, 18}

func eachMajor(t *testing.T, f func(t *testing.T, srv *pgtest.Server)) {
	pgtest.EachMajor(t, testedMajors, f)
}

// connectSlot connects for replication and creates slot with an exported snapshot.
func connectSlot(ctx context.Context, t *testing.T, srv *pgtest.Server, db, slot string, binary bool, pubs ...string) (*replication.Conn, replication.Snapshot, replication.Config) {
	t.Helper()
	cfg := replication.Config{ConnString: srv.ReplicationConnString(db), Slot: slot, Publications: pubs, Binary: binary}
	conn, err := replication.Connect(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	snap, err := conn.CreateSlot(ctx, replication.ExportSnapshot)
	if err != nil {
		t.Fatal(err)
	}
	return conn, snap, cfg
}

// rowModel is a consumer's copy of some tables: per table, per key (the replica identity key
// columns' values), the row's values as fmt prints the Go values pgvalue decodes. Applying a
// change checks that it makes sense: an insert (or copied row) of a key already there is an
// overlap, an update or delete of a key not there a gap.
type rowModel struct {
	mu   sync.Mutex
	xids map[uint32]bool // the streamed transactions
	rows map[string]map[string]string
	// history records, per table and key, what was applied, for the failure messages.
	history map[string][]string
	origin  string // where the changes being applied come from
}

func newRowModel() *rowModel {
	return &rowModel{rows: map[string]map[string]string{}, history: map[string][]string{}, origin: "(copy)"}
}

// from sets the origin recorded in the history of the changes applied next with apply.
func (m *rowModel) from(origin string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.origin = origin
}

func (m *rowModel) record(table, key, what string) {
	k := table + " " + key
	m.history[k] = append(m.history[k], what)
}

// keys returns the keys of a table.
func (m *rowModel) keys(table string) map[string]bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]bool{}
	for k := range m.rows[table] {
		out[k] = true
	}
	return out
}

// streamed returns the ids of the transactions streamInto received.
func (m *rowModel) streamed() map[uint32]bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.xids)
}

func (m *rowModel) keyHistory(table, key string) string {
	return strings.Join(m.history[table+" "+key], "; ")
}

func relName(r *decoding.Relation) string { return r.Namespace + "." + r.Name }

// encode returns the key and the row of a resolved row.
func encode(row pgvalue.Row) (key, vals string, err error) {
	var k, v []string
	for c := range row.Columns() {
		x, err := c.Value()
		if err != nil {
			return "", "", fmt.Errorf("column %s: %w", c.Name, err)
		}
		s := fmt.Sprint(x)
		if x == nil {
			s = "NULL"
		}
		v = append(v, s)
		if c.Key {
			k = append(k, s)
		}
	}
	return strings.Join(k, "|"), strings.Join(v, "|"), nil
}

// modelError is a change the model refuses: a gap or an overlap, on one key.
type modelError struct{ table, key, msg string }

func (e *modelError) Error() string { return e.msg }

// diagnose, if set by a test, is called with a change the model refused, to log what the test
// knows about the key.
var diagnose func(t *testing.T, e *modelError)

func (m *rowModel) table(name string) map[string]string {
	tab := m.rows[name]
	if tab == nil {
		tab = map[string]string{}
		m.rows[name] = tab
	}
	return tab
}

// apply applies one change (a copied row is an Insert); it returns an error for an overlap or
// a gap. It may be called from any goroutine.
func (m *rowModel) apply(ch pgvalue.Change) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if ch.Op == decoding.MsgTruncate {
		for _, r := range ch.Relations {
			delete(m.rows, relName(r))
		}
		return nil
	}
	name := relName(ch.Relation)
	tab := m.table(name)
	switch ch.Op {
	case decoding.MsgInsert:
		k, v, err := encode(ch.New)
		if err != nil {
			return err
		}
		if old, ok := tab[k]; ok {
			return &modelError{name, k, fmt.Sprintf("%s: insert of key %s, already there (%s); history: %s", ch, k, old, m.keyHistory(name, k))}
		}
		tab[k] = v
		m.record(name, k, "insert "+v+" "+m.origin)
	case decoding.MsgUpdate:
		k, v, err := encode(ch.New)
		if err != nil {
			return err
		}
		oldKey := k
		if ch.Old.Present() {
			if oldKey, _, err = encode(ch.Old); err != nil {
				return err
			}
		}
		if _, ok := tab[oldKey]; !ok {
			return &modelError{name, oldKey, fmt.Sprintf("%s: update of key %s, not there; history: %s", ch, oldKey, m.keyHistory(name, oldKey))}
		}
		delete(tab, oldKey)
		if old, ok := tab[k]; ok {
			return &modelError{name, k, fmt.Sprintf("%s: update to key %s, already there (%s); history: %s", ch, k, old, m.keyHistory(name, k))}
		}
		tab[k] = v
		m.record(name, oldKey, "update to "+k+": "+v+" "+m.origin)
		if k != oldKey {
			m.record(name, k, "update from "+oldKey+": "+v+" "+m.origin)
		}
	case decoding.MsgDelete:
		k, _, err := encode(ch.Old)
		if err != nil {
			return err
		}
		if _, ok := tab[k]; !ok {
			return &modelError{name, k, fmt.Sprintf("%s: delete of key %s, not there; history: %s", ch, k, m.keyHistory(name, k))}
		}
		delete(tab, k)
		m.record(name, k, "delete "+m.origin)
	}
	return nil
}

// copyInto is a Handler that applies every copied row to m.
func copyInto(m *rowModel) snapshot.Handler {
	return func(ctx context.Context, c *snapshot.Chunk) error {
		dec := pgvalue.NewDecoder(nil)
		for ch, err := range dec.Changes(c) {
			if err != nil {
				return err
			}
			if ch.Op != decoding.MsgInsert {
				return fmt.Errorf("copied change %s", ch)
			}
			if err := m.apply(ch); err != nil {
				return err
			}
		}
		return nil
	}
}

// streamInto applies the stream's transactions to m until stop reports true for one of them,
// skipping the changes a Result covers (it returns how many), and acknowledging each
// transaction. sync, if set, is called for a change to a table no Result has copied, and
// returns the Result of its copy.
func streamInto(ctx context.Context, t *testing.T, s *replication.Stream, m *rowModel, results []*snapshot.Result,
	stop func(pgvalue.Change) bool, sync func(rel *decoding.Relation) *snapshot.Result) (skipped int) {
	t.Helper()
	dec := pgvalue.NewDecoder(nil)
	for {
		x, err := s.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		done := false
		m.from(fmt.Sprintf("(xid %d, commit %s)", x.Xid, x.CommitLSN))
		m.mu.Lock()
		if m.xids == nil {
			m.xids = map[uint32]bool{}
		}
		m.xids[x.Xid] = true
		m.mu.Unlock()
		for ch, err := range dec.Changes(x) {
			if err != nil {
				t.Fatal(err)
			}
			if stop(ch) {
				done = true
				continue
			}
			if ch.Relation != nil && sync != nil && !slices.ContainsFunc(results, func(r *snapshot.Result) bool {
				return r.Copied(ch.Relation.RelationID)
			}) {
				m.from("(sync)")
				r := sync(ch.Relation)
				m.from(fmt.Sprintf("(xid %d, commit %s)", x.Xid, x.CommitLSN))
				if !r.Copied(ch.Relation.RelationID) {
					t.Fatalf("synchronising %s did not copy it", relName(ch.Relation))
				}
				results = append(results, r)
			}
			if ch.Relation != nil {
				checkRelation(t, results, ch.Relation)
			}
			if ch.Relation != nil && slices.ContainsFunc(results, func(r *snapshot.Result) bool {
				return r.Covers(ch.Relation.RelationID, x.CommitLSN)
			}) {
				skipped++
				if k, _, err := encode(ch.New); err == nil && ch.New.Present() {
					m.mu.Lock()
					m.record(relName(ch.Relation), k, fmt.Sprintf("skipped %s (xid %d, commit %s)", ch, x.Xid, x.CommitLSN))
					m.mu.Unlock()
				}
				continue
			}
			if err := m.apply(ch); err != nil {
				var me *modelError
				if errors.As(err, &me) && diagnose != nil {
					diagnose(t, me)
				}
				t.Fatalf("transaction %d (commit %s): %v", x.Xid, x.CommitLSN, err)
			}
		}
		if err := s.Ack(x); err != nil {
			t.Fatal(err)
		}
		if done {
			return skipped
		}
	}
}

// checkModel compares m's table name with the rows the query returns now; key lists the
// columns that make the key (the replica identity key), by index.
func checkModel(ctx context.Context, t *testing.T, connString string, m *rowModel, name, query string, key ...int) {
	t.Helper()
	conn, err := pgx.Connect(ctx, connString)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, query)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			t.Fatal(err)
		}
		var v, k []string
		for _, x := range vals {
			s := fmt.Sprint(x)
			if x == nil {
				s = "NULL"
			}
			v = append(v, s)
		}
		for _, i := range key {
			k = append(k, v[i])
		}
		want[strings.Join(k, "|")] = strings.Join(v, "|")
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	got := m.rows[name]
	m.mu.Unlock()
	if diffs := pgtest.MapDiff(got, want, 20); len(diffs) > 0 {
		t.Errorf("%s: %d rows in the database, %d in the model; differences:\n%s", name, len(want), len(got),
			strings.Join(diffs, "\n"))
	}
}

// checkRelation checks that the copy described a relation as the stream does.
func checkRelation(t *testing.T, results []*snapshot.Result, rel *decoding.Relation) {
	t.Helper()
	for _, r := range results {
		for _, tab := range r.Tables {
			if tab.OID != rel.RelationID {
				continue
			}
			want := *rel
			want.Xid = 0
			if !reflect.DeepEqual(*tab.Relation, want) {
				t.Errorf("the copy describes %s as\n%+v\nthe stream as\n%+v", tab, *tab.Relation, want)
			}
		}
	}
}

// isDone reports whether ch is the insert into the table "done" that ends a test's stream.
func isDone(ch pgvalue.Change) bool {
	return ch.Op == decoding.MsgInsert && ch.Relation.Name == "done"
}

// writer changes tables at random, one short transaction after another, until stopped: inserts
// (upserts), updates, updates of the key and deletes of rows with ids in [1, maxID], each
// table picked at random among tables.
type writer struct {
	t       *testing.T
	mu      sync.Mutex
	log     []string // per operation: "xid N: table sql args -> rows"
	wops    []wop
	commits atomic.Int64
	stats   [4]atomic.Int64 // rows inserted or upserted, updated, re-keyed, deleted
	err     atomic.Pointer[error]
	stopped chan struct{}
	quit    chan struct{}
}

func startWriter(ctx context.Context, t *testing.T, connString string, seed uint64, maxID int, tables ...string) *writer {
	t.Helper()
	conn, err := pgx.Connect(ctx, connString)
	if err != nil {
		t.Fatal(err)
	}
	w := &writer{t: t, stopped: make(chan struct{}), quit: make(chan struct{})}
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	go func() {
		defer close(w.stopped)
		defer conn.Close(context.Background())
		fail := func(err error) { w.err.Store(&err) }
		for {
			select {
			case <-w.quit:
				return
			case <-ctx.Done():
				fail(ctx.Err())
				return
			default:
			}
			tx, err := conn.Begin(ctx)
			if err != nil {
				fail(err)
				return
			}
			var ops []string
			var structured []wop
			for range 1 + rng.IntN(4) {
				table := tables[rng.IntN(len(tables))]
				id, id2, v := 1+rng.IntN(maxID), 1+rng.IntN(maxID), rng.IntN(1000)
				var op int
				var sql string
				var args []any
				switch p := rng.IntN(100); {
				case p < 35:
					op, sql, args = 0, "INSERT INTO "+table+" VALUES ($1, $2::int, md5($2::int::text)) ON CONFLICT (id) DO UPDATE SET v = EXCLUDED.v", []any{id, v}
				case p < 70:
					op, sql, args = 1, "UPDATE "+table+" SET v = $2, pad = pad || 'x' WHERE id = $1", []any{id, v}
				case p < 80:
					op, sql, args = 2, "UPDATE "+table+" SET id = $2 WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM "+table+" WHERE id = $2)", []any{id, id2}
				default:
					op, sql, args = 3, "DELETE FROM "+table+" WHERE id = $1", []any{id}
				}
				tag, err := tx.Exec(ctx, sql, args...)
				if err != nil {
					fail(err)
					tx.Rollback(context.Background())
					return
				}
				w.stats[op].Add(tag.RowsAffected())
				ops = append(ops, fmt.Sprintf("%s %v -> %d", sql, args, tag.RowsAffected()))
				structured = append(structured, wop{table: table, op: op, id: id, id2: id2, rows: tag.RowsAffected()})
			}
			var xid string // for the failure messages: asked after the writes, not to change when it is assigned
			if err := tx.QueryRow(ctx, "SELECT coalesce(pg_current_xact_id_if_assigned()::text, '-')").Scan(&xid); err != nil {
				fail(err)
				return
			}
			if err := tx.Commit(ctx); err != nil {
				fail(err)
				return
			}
			w.commits.Add(1)
			w.mu.Lock()
			for _, op := range ops {
				w.log = append(w.log, "xid "+xid+": "+op)
			}
			for _, o := range structured {
				o.xid = xid
				w.wops = append(w.wops, o)
			}
			w.mu.Unlock()
		}
	}()
	t.Cleanup(w.stop)
	return w
}

// wop is one operation of the writer, for diagnostics.
type wop struct {
	xid     string
	table   string
	op      int // 0 upsert, 1 update, 2 re-key, 3 delete
	id, id2 int
	rows    int64
}

// keysBefore returns the keys of table (initially 1 to n) once the writer's transactions that
// are not in streamed had run, with the last five of those and the first five streamed ones
// that touched the table.
func (w *writer) keysBefore(table string, n int, streamed map[uint32]bool) (keys map[int]bool, before, after []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	keys = map[int]bool{}
	for i := 1; i <= n; i++ {
		keys[i] = true
	}
	for _, o := range w.wops {
		if o.table != table {
			continue
		}
		if xid, _ := strconv.Atoi(o.xid); streamed[uint32(xid)] {
			if len(after) < 5 && !slices.Contains(after, o.xid) {
				after = append(after, o.xid)
			}
			continue
		}
		if len(after) > 0 {
			after = append(after, "(then not streamed: "+o.xid+")")
		}
		if !slices.Contains(before, o.xid) {
			before = append(before, o.xid)
		}
		switch {
		case o.op == 0:
			keys[o.id] = true
		case o.op == 2 && o.rows > 0:
			delete(keys, o.id)
			keys[o.id2] = true
		case o.op == 3 && o.rows > 0:
			delete(keys, o.id)
		}
	}
	return keys, before[max(0, len(before)-5):], after
}

// waitFor waits until the writer has committed n more transactions. It may be called from any
// goroutine; it returns an error if the writer failed.
func (w *writer) waitFor(ctx context.Context, n int64) error {
	target := w.commits.Load() + n
	for w.commits.Load() < target {
		if p := w.err.Load(); p != nil {
			return fmt.Errorf("writer: %w", *p)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-w.stopped:
			return fmt.Errorf("writer stopped")
		case <-time.After(time.Millisecond):
		}
	}
	return nil
}

// stop stops the writer and waits for it; it fails the test if the writer failed.
func (w *writer) stop() {
	select {
	case <-w.quit:
	default:
		close(w.quit)
	}
	<-w.stopped
	if p := w.err.Load(); p != nil {
		w.t.Errorf("writer: %v", *p)
	}
}

func (w *writer) String() string {
	return fmt.Sprintf("%d transactions: %d rows inserted or upserted, %d updated, %d re-keyed, %d deleted",
		w.commits.Load(), w.stats[0].Load(), w.stats[1].Load(), w.stats[2].Load(), w.stats[3].Load())
}

// ops returns the writer's operations that may have touched id.
func (w *writer) ops(id string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, l := range w.log {
		if strings.Contains(l, "["+id+" ") || strings.Contains(l, " "+id+"]") || strings.Contains(l, "["+id+"]") {
			out = append(out, l)
		}
	}
	return out
}
