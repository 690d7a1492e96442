package target

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/apply/conflict"
	"github.com/pgreorder/pgreorder/apply/internal/detect"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/pgsession"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestCoalesceModel applies random sequences of changes on a few keys, in groups of source
// transactions, twice: set-based (Coalesce) into one table and row by row into another, both
// starting from the same rows, which differ from what the source had (rows deleted on the
// target, and rows the source never had), so that updates, deletes and inserts conflict. The two
// tables must end identical, with the same conflicts counted and the same errors, with
// conflict detection off and on. Updates with unchanged TOASTed values and updates of the key
// are among the changes (they go row by row). The table is keyed by its primary key, or is
// REPLICA IDENTITY FULL with a unique index on a NOT NULL column on the target (full), whose
// target rows also differ from the source's in the other columns, so that an update or delete
// finds no row equal to its old row although its key is there.
func TestCoalesceModel(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := strings.TrimSpace(pgtestSeed()); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (PGREORDER_TEST_SEED=%d repeats it)", seed, seed)
	pgtest.EachMajor(t, pgtest.Majors(t), func(t *testing.T, srv *Server) {
		dsn := srv.ConnString(pgtest.NewDatabase(t, srv))
		for _, full := range []bool{false, true} {
			for _, detecting := range []bool{false, true} {
				t.Run(fmt.Sprintf("full=%v/detecting=%v", full, detecting), func(t *testing.T) {
					rng := rand.New(rand.NewPCG(seed, uint64(srv.Major())))
					runCoalesceModel(t, dsn, rng, full, detecting)
				})
			}
		}
	})
}

type Server = pgtest.Server

func pgtestSeed() string { return os.Getenv("PGREORDER_TEST_SEED") }

// modelRow is a row of the model table t(k int PRIMARY KEY, v text, n int), or with full
// t(k int NOT NULL UNIQUE, v text, n int), REPLICA IDENTITY FULL on the source.
type modelRow struct {
	v *string
	n int
}

