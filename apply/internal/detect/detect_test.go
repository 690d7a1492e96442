package detect

import (
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/apply/conflict"
)

func str(s string) *string { return &s }

// TestCheckedSQL: the statements sent with detection, for each kind, with and without the
// origin check.
func TestCheckedSQL(t *testing.T) {
	const upd = `UPDATE "public"."t" SET "v" = $1 WHERE "id" = $2`
	withOrigins := &Detection{TrackTS: true, Ours: []uint32{7, 12}}
	noTS := &Detection{Ours: []uint32{7}} // track_commit_timestamp off: no origin check
	for _, c := range []struct {
		name       string
		d          *Detection
		kind       byte
		plain      string
		onConflict bool
		want       string
	}{
		{"insert, arbiter indexes", noTS, 'I', `INSERT INTO "t" ("id") VALUES ($1)`, true,
			`WITH pgr AS (INSERT INTO "t" ("id") VALUES ($1) ON CONFLICT DO NOTHING RETURNING 1) SELECT c.n, CASE WHEN c.n = 0 ` +
				`THEN pg_catalog.set_config('pgreorder.missed', 'on', true) END FROM (SELECT pg_catalog.count(*) AS n FROM pgr) c`},
		{"insert, no arbiter", noTS, 'I', `INSERT INTO "t" ("id") VALUES ($1)`, false, `INSERT INTO "t" ("id") VALUES ($1)`},
		{"update, no origin check", noTS, 'U', upd, false, Counted(upd)},
		{"update, origin check", withOrigins, 'U', upd, false,
			Counted(upd + ` AND COALESCE((pg_catalog.pg_xact_commit_timestamp_origin(xmin)).roident, '7') IN ('7', '12')`)},
		{"delete, origin check", withOrigins, 'D', `DELETE FROM "t" WHERE "id" = $1`, false,
			Counted(`DELETE FROM "t" WHERE "id" = $1 AND COALESCE((pg_catalog.pg_xact_commit_timestamp_origin(xmin)).roident, '7') IN ('7', '12')`)},
	} {
		if got := c.d.CheckedSQL(c.kind, c.plain, c.onConflict); got != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.name, got, c.want)
		}
	}
}

// TestLocalQuery: the lookup of a conflict's local rows, with commit timestamps or without, and
// locked when last_update_wins decides one of the conflict types it looks for (Locks).
func TestLocalQuery(t *testing.T) {
	m := &Table{Name: `"public"."t"`, Columns: []Column{{Name: `"id"`, Source: "id"}, {Name: `"v"`, Source: "v"}}}
	lww := &conflict.Config{Resolutions: map[conflict.Type]conflict.Resolution{conflict.UpdateOriginDiffers: conflict.LastUpdateWins}}
	ts := &Detection{TrackTS: true, Config: lww}
	noTS := &Detection{Config: &conflict.Config{}}
	const inner = `SELECT xmin AS pgr_xmin, tableoid AS pgr_tableoid, ctid AS pgr_ctid, "id", "v" FROM "public"."t" WHERE "id" = $1`
	const commitTS = `, (pg_catalog.date_part('epoch', ts."timestamp") * 1000000)::int8, o.roname`
	const joins = ` LEFT JOIN LATERAL pg_catalog.pg_xact_commit_timestamp_origin(r.pgr_xmin) ts ON true` +
		` LEFT JOIN pg_catalog.pg_replication_origin o ON o.roident = ts.roident`
	for _, c := range []struct {
		name string
		d    *Detection
		lock bool
		want string
	}{
		{"no commit timestamps", noTS, false, `SELECT r.* FROM (` + inner + `) r`},
		{"commit timestamps", ts, false, `SELECT r.*` + commitTS + ` FROM (` + inner + `) r` + joins},
		{"locked", ts, true, `SELECT r.*` + commitTS + ` FROM (` + inner + ` FOR UPDATE) r` + joins},
	} {
		if got := c.d.LocalQuery(m, []byte(`"id" = $1`), c.lock); got != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.name, got, c.want)
		}
	}
	if !ts.Locks(conflict.DeleteOriginDiffers, conflict.UpdateOriginDiffers) || ts.Locks(conflict.DeleteOriginDiffers) ||
		noTS.Locks(conflict.Types()...) {
		t.Error("Locks: want true only for a type resolved by last_update_wins")
	}
}

func detector(res map[conflict.Type]conflict.Resolution, now time.Time) *Detector {
	return &Detector{Detection: &Detection{Config: &conflict.Config{Resolutions: res}}, Now: func() time.Time { return now }}
}

