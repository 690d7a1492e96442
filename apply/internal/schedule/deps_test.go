package schedule

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/pgreorder/pgreorder/decoding"
)

// Relations for the tracker's tests: keyed by id; keyed by two columns; REPLICA IDENTITY FULL;
// without any key.
var (
	relKeyed = &decoding.Relation{RelationID: 1, Name: "keyed", ReplicaIdentity: 'd', Columns: []decoding.RelationColumn{
		{Flags: 1, Name: "id", TypeOID: 23}, {Name: "v", TypeOID: 25}}}
	relPair = &decoding.Relation{RelationID: 2, Name: "pair", ReplicaIdentity: 'i', Columns: []decoding.RelationColumn{
		{Flags: 1, Name: "a", TypeOID: 23}, {Flags: 1, Name: "b", TypeOID: 23}, {Name: "v", TypeOID: 25}}}
	relFull = &decoding.Relation{RelationID: 3, Name: "full", ReplicaIdentity: 'f', Columns: []decoding.RelationColumn{
		{Flags: 1, Name: "k", TypeOID: 23}, {Flags: 1, Name: "v", TypeOID: 25}}}
	relNone = &decoding.Relation{RelationID: 4, Name: "none", ReplicaIdentity: 'd', Columns: []decoding.RelationColumn{
		{Name: "k", TypeOID: 23}}}
)

func tup(vals ...string) decoding.Tuple {
	t := make(decoding.Tuple, len(vals))
	for i, v := range vals {
		switch v {
		case "NULL":
			t[i] = decoding.Column{Kind: decoding.ColumnNull}
		case "TOAST":
			t[i] = decoding.Column{Kind: decoding.ColumnUnchanged}
		default:
			t[i] = decoding.Column{Kind: decoding.ColumnText, Data: []byte(v)}
		}
	}
	return t
}

func jobSeq(seq uint64) *Job {
	j := &Job{}
	j.Seq.Store(seq)
	return j
}