func runCoalesceModel(t *testing.T, dsn string, rng *rand.Rand, full, detecting bool) {
	ctx := pgtest.Context(t, 3*time.Minute)
	name := strconv.FormatBool(detecting)
	table, identity, keyFlag := "t (k int PRIMARY KEY, v text, n int)", byte('d'), uint8(0)
	if full {
		name += "_full"
		table, identity, keyFlag = "t (k int NOT NULL UNIQUE, v text, n int)", 'f', 1 // every column "key", as pgoutput sends FULL
	}
	schemas := []string{"set_" + name, "row_" + name}
	for _, s := range schemas {
		pgtest.ExecAll(t, dsn, "CREATE SCHEMA "+s, "CREATE TABLE "+s+"."+table,
			"CREATE TABLE "+s+".progress (slot text PRIMARY KEY, end_lsn pg_lsn NOT NULL, system_id text, timeline int)")
	}
	var stats [2]Counters
	conns := make([]*Conn, 2)
	rels := make([]*Relation, 2)
	for i, s := range schemas {
		c := testConn(ctx, t, dsn, "model", s+".progress", &stats[i])
		if detecting {
			c.SetDetection(&detect.Detection{Config: &conflict.Config{Resolutions: map[conflict.Type]conflict.Resolution{
				conflict.InsertExists: conflict.Skip}}, Log: slog.New(slog.DiscardHandler)})
		}
		conns[i] = c
		rels[i] = NewRegistry().Intern(&decoding.Relation{RelationID: 1, Namespace: s, Name: "t", ReplicaIdentity: identity,
			Columns: []decoding.RelationColumn{{Flags: 1, Name: "k", TypeOID: 23}, {Flags: keyFlag, Name: "v", TypeOID: 25},
				{Flags: keyFlag, Name: "n", TypeOID: 23}}}, nil)
	}
	values := []string{"a", "", `q"uote`, `back\slash`, "com,ma", "{brace}", "NULL", " spaced ", "ü"}
	val := func() *string {
		if rng.IntN(6) == 0 {
			return nil
		}
		v := values[rng.IntN(len(values))]
		return &v
	}
	text := func(s string) decoding.Column { return decoding.Column{Kind: decoding.ColumnText, Data: []byte(s)} }
	tuple := func(k int, r modelRow) decoding.Tuple {
		tup := decoding.Tuple{text(strconv.Itoa(k)), {Kind: decoding.ColumnNull}, text(strconv.Itoa(r.n))}
		if r.v != nil {
			tup[1] = text(*r.v)
		}
		return tup
	}
	// old is what an update or delete of k, whose row on the source is r, names it by.
	old := func(k int, r modelRow) (byte, decoding.Tuple) {
		if full {
			return 'O', tuple(k, r)
		}
		return 'K', decoding.Tuple{text(strconv.Itoa(k)), {Kind: decoding.ColumnNull}, {Kind: decoding.ColumnNull}}
	}
	heldChanges := 0 // rounds in which updates or deletes were held for set statements
	stepwise := 0    // transactions applied again one statement at a time (ErrOutOfOrder)
	const keys = 6
	const rounds = 40
	src := map[int]modelRow{} // what the source has
	var lsn decoding.LSN
	xid := uint32(1000)
	covered := func() bool {
		var total int64
		for ct := range stats[1].Conflicts {
			total += stats[1].Conflicts[ct].Load()
		}
		return conns[0].setDone > 0 && conns[0].setFallbacks > 0 && total > 0 && heldChanges > 0
	}
	// Past the rounds, up to three times as many more while what the model must exercise is not
	// yet covered (some seeds make every set statement of a variant meet a conflict): in those,
	// while no set statement succeeded, the target starts from the source's rows as they are.
	ran := 0
	for round := 0; round < rounds || (!covered() && round < 4*rounds); round++ {
		ran++
		clean := round >= rounds && conns[0].setDone == 0
		// The target starts each round from the source's rows, a few of them deleted locally and a
		// few local rows added.
		var load []string
		for _, s := range schemas {
			load = append(load, "TRUNCATE "+s+".t")
		}
		for k := 1; k <= keys; k++ {
			r, ok := src[k]
			switch {
			case clean && !ok:
				continue
			case clean:
			case ok && rng.IntN(5) == 0:
				continue // deleted on the target
			case ok && full && rng.IntN(4) == 0:
				// Another row of the key on the target: a FULL old row does not match it.
				if rng.IntN(2) == 0 {
					r.n += 1000
				} else if r.v == nil {
					r.v = &values[0]
				} else {
					r.v = nil
				}
			case !ok && rng.IntN(8) == 0:
				r = modelRow{v: val(), n: -k} // a row only the target has
			case !ok:
				continue
			}
			for _, s := range schemas {
				v := "NULL"
				if r.v != nil {
					v = "'" + strings.ReplaceAll(*r.v, "'", "''") + "'"
				}
				load = append(load, fmt.Sprintf("INSERT INTO %s.t VALUES (%d, %s, %d)", s, k, v, r.n))
			}
		}
		pgtest.ExecAll(t, dsn, load...)
		// A group: a few source transactions, a few changes each, valid on the source.
		type change struct {
			xid uint32
			m   decoding.Message
		}
		var changes []change
		for range 1 + rng.IntN(5) {
			xid++
			for range 1 + rng.IntN(6) {
				k := 1 + rng.IntN(keys)
				r, present := src[k]
				var m decoding.Message
				switch {
				case !present:
					r = modelRow{v: val(), n: rng.IntN(100)}
					src[k] = r
					m = &decoding.Insert{RelationID: 1, New: tuple(k, r)}
				case rng.IntN(4) == 0:
					delete(src, k)
					kind, o := old(k, r)
					m = &decoding.Delete{RelationID: 1, OldKind: kind, Old: o}
				case rng.IntN(8) == 0:
					// An update of the key, to a key the source does not have.
					nk := 1 + rng.IntN(keys)
					if _, taken := src[nk]; taken {
						continue
					}
					delete(src, k)
					kind, o := old(k, r)
					r.n = rng.IntN(100)
					src[nk] = r
					m = &decoding.Update{RelationID: 1, OldKind: kind, Old: o, New: tuple(nk, r)}
				default:
					var kind byte
					var o decoding.Tuple
					if full {
						kind, o = old(k, r)
					}
					r.n = rng.IntN(100)
					newTup := tuple(k, r)
					if rng.IntN(4) == 0 {
						newTup[1] = decoding.Column{Kind: decoding.ColumnUnchanged} // v unchanged, TOASTed
					} else {
						r.v = val()
						newTup = tuple(k, r)
					}
					src[k] = r
					m = &decoding.Update{RelationID: 1, OldKind: kind, Old: o, New: newTup}
				}
				changes = append(changes, change{xid, m})
			}
		}
		lsn += 100
		var errs [2]error
		for i, c := range conns {
		again:
			var last uint32
			for j, ch := range changes {
				if j == 0 {
					c.Begin(ch.xid, nil)
				}
				if ch.xid != last {
					c.Source(ch.xid, &detect.SourceCommit{Time: time.Now(), End: lsn})
					last = ch.xid
				}
				c.Coalesce(i == 0)
				if errs[i] = c.Change(ctx, ch.m, rels[i:i+1]); errs[i] != nil {
					break
				}
			}
			if errs[i] == nil && i == 0 && len(c.co.order) > 0 {
				if nt := c.co.order[0]; !nt.rowPath && slices.ContainsFunc(nt.log, func(h held) bool { return h.op != 'I' }) {
					heldChanges++
				}
			}
			if errs[i] == nil {
				errs[i] = c.Commit(ctx, ProgressKey{Slot: "s", System: "1", Timeline: 1}, lsn, false)
			}
			if errs[i] != nil {
				if err := c.Rollback(ctx); err != nil {
					t.Fatalf("round %d: rollback: %v", round, err)
				}
				if errors.Is(errs[i], ErrOutOfOrder) && !c.stepwise {
					// As package apply does: the transaction again, one statement at a time.
					stepwise++
					c.Stepwise(true)
					goto again
				}
			}
			c.Stepwise(false)
		}
		if (errs[0] == nil) != (errs[1] == nil) || (errs[0] != nil && errKind(errs[0]) != errKind(errs[1])) {
			t.Fatalf("round %d: set-based: %v; row by row: %v", round, errs[0], errs[1])
		}
		var contents [2][]string
		for i, s := range schemas {
			rows, err := Query(ctx, conns[i].PG(), "SELECT k::text || ':' || coalesce(v, '<null>') || ':' || n::text FROM "+s+".t ORDER BY k")
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rows {
				contents[i] = append(contents[i], string(r[0]))
			}
		}
		if !slices.Equal(contents[0], contents[1]) {
			t.Fatalf("round %d (%d changes): set-based left %q, row by row %q", round, len(changes), contents[0], contents[1])
		}
		for ct := range stats[0].Conflicts {
			if a, b := stats[0].Conflicts[ct].Load(), stats[1].Conflicts[ct].Load(); a != b {
				t.Fatalf("round %d: %d conflicts of type %d set-based, %d row by row", round, a, ct, b)
			}
		}
		// The model's source goes on from what the target holds.
		src = map[int]modelRow{}
		rows, err := Query(ctx, conns[1].PG(), "SELECT k, v, n FROM "+schemas[1]+".t")
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			k, _ := strconv.Atoi(string(r[0]))
			n, _ := strconv.Atoi(string(r[2]))
			row := modelRow{n: n}
			if r[1] != nil {
				v := string(r[1])
				row.v = &v
			}
			src[k] = row
		}
	}
	var total int64
	for ct := range stats[1].Conflicts {
		total += stats[1].Conflicts[ct].Load()
	}
	t.Logf("statements: %d set-based, %d row by row; %d conflicts; set statements succeeded in %d groups, fell back in %d; "+
		"updates or deletes held in %d of %d rounds; %d transactions applied again one statement at a time",
		stats[0].Statements.Load(), stats[1].Statements.Load(), total, conns[0].setDone, conns[0].setFallbacks, heldChanges,
		ran, stepwise)
	if !covered() {
		t.Error("the model does not exercise both the set statements and their fallback")
	}
}

