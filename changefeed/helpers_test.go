package changefeed_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/pgvalue"
)

func TestMain(m *testing.M) {
	if spec := os.Getenv(crashConsumerEnv); spec != "" {
		os.Exit(crashConsumer(spec))
	}
	pgtest.Main(m)
}

// testedMajors are the server versions the integration tests run against, when installed.
var testedMajors = []int{15, 18}

func eachMajor(t *testing.T, f func(t *testing.T, srv *pgtest.Server)) {
	pgtest.EachMajor(t, testedMajors, f)
}

// lines renders a batch's changes, one line each: "kind op table key=value...", with the
// streamed transaction's end LSN for a Transaction.
func lines(b *changefeed.Batch) ([]string, error) {
	var out []string
	dec := pgvalue.NewDecoder(nil)
	for ch, err := range dec.Changes(b) {
		if err != nil {
			return nil, err
		}
		row := ch.New
		if ch.Op == decoding.MsgDelete {
			row = ch.Old
		}
		var cols []string
		for c := range row.Columns() {
			v, err := c.Value()
			if err != nil {
				return nil, err
			}
			cols = append(cols, fmt.Sprintf("%s=%v", c.Name, v))
		}
		old := ""
		if ch.Op == decoding.MsgUpdate && ch.Old.Present() {
			if c, ok := ch.Old.Lookup("id"); ok {
				v, _ := c.Value()
				old = fmt.Sprintf(" old_id=%v", v)
			}
		}
		l := fmt.Sprintf("%s %s %s.%s%s %s", b.Kind, strings.ToLower(ch.Op.String()), ch.Relation.Namespace, ch.Relation.Name, old, strings.Join(cols, " "))
		if b.Txn != nil {
			l += " @" + b.Txn.EndLSN.String()
		}
		out = append(out, l)
	}
	return out, nil
}

// model applies rendered lines to tables keyed by id, refusing what exactly-once delivery never
// produces: an insert of a present key, an update or delete of a missing one, and a streamed
// transaction that does not end after the previous one.
type model struct {
	rows    map[string]map[string]string // table → id → "v=.. n=.."
	lastLSN decoding.LSN
}

func newModel() *model { return &model{rows: map[string]map[string]string{}} }

func (m *model) apply(line string) error {
	f := strings.Fields(line)
	if len(f) < 4 {
		return fmt.Errorf("short line %q", line)
	}
	op, table := f[1], f[2]
	rest := f[3:]
	if at := rest[len(rest)-1]; strings.HasPrefix(at, "@") {
		lsn, err := decoding.ParseLSN(at[1:])
		if err != nil {
			return err
		}
		if lsn < m.lastLSN {
			return fmt.Errorf("transaction ending at %s after one ending at %s: %q", lsn, m.lastLSN, line)
		}
		m.lastLSN = lsn
		rest = rest[:len(rest)-1]
	}
	oldID := ""
	if strings.HasPrefix(rest[0], "old_id=") {
		oldID, rest = strings.TrimPrefix(rest[0], "old_id="), rest[1:]
	}
	id := strings.TrimPrefix(rest[0], "id=")
	val := strings.Join(rest[1:], " ")
	t := m.rows[table]
	if t == nil {
		t = map[string]string{}
		m.rows[table] = t
	}
	switch op {
	case "insert":
		if _, ok := t[id]; ok {
			return fmt.Errorf("insert of a present row: %q", line)
		}
		t[id] = val
	case "update":
		key := id
		if oldID != "" {
			key = oldID
		}
		if _, ok := t[key]; !ok {
			return fmt.Errorf("update of a missing row: %q", line)
		}
		delete(t, key)
		t[id] = val
	case "delete":
		if _, ok := t[id]; !ok {
			return fmt.Errorf("delete of a missing row: %q", line)
		}
		delete(t, id)
	default:
		return fmt.Errorf("unexpected line %q", line)
	}
	return nil
}

// tableRows reads a table (id, v, n) in the model's form.
func tableRows(ctx context.Context, t *testing.T, dsn, table string) map[string]string {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SELECT id, v, n FROM "+table)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for rows.Next() {
		var id int32
		var v *string
		var n *int32
		if err := rows.Scan(&id, &v, &n); err != nil {
			t.Fatal(err)
		}
		out[strconv.Itoa(int(id))] = fmt.Sprintf("v=%v n=%v", deref(v), deref(n))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

// diff describes how two tables differ, in a few lines.
func diff(got, want map[string]string) string {
	return strings.Join(pgtest.MapDiff(got, want, 10), "\n")
}

// recorder is a handler that keeps every batch's lines in memory.
type recorder struct {
	mu      sync.Mutex
	kinds   []changefeed.Kind
	linesAt []int // per batch: len(lines) before it
	lines   []string
	txns    chan struct{}
}

func (r *recorder) handle(ctx context.Context, b *changefeed.Batch) error {
	ls, err := lines(b)
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.kinds = append(r.kinds, b.Kind)
	r.linesAt = append(r.linesAt, len(r.lines))
	r.lines = append(r.lines, ls...)
	r.mu.Unlock()
	if b.Kind == changefeed.Transaction && r.txns != nil {
		r.txns <- struct{}{}
	}
	return nil
}