// TestTracker feeds changes of transactions 1, 2, 3... in commit order and checks what each
// waits for and which become serial.
func TestTracker(t *testing.T) {
	type step struct {
		seq      uint64
		rel      *decoding.Relation
		m        decoding.Message
		triggers bool
		key      []int     // ChangeDeps' key: a FULL relation's target key
		forms    []KeyForm // ChangeDeps' forms
		wait     uint64
		serial   bool
	}
	ins := func(r *decoding.Relation, vals ...string) decoding.Message {
		return &decoding.Insert{RelationID: r.RelationID, New: tup(vals...)}
	}
	upd := func(r *decoding.Relation, vals ...string) decoding.Message {
		return &decoding.Update{RelationID: r.RelationID, New: tup(vals...)}
	}
	updKey := func(r *decoding.Relation, old, new []string) decoding.Message {
		return &decoding.Update{RelationID: r.RelationID, OldKind: 'K', Old: tup(old...), New: tup(new...)}
	}
	del := func(r *decoding.Relation, vals ...string) decoding.Message {
		return &decoding.Delete{RelationID: r.RelationID, OldKind: 'K', Old: tup(vals...)}
	}
	fullUpd := func(oldK, oldV, newK, newV string) decoding.Message {
		return &decoding.Update{RelationID: relFull.RelationID, OldKind: 'O', Old: tup(oldK, oldV), New: tup(newK, newV)}
	}
	fullDel := func(k, v string) decoding.Message {
		return &decoding.Delete{RelationID: relFull.RelationID, OldKind: 'O', Old: tup(k, v)}
	}
	numeric := []KeyForm{KeyNumeric}
	cases := []struct {
		name     string
		steps    []step
		released []uint64 // committed (released) before the last step
	}{
		{name: "independent rows", steps: []step{
			{seq: 1, rel: relKeyed, m: ins(relKeyed, "1", "a")},
			{seq: 2, rel: relKeyed, m: ins(relKeyed, "2", "b")},
			{seq: 3, rel: relKeyed, m: upd(relKeyed, "3", "c")},
		}},
		{name: "same row waits for the last toucher", steps: []step{
			{seq: 1, rel: relKeyed, m: ins(relKeyed, "1", "a")},
			{seq: 2, rel: relKeyed, m: upd(relKeyed, "1", "b"), wait: 1},
			{seq: 3, rel: relKeyed, m: del(relKeyed, "1", "NULL"), wait: 2},
		}},
		{name: "the same transaction does not wait for itself", steps: []step{
			{seq: 1, rel: relKeyed, m: ins(relKeyed, "1", "a")},
			{seq: 1, rel: relKeyed, m: upd(relKeyed, "1", "b")},
		}},
		{name: "same values in another relation", steps: []step{
			{seq: 1, rel: relKeyed, m: ins(relKeyed, "1", "a")},
			{seq: 2, rel: relNone, m: ins(relNone, "1")},
			{seq: 3, rel: relPair, m: ins(relPair, "1", "1", "x")},
		}},
		{name: "a key change depends on both keys", steps: []step{
			{seq: 1, rel: relKeyed, m: ins(relKeyed, "5", "a")},
			{seq: 2, rel: relKeyed, m: ins(relKeyed, "9", "b")},
			{seq: 3, rel: relKeyed, m: updKey(relKeyed, []string{"5", "NULL"}, []string{"6", "a"}), wait: 1},
			{seq: 4, rel: relKeyed, m: ins(relKeyed, "6", "c"), wait: 3},
			{seq: 5, rel: relKeyed, m: ins(relKeyed, "5", "d"), wait: 3},
		}},
		{name: "composite keys", steps: []step{
			{seq: 1, rel: relPair, m: ins(relPair, "1", "2", "x")},
			{seq: 2, rel: relPair, m: ins(relPair, "2", "1", "x")},
			{seq: 3, rel: relPair, m: ins(relPair, "12", "", "x")},
			{seq: 4, rel: relPair, m: del(relPair, "1", "2", "NULL"), wait: 1},
		}},
		{name: "committed transactions are forgotten", released: []uint64{1}, steps: []step{
			{seq: 1, rel: relKeyed, m: ins(relKeyed, "1", "a")},
			{seq: 2, rel: relKeyed, m: upd(relKeyed, "1", "b")},
		}},
		{name: "keyless inserts conflict with nothing", steps: []step{
			{seq: 1, rel: relFull, m: ins(relFull, "1", "a")},
			{seq: 2, rel: relFull, m: ins(relFull, "1", "a")},
			{seq: 3, rel: relNone, m: ins(relNone, "1")},
		}},
		{name: "FULL identity update is serial, and a barrier", steps: []step{
			{seq: 1, rel: relKeyed, m: ins(relKeyed, "1", "a")},
			{seq: 2, rel: relFull, m: &decoding.Update{RelationID: 3, OldKind: 'O', Old: tup("1", "a"), New: tup("1", "b")}, wait: 1, serial: true},
			{seq: 3, rel: relKeyed, m: ins(relKeyed, "7", "x"), wait: 2},
		}},
		{name: "FULL identity keyed by the target's key: other rows are independent", steps: []step{
			{seq: 1, rel: relFull, key: []int{0}, m: fullUpd("1", "a", "1", "b")},
			{seq: 2, rel: relFull, key: []int{0}, m: fullUpd("2", "a", "2", "b")},
			{seq: 3, rel: relFull, key: []int{0}, m: fullDel("3", "c")},
			{seq: 4, rel: relKeyed, m: ins(relKeyed, "1", "x")},
		}},
		{name: "FULL identity keyed by the target's key: the same row waits", steps: []step{
			{seq: 1, rel: relFull, key: []int{0}, m: fullUpd("1", "a", "1", "b")},
			{seq: 2, rel: relFull, key: []int{0}, m: fullDel("1", "b"), wait: 1},
			{seq: 3, rel: relFull, key: []int{0}, m: ins(relFull, "1", "c"), wait: 2},
			{seq: 4, rel: relFull, key: []int{0}, m: fullUpd("1", "c", "2", "c"), wait: 3},
			{seq: 5, rel: relFull, key: []int{0}, m: ins(relFull, "2", "d"), wait: 4},
		}},
		{name: "FULL identity keyed by two columns", steps: []step{
			{seq: 1, rel: relFull, key: []int{0, 1}, m: fullUpd("1", "a", "1", "a")},
			{seq: 2, rel: relFull, key: []int{0, 1}, m: fullDel("1", "b")},
			{seq: 3, rel: relFull, key: []int{0, 1}, m: fullDel("1", "a"), wait: 1},
		}},
		{name: "a key is ignored for a relation with a replica identity key", steps: []step{
			{seq: 1, rel: relKeyed, key: []int{1}, m: ins(relKeyed, "1", "a")},
			{seq: 2, rel: relKeyed, key: []int{1}, m: ins(relKeyed, "2", "a")},
		}},
		{name: "TRUNCATE is serial", steps: []step{
			{seq: 1, rel: relKeyed, m: ins(relKeyed, "1", "a")},
			{seq: 2, rel: relKeyed, m: &decoding.Truncate{RelationIDs: []uint32{1}}, wait: 1, serial: true},
			{seq: 3, rel: relKeyed, m: ins(relKeyed, "1", "a"), wait: 2},
		}},
		{name: "triggers on the target are serial", steps: []step{
			{seq: 1, rel: relKeyed, m: ins(relKeyed, "1", "a")},
			{seq: 2, rel: relKeyed, m: ins(relKeyed, "2", "a"), triggers: true, wait: 1, serial: true},
			{seq: 3, rel: relKeyed, m: ins(relKeyed, "3", "a"), wait: 2},
		}},
		{name: "an unchanged TOASTed key makes it serial", steps: []step{
			{seq: 1, rel: relKeyed, m: upd(relKeyed, "TOAST", "a"), serial: true},
			{seq: 2, rel: relKeyed, m: ins(relKeyed, "3", "a"), wait: 1},
		}},
		{name: "numeric keys equal but sent differently are the same row", steps: []step{
			{seq: 1, rel: relKeyed, forms: numeric, m: del(relKeyed, "1.0", "NULL")},
			{seq: 2, rel: relKeyed, forms: numeric, m: ins(relKeyed, "1.00", "a"), wait: 1},
			{seq: 3, rel: relKeyed, forms: numeric, m: ins(relKeyed, "1", "a"), wait: 2},
			{seq: 4, rel: relKeyed, forms: numeric, m: ins(relKeyed, "10", "a")},
			{seq: 5, rel: relKeyed, forms: numeric, m: ins(relKeyed, "10.000", "a"), wait: 4},
			{seq: 6, rel: relKeyed, forms: numeric, m: ins(relKeyed, "100", "a")},
			{seq: 7, rel: relKeyed, forms: numeric, m: ins(relKeyed, "-0.0", "a")},
			{seq: 8, rel: relKeyed, forms: numeric, m: ins(relKeyed, "0", "a"), wait: 7},
		}},
		{name: "without the numeric form, 1.0 and 1.00 are other rows", steps: []step{
			{seq: 1, rel: relKeyed, m: del(relKeyed, "1.0", "NULL")},
			{seq: 2, rel: relKeyed, m: ins(relKeyed, "1.00", "a")},
		}},
		{name: "float -0 is 0", steps: []step{
			{seq: 1, rel: relKeyed, forms: []KeyForm{KeyFloat}, m: ins(relKeyed, "-0", "a")},
			{seq: 2, rel: relKeyed, forms: []KeyForm{KeyFloat}, m: del(relKeyed, "0", "NULL"), wait: 1},
			{seq: 3, rel: relKeyed, forms: []KeyForm{KeyFloat}, m: ins(relKeyed, "-0.5", "a")},
		}},
		{name: "character(n) ignores trailing spaces", steps: []step{
			{seq: 1, rel: relKeyed, forms: []KeyForm{KeyPadded}, m: ins(relKeyed, "ab  ", "a")},
			{seq: 2, rel: relKeyed, forms: []KeyForm{KeyPadded}, m: del(relKeyed, "ab", "NULL"), wait: 1},
			{seq: 3, rel: relKeyed, forms: []KeyForm{KeyPadded}, m: ins(relKeyed, " ab", "a")},
		}},
		{name: "an opaque key makes inserts, updates and deletes serial", steps: []step{
			{seq: 1, rel: relKeyed, forms: []KeyForm{KeyOpaque}, m: ins(relKeyed, "a", "x"), serial: true},
			{seq: 2, rel: relKeyed, forms: []KeyForm{KeyOpaque}, m: upd(relKeyed, "b", "x"), wait: 1, serial: true},
			{seq: 3, rel: relKeyed, forms: []KeyForm{KeyOpaque}, m: del(relKeyed, "c", "NULL"), wait: 2, serial: true},
			{seq: 4, rel: relKeyed, forms: []KeyForm{KeyExact, KeyOpaque}, m: ins(relKeyed, "4", "x"), wait: 3}, // not a key column
		}},
		{name: "a binary value of a form other than exact is opaque", steps: []step{
			{seq: 1, rel: relKeyed, forms: numeric, m: &decoding.Insert{RelationID: 1,
				New: decoding.Tuple{{Kind: decoding.ColumnBinary, Data: []byte{0, 1}}, {Kind: decoding.ColumnNull}}}, serial: true},
			{seq: 2, rel: relKeyed, m: &decoding.Insert{RelationID: 1,
				New: decoding.Tuple{{Kind: decoding.ColumnBinary, Data: []byte{0, 2}}, {Kind: decoding.ColumnNull}}}, wait: 1},
		}},
		{name: "a FULL relation's target key is canonical too", steps: []step{
			{seq: 1, rel: relFull, key: []int{0}, forms: numeric, m: fullDel("2.50", "a")},
			{seq: 2, rel: relFull, key: []int{0}, forms: numeric, m: ins(relFull, "2.5", "b"), wait: 1},
		}},
		{name: "NULL and empty keys differ", steps: []step{
			{seq: 1, rel: relPair, m: ins(relPair, "1", "NULL", "x")},
			{seq: 2, rel: relPair, m: ins(relPair, "1", "", "x")},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr := NewTracker()
			jobs := map[uint64]*Job{}
			for i, s := range c.steps {
				if i == len(c.steps)-1 {
					for _, seq := range c.released {
						tr.Release(jobs[seq])
					}
				}
				j := jobs[s.seq]
				if j == nil {
					j = jobSeq(s.seq)
					jobs[s.seq] = j
				}
				d, serial := tr.ChangeDeps(j, s.rel, s.key, s.forms, s.m, s.triggers)
				wait := d.Max()
				if wait != s.wait || serial != s.serial {
					t.Errorf("step %d (transaction %d): wait %d serial %v, want wait %d serial %v", i, s.seq, wait, serial, s.wait, s.serial)
				}
			}
		})
	}
}