// errKind is what the model compares of an error: its kind and operation.
func errKind(err error) string {
	var ce *ChangeError
	if errors.As(err, &ce) {
		return fmt.Sprintf("%v/%v", ce.Kind, ce.Op)
	}
	return err.Error()
}

// TestCoalesceFallbacks checks which tables' changes are held for set statements and which go
// row by row, and that each ends as the source's rows: a table with a trigger that fires for
// the session, one with a unique index besides the key, a REPLICA IDENTITY FULL table (inserts
// held until an update), an update of the key, and an update with an unchanged TOASTed value
// of a row not held.
func TestCoalesceFallbacks(t *testing.T) {
	pgtest.EachMajor(t, pgtest.Majors(t), func(t *testing.T, srv *Server) {
		ctx := pgtest.Context(t, time.Minute)
		dsn := srv.ConnString(pgtest.NewDatabase(t, srv))
		pgtest.ExecAll(t, dsn,
			"CREATE TABLE public.plain (k int PRIMARY KEY, v text)",
			"CREATE TABLE public.trig (k int PRIMARY KEY, v text)",
			"CREATE TABLE public.seen (n int)",
			"CREATE FUNCTION public.count_row() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN INSERT INTO public.seen VALUES (1); RETURN NEW; END$$",
			"CREATE TRIGGER t BEFORE INSERT OR UPDATE ON public.trig FOR EACH ROW EXECUTE FUNCTION public.count_row()",
			"ALTER TABLE public.trig ENABLE ALWAYS TRIGGER t",
			"CREATE TABLE public.uniq (k int PRIMARY KEY, v text UNIQUE)",
			"CREATE TABLE public.full_t (a int, v text)",
			"CREATE TABLE public.keyupd (k int PRIMARY KEY, v text)",
			"CREATE TABLE public.toast (k int PRIMARY KEY, v text)",
			"INSERT INTO public.toast VALUES (1, 'big')", "INSERT INTO public.keyupd VALUES (1, 'x')",
			"CREATE TABLE public.progress (slot text PRIMARY KEY, end_lsn pg_lsn NOT NULL, system_id text, timeline int)")
		var stats Counters
		c := testConn(ctx, t, dsn, "fallbacks", "public.progress", &stats)
		reg := NewRegistry()
		rel := func(id uint32, name string, identity byte) *Relation {
			keyFlag := uint8(1)
			if identity == 'f' {
				keyFlag = 0
			}
			return reg.Intern(&decoding.Relation{RelationID: id, Namespace: "public", Name: name, ReplicaIdentity: identity,
				Columns: []decoding.RelationColumn{{Flags: keyFlag, Name: colName(name), TypeOID: 23}, {Name: "v", TypeOID: 25}}}, nil)
		}
		txt := func(s string) decoding.Column { return decoding.Column{Kind: decoding.ColumnText, Data: []byte(s)} }
		null := decoding.Column{Kind: decoding.ColumnNull}
		row := func(k, v string) decoding.Tuple { return decoding.Tuple{txt(k), txt(v)} }
		rels := map[string]*Relation{"plain": rel(1, "plain", 'd'), "trig": rel(2, "trig", 'd'), "uniq": rel(3, "uniq", 'd'),
			"full_t": rel(4, "full_t", 'f'), "keyupd": rel(5, "keyupd", 'd'), "toast": rel(6, "toast", 'd')}
		apply := func(name string, m decoding.Message) {
			t.Helper()
			if err := c.Change(ctx, m, []*Relation{rels[name]}); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		}
		c.Begin(1, nil)
		c.Coalesce(true)
		for _, name := range []string{"plain", "trig", "uniq", "full_t"} {
			apply(name, &decoding.Insert{New: row("1", "a")})
			apply(name, &decoding.Insert{New: row("2", "b")})
		}
		apply("plain", &decoding.Update{New: row("1", "a2")})
		apply("plain", &decoding.Delete{OldKind: 'K', Old: decoding.Tuple{txt("2"), null}})
		apply("trig", &decoding.Update{New: row("1", "a2")})
		apply("uniq", &decoding.Update{New: row("1", "a2")})
		apply("keyupd", &decoding.Update{New: row("1", "y")})
		held := func(name string) bool {
			t.Helper()
			m, err := c.Mapping(ctx, rels[name], OpInsert)
			if err != nil {
				t.Fatal(err)
			}
			nt := c.co.tables[m]
			return nt != nil && !nt.rowPath && len(nt.log) > 0
		}
		for name, want := range map[string]bool{"plain": true, "trig": false, "uniq": false, "full_t": true, "keyupd": true} {
			if got := held(name); got != want {
				t.Errorf("%s: held %v, want %v", name, got, want)
			}
		}
		// An update of a FULL table, an update of the key, an unchanged value of a row not held.
		apply("full_t", &decoding.Update{OldKind: 'O', Old: row("2", "b"), New: row("2", "b2")})
		apply("keyupd", &decoding.Update{OldKind: 'K', Old: decoding.Tuple{txt("1"), null}, New: row("3", "z")})
		apply("toast", &decoding.Update{New: decoding.Tuple{txt("1"), {Kind: decoding.ColumnUnchanged}}})
		for _, name := range []string{"full_t", "keyupd", "toast"} {
			if held(name) {
				t.Errorf("%s: held after a change that goes row by row", name)
			}
		}
		if err := c.Commit(ctx, ProgressKey{Slot: "s", System: "1", Timeline: 1}, 100, false); err != nil {
			t.Fatal(err)
		}
		for q, want := range map[string]string{
			"SELECT string_agg(k || '=' || v, ',' ORDER BY k) FROM public.plain":  "1=a2",
			"SELECT string_agg(k || '=' || v, ',' ORDER BY k) FROM public.trig":   "1=a2,2=b",
			"SELECT string_agg(k || '=' || v, ',' ORDER BY k) FROM public.uniq":   "1=a2,2=b",
			"SELECT string_agg(a || '=' || v, ',' ORDER BY a) FROM public.full_t": "1=a,2=b2",
			"SELECT string_agg(k || '=' || v, ',' ORDER BY k) FROM public.keyupd": "3=z",
			"SELECT string_agg(k || '=' || v, ',' ORDER BY k) FROM public.toast":  "1=big",
			"SELECT count(*)::text FROM public.seen":                              "3", // the trigger saw every row change
		} {
			rows, err := Query(ctx, c.PG(), q)
			if err != nil {
				t.Fatal(err)
			}
			if got := string(rows[0][0]); got != want {
				t.Errorf("%s: %s, want %s", q, got, want)
			}
		}
		if c.setDone != 1 || c.setFallbacks != 0 {
			t.Errorf("set statements succeeded %d times, fell back %d times; want once and never", c.setDone, c.setFallbacks)
		}
	})
}