// TestResolve: each resolution's decision, and last_update_wins by commit times, a source
// transaction whose commit has not arrived counting as committing now, equal times decided by
// the rows' text.
func TestResolve(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tbl := &Table{Name: `"public"."t"`}
	d := detector(map[conflict.Type]conflict.Resolution{
		conflict.UpdateOriginDiffers: conflict.LastUpdateWins, conflict.InsertExists: conflict.Error,
		conflict.UpdateMissing: conflict.ApplyRemote,
	}, t0)
	d.Source(42, &SourceCommit{Time: t0, Origin: "node_a", End: 0x100})
	d.OpSrc = d.SrcOf(0)

	c := d.NewConflict(conflict.UpdateMissing, tbl)
	if apply, stop := d.Resolve(c); !apply || stop != nil || c.Resolution != conflict.ApplyRemote {
		t.Errorf("apply_remote: apply %v, stop %v, resolution %v", apply, stop, c.Resolution)
	}
	if c.RemoteXid != 42 || c.RemoteOrigin != "node_a" || c.RemoteFinalLSN != 0x100 || c.Relation != tbl.Name {
		t.Errorf("report names %+v", c)
	}
	c = d.NewConflict(conflict.DeleteMissing, tbl) // the default: skip
	if apply, stop := d.Resolve(c); apply || stop != nil || c.Resolution != conflict.Skip {
		t.Errorf("skip: apply %v, stop %v, resolution %v", apply, stop, c.Resolution)
	}
	c = d.NewConflict(conflict.InsertExists, tbl)
	apply, stop := d.Resolve(c)
	if apply || stop == nil || !strings.Contains(stop.Hint, "Resolutions[conflict.InsertExists] to conflict.ApplyRemote") {
		t.Errorf("error: apply %v, stop %v", apply, stop)
	}
	if len(d.Reports) != 2 {
		t.Errorf("%d reports kept, want 2 (a conflict that stops is not reported at commit)", len(d.Reports))
	}

	row := func(v string) []conflict.ColumnValue { return []conflict.ColumnValue{{Name: "v", Value: str(v)}} }
	for _, c := range []struct {
		name   string
		remote time.Time // zero: the commit has not arrived (now is t0)
		local  time.Time
		rv, lv string
		wins   bool
	}{
		{"remote later", t0, t0.Add(-time.Second), "a", "b", true},
		{"local later", t0, t0.Add(time.Second), "a", "b", false},
		{"no local commit time", t0, time.Time{}, "a", "b", true},
		{"equal, remote row greater", t0, t0, "b", "a", true},
		{"equal, local row greater", t0, t0, "a", "b", false},
		{"equal rows", t0, t0, "a", "a", false},
		{"remote not committed yet, local earlier", time.Time{}, t0.Add(-time.Millisecond), "a", "b", true},
		{"remote not committed yet, local later", time.Time{}, t0.Add(time.Millisecond), "a", "b", false},
	} {
		d.OpSrc = Remote{Xid: 1, CommitTime: c.remote}
		r := d.NewConflict(conflict.UpdateOriginDiffers, tbl)
		r.Remote = row(c.rv)
		r.Local = []conflict.LocalRow{{CommitTime: c.local, Row: row(c.lv)}}
		apply, stop := d.Resolve(r)
		want := conflict.LocalWins
		if c.wins {
			want = conflict.RemoteWins
		}
		if apply != c.wins || stop != nil || r.Winner != want {
			t.Errorf("%s: apply %v (winner %v), want %v", c.name, apply, r.Winner, c.wins)
		}
	}
}

// TestReportsFollowTheTransaction: conflicts are counted once their target transaction commits,
// not those of a subtransaction rolled back, nor of a transaction rolled back.
func TestReportsFollowTheTransaction(t *testing.T) {
	d := detector(nil, time.Now())
	tbl := &Table{Name: `"t"`}
	report := func(ct conflict.Type) { d.Resolve(d.NewConflict(ct, tbl)) }
	var counts ConflictCounts
	d.Source(1, nil)
	report(conflict.UpdateMissing)
	d.Savepoint(5)
	report(conflict.DeleteMissing)
	d.RollbackTo(5)
	report(conflict.UpdateMissing)
	d.Committed(&counts, discard())
	if n, m := counts[conflict.UpdateMissing].Load(), counts[conflict.DeleteMissing].Load(); n != 2 || m != 0 {
		t.Errorf("update_missing %d (want 2), delete_missing %d (want 0)", n, m)
	}
	d.Source(2, nil)
	report(conflict.DeleteMissing)
	d.Rollback()
	d.Committed(&counts, discard())
	if m := counts[conflict.DeleteMissing].Load(); m != 0 {
		t.Errorf("delete_missing %d after a rollback, want 0", m)
	}
	// A report made before the commit arrived gets the commit's time, position and origin.
	d.Source(3, nil)
	c := d.NewConflict(conflict.UpdateMissing, tbl)
	d.Resolve(c)
	at := time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)
	d.Source(3, &SourceCommit{Time: at, Origin: "o", End: 0x200})
	d.CompleteReports()
	if !c.RemoteCommitTime.Equal(at) || c.RemoteOrigin != "o" || c.RemoteFinalLSN != 0x200 {
		t.Errorf("completed report %+v", c)
	}
	if len(d.Srcs) != 1 {
		t.Errorf("%d source transactions, want 1 (the commit of the one applied)", len(d.Srcs))
	}
}