// TestKeyForms: the forms of target column types, and the canonical text of each form.
func TestKeyForms(t *testing.T) {
	for _, c := range []struct {
		oid              uint32
		nondeterministic bool
		want             KeyForm
	}{
		{23, false, KeyExact}, {20, false, KeyExact}, {2950, false, KeyExact}, {1184, false, KeyExact},
		{25, false, KeyExact}, {25, true, KeyOpaque}, {1043, true, KeyOpaque}, {1042, false, KeyPadded},
		{1042, true, KeyOpaque}, {1700, false, KeyNumeric}, {701, false, KeyFloat}, {700, false, KeyFloat},
		{1186, false, KeyOpaque}, {3802, false, KeyOpaque}, {1231, false, KeyOpaque}, {16385, false, KeyOpaque},
	} {
		if got := KeyFormOf(c.oid, c.nondeterministic); got != c.want {
			t.Errorf("KeyFormOf(%d, %v) = %d, want %d", c.oid, c.nondeterministic, got, c.want)
		}
	}
	for _, c := range []struct {
		form     KeyForm
		in, want string
	}{
		{KeyNumeric, "1.0", "1"}, {KeyNumeric, "1.500", "1.5"}, {KeyNumeric, "100", "100"},
		{KeyNumeric, "100.000", "100"}, {KeyNumeric, "-0.00", "0"}, {KeyNumeric, "0", "0"},
		{KeyNumeric, "-12.340", "-12.34"}, {KeyNumeric, "NaN", "NaN"}, {KeyNumeric, "Infinity", "Infinity"},
		{KeyFloat, "-0", "0"}, {KeyFloat, "-0.25", "-0.25"}, {KeyFloat, "1e+100", "1e+100"},
		{KeyPadded, "ab  ", "ab"}, {KeyPadded, " ab", " ab"}, {KeyPadded, "   ", ""},
		{KeyExact, "1.0 ", "1.0 "},
	} {
		if got := string(canonical(nil, c.form, []byte(c.in))); got != c.want {
			t.Errorf("canonical(%d, %q) = %q, want %q", c.form, c.in, got, c.want)
		}
	}
}

// TestTrackerWide checks that a transaction touching more keys than the tracker keeps becomes
// a barrier and keeps nothing.
func TestTrackerWide(t *testing.T) {
	tr := NewTracker()
	big := jobSeq(1)
	for i := range maxJobKeys + 10 {
		if wait, serial := tr.Change(big, relKeyed, &decoding.Insert{New: tup(strconv.Itoa(i), "x")}, false); wait != 0 || serial {
			t.Fatalf("row %d: wait %d serial %v", i, wait, serial)
		}
	}
	if !big.wide || len(tr.owners) != 0 {
		t.Fatalf("wide %v, %d keys kept", big.wide, len(tr.owners))
	}
	if wait, _ := tr.Change(jobSeq(2), relKeyed, &decoding.Insert{New: tup("-1", "x")}, false); wait != 1 {
		t.Fatalf("a later transaction waits for %d, want 1", wait)
	}
}

func BenchmarkTracker(b *testing.B) {
	for _, hot := range []int{16, 1 << 20} {
		b.Run(fmt.Sprintf("keys=%d", hot), func(b *testing.B) {
			tr := NewTracker()
			vals := make([][]byte, 4096)
			for i := range vals {
				vals[i] = []byte(strconv.Itoa(i * 7919 % hot))
			}
			m := &decoding.Update{RelationID: 1, New: tup("0", "payload")}
			var (
				seq      uint64
				j        *Job
				inFlight [8]*Job // eight transactions in flight: the oldest commits when one starts
			)
			waits := 0
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if i%4 == 0 { // four changes a transaction
					seq++
					slot := &inFlight[seq%uint64(len(inFlight))]
					if *slot != nil {
						tr.Release(*slot)
					}
					j = jobSeq(seq)
					*slot = j
				}
				m.New[0].Data = vals[i%len(vals)]
				if w, _ := tr.Change(j, relKeyed, m, false); w != 0 {
					waits++
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/change")
			b.ReportMetric(float64(waits)/float64(b.N), "waits/change")
		})
	}
}