func colName(table string) string {
	if table == "full_t" {
		return "a"
	}
	return "k"
}

// testConn connects to dsn as application name for the test's duration, with progress (a
// qualified progress table) prepared.
func testConn(ctx context.Context, t *testing.T, dsn, name, progress string, stats *Counters) *Conn {
	t.Helper()
	c, err := Connect(ctx, &Options{ConnString: dsn, Logger: slog.New(slog.DiscardHandler), Now: time.Now}, name, stats)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	upsert, _ := ProgressSQL(progress)
	if err := c.PrepareProgress(ctx, upsert); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestSetStatementsProbe: the set statements of a large group find their rows through the
// key's index, one probe per row, even where the planner's costs would read the whole table (a
// random_page_cost that makes each probe look a hundred times a sequential page). The table's
// statistics must show as many index fetches as rows changed, give or take.
// After the commit, the session plans as the target's configuration says again (a database
// default kept, the others as they were).
func TestSetStatementsProbe(t *testing.T) {
	pgtest.EachMajor(t, pgtest.Majors(t), func(t *testing.T, srv *Server) {
		ctx := pgtest.Context(t, time.Minute)
		db := pgtest.NewDatabase(t, srv)
		dsn := srv.ConnString(db)
		pgtest.ExecAll(t, dsn,
			"CREATE TABLE public.big (k int PRIMARY KEY, v text)",
			"INSERT INTO public.big SELECT i, 'v' || i FROM generate_series(1, 20000) i",
			"ANALYZE public.big",
			"ALTER DATABASE "+pgsession.QuoteIdent(db)+" SET random_page_cost = 400",
			"ALTER DATABASE "+pgsession.QuoteIdent(db)+" SET enable_mergejoin = off",
			"CREATE TABLE public.progress (slot text PRIMARY KEY, end_lsn pg_lsn NOT NULL, system_id text, timeline int)")
		var stats Counters
		c := testConn(ctx, t, dsn, "probe", "public.progress", &stats)
		rel := NewRegistry().Intern(&decoding.Relation{RelationID: 1, Namespace: "public", Name: "big", ReplicaIdentity: 'd',
			Columns: []decoding.RelationColumn{{Flags: 1, Name: "k", TypeOID: 23}, {Name: "v", TypeOID: 25}}}, nil)
		txt := func(s string) decoding.Column { return decoding.Column{Kind: decoding.ColumnText, Data: []byte(s)} }
		scans := func() (seq, tup int64) {
			t.Helper()
			if _, err := Query(ctx, c.PG(), "SELECT pg_catalog.pg_stat_force_next_flush()"); err != nil {
				t.Fatal(err)
			}
			rows, err := Query(ctx, c.PG(), "SELECT seq_scan, idx_tup_fetch FROM pg_catalog.pg_stat_user_tables WHERE relname = 'big'")
			if err != nil {
				t.Fatal(err)
			}
			seq, _ = strconv.ParseInt(string(rows[0][0]), 10, 64)
			tup, _ = strconv.ParseInt(string(rows[0][1]), 10, 64)
			return seq, tup
		}
		_, tup0 := scans()
		c.Begin(1, nil)
		c.Coalesce(true)
		const updates, deletes = 1500, 500
		for i := range updates + deletes {
			k := strconv.Itoa(1 + i*9)
			var m decoding.Message = &decoding.Update{New: decoding.Tuple{txt(k), txt("new")}}
			if i >= updates {
				m = &decoding.Delete{OldKind: 'K', Old: decoding.Tuple{txt(k), {Kind: decoding.ColumnNull}}}
			}
			if err := c.Change(ctx, m, []*Relation{rel}); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Commit(ctx, ProgressKey{Slot: "s", System: "1", Timeline: 1}, 100, false); err != nil {
			t.Fatal(err)
		}
		if c.setDone != 1 || c.setFallbacks != 0 {
			t.Fatalf("set statements succeeded %d times, fell back %d times; want once and never", c.setDone, c.setFallbacks)
		}
		// Index fetches, counted by this session's own backend: one per change when the rows
		// are probed, none for a hash join or a scan, the whole index for a merge join. (Its
		// sequential scans are not compared: another backend's may arrive late.)
		_, tup1 := scans()
		if n := tup1 - tup0; n < updates+deletes || n > 2*(updates+deletes) {
			t.Errorf("the set statements fetched %d rows through the index for %d changes: not one probe per change", n, updates+deletes)
		}
		rows, err := Query(ctx, c.PG(), "SELECT pg_catalog.current_setting('enable_hashjoin') || ',' || pg_catalog.current_setting('enable_mergejoin') || ',' || "+
			"(SELECT count(*) FROM public.big WHERE v = 'new') || ',' || (SELECT count(*) FROM public.big)")
		if err != nil {
			t.Fatal(err)
		}
		if got, want := string(rows[0][0]), fmt.Sprintf("on,off,%d,%d", updates, 20000-deletes); got != want {
			t.Errorf("after the commit: %s, want %s (enable_hashjoin, enable_mergejoin, rows updated, rows)", got, want)
		}
	})
}