// TestKeep: kept parameters survive the caller's buffers being reused, until ResetArgs.
func TestKeep(t *testing.T) {
	d := detector(nil, time.Now())
	buf := []byte("abc")
	at, n := d.Keep([][]byte{buf, nil}, []int16{1})
	copy(buf, "xyz")
	v, f := d.Kept(at, n)
	if string(v[0]) != "abc" || v[1] != nil || f[0] != 1 || f[1] != 0 {
		t.Errorf("kept %q %v", v, f)
	}
	d.ResetArgs()
	if len(d.argv) != 0 || len(d.arena) != 0 {
		t.Error("ResetArgs kept values")
	}
}

// TestDescriptions: the values of reports: text as it is, binary in hex, NULL as nil, values
// the source did not send left out of a row and named in an identity.
func TestDescriptions(t *testing.T) {
	tbl := &Table{Name: `"t"`, Columns: []Column{{Source: "id"}, {Source: "b"}, {Source: "big"}}, Key: []int{0}}
	row := RowOf(tbl, [][]byte{[]byte("1"), {0xde, 0xad}, nil}, []int16{0, 1, FmtUnchanged})
	b, _ := json.Marshal(row)
	if want := `[{"Name":"id","Value":"1"},{"Name":"b","Value":"\\xdead"}]`; string(b) != want {
		t.Errorf("row %s, want %s", b, want)
	}
	id := IdentityOf(tbl, []byte{1}, false, [][]byte{[]byte("1")}, []int16{0})
	if len(id) != 1 || id[0].Name != "id" || *id[0].Value != "1" {
		t.Errorf("key identity %+v", id)
	}
	// FULL: the shape names the columns compared (1), or IS NULL (2), or not compared (0).
	id = IdentityOf(tbl, []byte{1, 2, 0}, true, [][]byte{[]byte("1")}, []int16{0})
	if len(id) != 2 || id[0].Name != "id" || id[1].Name != "b" || id[1].Value != nil {
		t.Errorf("full identity %+v", id)
	}
}

// TestParseIndexes: which indexes allow ON CONFLICT DO NOTHING and which are looked up.
func TestParseIndexes(t *testing.T) {
	tbl := &Table{Columns: []Column{{Source: "id"}, {Source: "a"}, {Source: "b"}}}
	r := func(name, immediate, plain, cols string) [][]byte {
		return [][]byte{[]byte(name), []byte(immediate), []byte(plain), []byte(cols)}
	}
	ix := ParseIndexes([][][]byte{
		r("t_a_b", "t", "t", "a,b"),
		r("t_expr", "t", "f", ""), // an expression or partial index, or an exclusion constraint
		r("t_pkey", "t", "t", "id"),
		r("t_other", "t", "t", "id,dropped"), // a column the source does not send
	}, tbl)
	if !ix.OnConflict || len(ix.Unique) != 2 || ix.Unique[0].Name != "t_a_b" || ix.Unique[1].Name != "t_pkey" {
		t.Errorf("indexes %+v", ix)
	}
	if !ix.InUnique[0] || !ix.InUnique[1] || !ix.InUnique[2] {
		t.Errorf("columns in unique indexes %v", ix.InUnique)
	}
	if ix := ParseIndexes([][][]byte{r("t_pkey", "t", "t", "id"), r("t_a", "f", "t", "a")}, tbl); ix.OnConflict {
		t.Error("a deferrable index is an arbiter of ON CONFLICT")
	}
	if ix := ParseIndexes(nil, tbl); ix.OnConflict {
		t.Error("a table without indexes inserts with ON CONFLICT")
	}
}

// TestLogRows: the rows of the conflict log table, a value longer than the bound left out.
func TestLogRows(t *testing.T) {
	c := &conflict.Report{Type: conflict.InsertExists, Relation: `"public"."t"`, Resolution: conflict.Skip, RemoteXid: 9,
		RemoteFinalLSN: 0x1000, Remote: []conflict.ColumnValue{{Name: "id", Value: str("1")}, {Name: "v", Value: str("0123456789")}},
		Local: []conflict.LocalRow{{Xid: 3, Index: "t_pkey", Key: []conflict.ColumnValue{{Name: "id", Value: str("1")}},
			Row: []conflict.ColumnValue{{Name: "id", Value: str("1")}, {Name: "v", Value: nil}}}}}
	b, err := LogRows([]*conflict.Report{c}, "s1", 5)
	if err != nil {
		t.Fatal(err)
	}
	want := `[{"slot":"s1","conflict":"insert_exists","relation":"\"public\".\"t\"","resolution":"skip","remote_xid":9,` +
		`"remote_final_lsn":"0/1000","remote_commit_ts":null,"remote_origin":null,"replica_identity":null,` +
		`"remote_tuple":{"id":"1","v":{"omitted_bytes":10}},` +
		`"local_conflicts":[{"xid":3,"commit_ts":null,"origin":null,"index":"t_pkey","key":{"id":"1"},"tuple":{"id":"1","v":null}}],` +
		`"note":null}]`
	if string(b) != want {
		t.Errorf("rows\n got %s\nwant %s", b, want)
	}
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }
