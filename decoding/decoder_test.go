package decoding_test

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/decoding"
)

func enc(t testing.TB, m decoding.Message, inStream bool, opts decoding.Options) []byte {
	t.Helper()
	b, err := decoding.Append(nil, m, inStream, opts)
	if err != nil {
		t.Fatalf("Append(%T): %v", m, err)
	}
	return b
}

var (
	ts    = time.Date(2024, 1, 2, 3, 4, 5, 678000, time.UTC)
	begin = &decoding.Begin{FinalLSN: 0x100, CommitTime: ts, Xid: 7}
	ins   = &decoding.Insert{Xid: 9, RelationID: 1, New: decoding.Tuple{{Kind: 't', Data: []byte("x")}}}
)

// step is one message fed to a Decoder and the sentinel it must produce (nil = accepted).
type step struct {
	m        decoding.Message
	inStream bool // encode with a leading xid
	want     error
}

func TestDecoderStateMachine(t *testing.T) {
	start := func(x uint32) *decoding.StreamStart { return &decoding.StreamStart{Xid: x, FirstSegment: true} }
	stop := &decoding.StreamStop{}
	commit := &decoding.Commit{CommitLSN: 0x100, EndLSN: 0x108, CommitTime: ts}
	bp := &decoding.BeginPrepare{Xid: 8, GID: "g"}
	prep := &decoding.Prepare{Xid: 8, GID: "g"}
	sc := &decoding.StreamCommit{Xid: 5}
	sa := &decoding.StreamAbort{Xid: 5, SubXid: 6}
	nontx := &decoding.LogicalMessage{Prefix: "p", Content: []byte("c")}
	tx := &decoding.LogicalMessage{Flags: 1, Prefix: "p"}
	origin := &decoding.Origin{Name: "o"}
	tests := []struct {
		name  string
		opts  decoding.Options
		steps []step
	}{
		{"begin commit", decoding.Options{}, []step{{begin, false, nil}, {origin, false, nil}, {ins, false, nil}, {tx, false, nil}, {commit, false, nil}}},
		{"stream block", decoding.Options{}, []step{{start(5), false, nil}, {origin, false, nil}, {ins, true, nil}, {stop, true, nil}, {sa, false, nil}, {sc, false, nil}}},
		{"stream start in block", decoding.Options{}, []step{{start(5), false, nil}, {start(6), false, decoding.ErrStreamStartInBlock}}},
		{"stream start in txn", decoding.Options{}, []step{{begin, false, nil}, {start(6), false, decoding.ErrBeginInTransaction}}},
		{"stream stop outside", decoding.Options{}, []step{{stop, false, decoding.ErrStreamStopOutsideBlock}}},
		{"change outside", decoding.Options{}, []step{{ins, false, decoding.ErrChangeOutsideTransaction}}},
		{"relation outside", decoding.Options{}, []step{{&decoding.Relation{Name: "r"}, false, decoding.ErrChangeOutsideTransaction}}},
		{"type outside", decoding.Options{}, []step{{&decoding.DataType{Name: "r"}, false, decoding.ErrChangeOutsideTransaction}}},
		{"origin outside", decoding.Options{}, []step{{origin, false, decoding.ErrChangeOutsideTransaction}}},
		{"tx message outside", decoding.Options{}, []step{{tx, false, decoding.ErrChangeOutsideTransaction}}},
		{"non-tx message anywhere", decoding.Options{}, []step{{nontx, false, nil}, {begin, false, nil}, {nontx, false, nil}, {commit, false, nil}, {start(5), false, nil}, {nontx, true, nil}, {stop, true, nil}}},
		{"begin in txn", decoding.Options{}, []step{{begin, false, nil}, {begin, false, decoding.ErrBeginInTransaction}}},
		{"begin in block", decoding.Options{}, []step{{start(5), false, nil}, {begin, false, decoding.ErrBeginInTransaction}}},
		{"begin prepare in txn", decoding.Options{}, []step{{begin, false, nil}, {bp, false, decoding.ErrBeginInTransaction}}},
		{"commit outside", decoding.Options{}, []step{{commit, false, decoding.ErrCommitOutsideTransaction}}},
		{"commit in block", decoding.Options{}, []step{{start(5), false, nil}, {commit, false, decoding.ErrCommitOutsideTransaction}}},
		{"prepare after begin", decoding.Options{}, []step{{begin, false, nil}, {prep, false, decoding.ErrCommitOutsideTransaction}}},
		{"commit after begin prepare", decoding.Options{}, []step{{bp, false, nil}, {commit, false, decoding.ErrCommitOutsideTransaction}, {prep, false, nil}}},
		{"stream commit in block", decoding.Options{}, []step{{start(5), false, nil}, {sc, false, decoding.ErrFinishInBlock}}},
		{"stream abort in block", decoding.Options{}, []step{{start(5), false, nil}, {sa, false, decoding.ErrFinishInBlock}}},
		{"stream prepare in block", decoding.Options{}, []step{{start(5), false, nil}, {&decoding.StreamPrepare{Xid: 5}, false, decoding.ErrFinishInBlock}}},
		{"commit prepared in block", decoding.Options{}, []step{{start(5), false, nil}, {&decoding.CommitPrepared{}, false, decoding.ErrFinishInBlock}}},
		{"rollback prepared in txn", decoding.Options{}, []step{{begin, false, nil}, {&decoding.RollbackPrepared{}, false, decoding.ErrFinishInTransaction}}},
		{"stream commit in txn", decoding.Options{}, []step{{begin, false, nil}, {sc, false, decoding.ErrFinishInTransaction}}},
		{"v1 rejects stream start", decoding.Options{ProtoVersion: 1}, []step{{start(5), false, decoding.ErrVersion}}},
		{"v2 rejects begin prepare", decoding.Options{ProtoVersion: 2}, []step{{bp, false, decoding.ErrVersion}}},
		{"v3 accepts two-phase", decoding.Options{ProtoVersion: 3}, []step{{bp, false, nil}, {prep, false, nil}, {&decoding.CommitPrepared{GID: "g"}, false, nil}}},
		// PostgreSQL 18 sends a Stream Abort for a top-level xid that never streamed, even on
		// protocol 1: accepted, so replication does not stop.
		{"v1 stray stream abort", decoding.Options{ProtoVersion: 1}, []step{{&decoding.StreamAbort{Xid: 5, SubXid: 5}, false, nil}, {begin, false, nil}, {ins, false, nil}, {commit, false, nil}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := decoding.NewDecoder(tt.opts)
			for i, s := range tt.steps {
				data := enc(t, s.m, s.inStream, decoding.Options{})
				inBlock, inTxn := d.InStream(), d.InTransaction()
				_, err := d.Decode(data)
				if !errors.Is(err, s.want) || (s.want == nil) != (err == nil) {
					t.Fatalf("step %d (%v): err = %v, want %v", i, s.m.Type(), err, s.want)
				}
				if err != nil {
					var de *decoding.DecodeError
					if !errors.As(err, &de) || de.Type != s.m.Type() {
						t.Fatalf("step %d: %v is not a *DecodeError for %v", i, err, s.m.Type())
					}
					if tt.opts.ProtoVersion == 0 && !errors.Is(err, decoding.ErrProtocolViolation) {
						t.Fatalf("step %d: %v does not wrap ErrProtocolViolation", i, err)
					}
					if d.InStream() != inBlock || d.InTransaction() != inTxn {
						t.Fatalf("step %d: state changed on error", i)
					}
				}
			}
		})
	}
}

func TestNextHeaderXid(t *testing.T) {
	d := decoding.NewDecoder(decoding.Options{})
	msgs := []struct {
		m        decoding.Message
		inStream bool
		xid      uint32
	}{
		{begin, false, 7},
		{&decoding.Insert{RelationID: 1, New: decoding.Tuple{{Kind: 'n'}}}, false, 7},
		{&decoding.Commit{}, false, 7},
		{&decoding.StreamStart{Xid: 20}, false, 20},
		{&decoding.Origin{}, false, 20},
		{&decoding.Insert{Xid: 21, RelationID: 1, New: decoding.Tuple{{Kind: 'u'}}}, true, 21},
		{&decoding.StreamStop{}, true, 20},
		{&decoding.StreamAbort{Xid: 20, SubXid: 21}, false, 20},
	}
	for i, tc := range msgs {
		h, err := d.Accept(enc(t, tc.m, tc.inStream, decoding.Options{}))
		if err != nil || h.Xid != tc.xid || h.Type != tc.m.Type() {
			t.Fatalf("msg %d: Next = %+v, %v; want xid %d", i, h, err, tc.xid)
		}
	}
}

func TestStreamAbortInfo(t *testing.T) {
	short := enc(t, &decoding.StreamAbort{Xid: 1, SubXid: 2}, false, decoding.Options{})
	long := enc(t, &decoding.StreamAbort{Xid: 1, SubXid: 2, HasAbortInfo: true, AbortLSN: 0x10, AbortTime: ts}, false, decoding.Options{})
	if len(short) != 9 || len(long) != 25 {
		t.Fatalf("lengths %d, %d; want 9, 25", len(short), len(long))
	}
	for _, tc := range []struct {
		mode    decoding.AbortInfo
		data    []byte
		ok      bool
		hasInfo bool
	}{
		{decoding.AbortInfoAuto, short, true, false},
		{decoding.AbortInfoAuto, long, true, true},
		{decoding.AbortInfoNever, short, true, false},
		{decoding.AbortInfoNever, long, false, false},
		{decoding.AbortInfoAlways, long, true, true},
		{decoding.AbortInfoAlways, short, false, false},
	} {
		m, err := decoding.Parse(tc.data, false, decoding.Options{AbortInfo: tc.mode})
		if (err == nil) != tc.ok {
			t.Errorf("mode %d len %d: err = %v", tc.mode, len(tc.data), err)
			continue
		}
		if err == nil {
			a := m.(*decoding.StreamAbort)
			if a.HasAbortInfo != tc.hasInfo || (tc.hasInfo && (a.AbortLSN != 0x10 || !a.AbortTime.Equal(ts))) {
				t.Errorf("mode %d len %d: %+v", tc.mode, len(tc.data), a)
			}
		} else if !errors.Is(err, decoding.ErrTruncated) && !errors.Is(err, decoding.ErrMalformed) {
			t.Errorf("mode %d len %d: unexpected error %v", tc.mode, len(tc.data), err)
		}
	}
}

func TestParseErrors(t *testing.T) {
	good := enc(t, &decoding.Insert{RelationID: 1, New: decoding.Tuple{{Kind: 't', Data: []byte("abc")}, {Kind: 'n'}}}, false, decoding.Options{})
	tests := []struct {
		name string
		data []byte
		want error
		off  int
	}{
		{"empty", nil, decoding.ErrTruncated, 0},
		{"unknown", []byte{'Z'}, decoding.ErrUnknownMessage, 0},
		{"truncated tuple", good[:len(good)-2], decoding.ErrTruncated, len(good) - 2},
		{"trailing", append(bytes.Clone(good), 0), decoding.ErrMalformed, len(good)},
		{"bad marker", func() []byte { b := bytes.Clone(good); b[5] = 'X'; return b }(), decoding.ErrMalformed, 5},
		{"bad column kind", func() []byte { b := bytes.Clone(good); b[8] = 'q'; return b }(), decoding.ErrMalformed, 8},
		{"negative length", func() []byte { b := bytes.Clone(good); b[9] = 0xff; return b }(), decoding.ErrMalformed, 9},
		{"huge column count", []byte{'I', 0, 0, 0, 1, 'N', 0xff, 0xff, 'n'}, decoding.ErrTruncated, 9},
		{"huge truncate count", []byte{'T', 0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 0, 1}, decoding.ErrTruncated, 10},
		{"unterminated string", []byte{'O', 0, 0, 0, 0, 0, 0, 0, 0, 'a'}, decoding.ErrTruncated, 10},
	}
	for _, tt := range tests {
		_, err := decoding.Parse(tt.data, false, decoding.Options{})
		var de *decoding.DecodeError
		if !errors.Is(err, tt.want) || !errors.As(err, &de) || de.Offset != tt.off {
			t.Errorf("%s: err = %v, want %v at offset %d", tt.name, err, tt.want, tt.off)
		}
		d := decoding.NewDecoder(decoding.Options{})
		if _, err := d.Accept(enc(t, begin, false, decoding.Options{})); err != nil {
			t.Fatal(err)
		}
		if _, nerr := d.Accept(tt.data); !errors.Is(nerr, tt.want) {
			t.Errorf("%s: Next err = %v, want %v", tt.name, nerr, tt.want)
		}
	}
}

func TestAppendRejects(t *testing.T) {
	bad := []decoding.Message{
		nil,
		&decoding.Origin{Name: "a\x00b"},
		&decoding.Insert{New: decoding.Tuple{{Kind: 'x'}}},
		&decoding.Insert{New: decoding.Tuple{{Kind: 'n', Data: []byte("x")}}},
		&decoding.Update{OldKind: 'N'},
		&decoding.Delete{OldKind: 0},
		&decoding.Begin{CommitTime: time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC)},
	}
	for _, m := range bad {
		dst := []byte("keep")
		out, err := decoding.Append(dst, m, false, decoding.Options{})
		if !errors.Is(err, decoding.ErrInvalidMessage) || string(out) != "keep" {
			t.Errorf("Append(%#v) = %q, %v; want ErrInvalidMessage and dst unchanged", m, out, err)
		}
	}
	if _, err := decoding.Append(nil, &decoding.StreamStart{}, false, decoding.Options{ProtoVersion: 1}); !errors.Is(err, decoding.ErrVersion) {
		t.Errorf("Append of Stream Start on protocol 1: %v", err)
	}
}

// TestRoundTripRandom encodes random messages of every type and checks Parse inverts Append.
func TestRoundTripRandom(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 0))
	for range 2000 {
		m := randomMessage(r)
		inStream := r.IntN(2) == 0
		data := enc(t, m, inStream, decoding.Options{})
		got, err := decoding.Parse(data, inStream, decoding.Options{})
		if err != nil {
			t.Fatalf("Parse(Append(%#v)): %v", m, err)
		}
		want := normalize(m, inStream)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("round trip:\n got %#v\nwant %#v", got, want)
		}
	}
}

// normalize returns m as Parse would return it: xid dropped outside streams, empty data non-nil.
func normalize(m decoding.Message, inStream bool) decoding.Message {
	switch v := m.(type) {
	case *decoding.Insert:
		c := *v
		c.New = normTuple(c.New)
		if !inStream {
			c.Xid = 0
		}
		return &c
	case *decoding.StreamAbort:
		c := *v
		if !c.HasAbortInfo {
			c.AbortLSN, c.AbortTime = 0, time.Time{}
		}
		return &c
	}
	return m
}

func normTuple(t decoding.Tuple) decoding.Tuple {
	out := make(decoding.Tuple, len(t))
	for i, c := range t {
		out[i] = c
		if (c.Kind == 't' || c.Kind == 'b') && c.Data == nil {
			out[i].Data = []byte{}
		}
	}
	return out
}

func randomTime(r *rand.Rand) time.Time {
	switch r.IntN(4) {
	case 0:
		return time.Unix(946684800, 0).UTC() // PostgreSQL epoch: 0 on the wire
	case 1:
		return time.Unix(-9223372036854+946684800+r.Int64N(1e6), 1000*r.Int64N(1e6)).UTC() // near -infinity
	}
	return time.UnixMicro(r.Int64N(4e15)).UTC()
}

func randomMessage(r *rand.Rand) decoding.Message {
	kinds := []byte("nutb")
	tuple := func() decoding.Tuple {
		t := make(decoding.Tuple, r.IntN(5))
		for i := range t {
			t[i].Kind = kinds[r.IntN(4)]
			if t[i].Kind == 't' || t[i].Kind == 'b' {
				t[i].Data = []byte("v" + string(rune('a'+r.IntN(26))))
			}
		}
		return t
	}
	switch r.IntN(6) {
	case 0:
		return &decoding.Insert{Xid: r.Uint32(), RelationID: r.Uint32(), New: tuple()}
	case 1:
		return &decoding.StreamAbort{Xid: r.Uint32(), SubXid: r.Uint32(), HasAbortInfo: r.IntN(2) == 0, AbortLSN: decoding.LSN(r.Uint64()), AbortTime: randomTime(r)}
	case 2:
		return &decoding.Begin{FinalLSN: decoding.LSN(r.Uint64()), CommitTime: randomTime(r), Xid: r.Uint32()}
	case 3:
		return &decoding.RollbackPrepared{Flags: uint8(r.UintN(256)), PrepareTime: randomTime(r), RollbackTime: randomTime(r), Xid: r.Uint32(), GID: "gid"}
	case 4:
		return &decoding.StreamStart{Xid: r.Uint32(), FirstSegment: r.IntN(2) == 0}
	}
	return &decoding.CommitPrepared{CommitLSN: decoding.LSN(r.Uint64()), EndLSN: decoding.LSN(r.Uint64()), CommitTime: randomTime(r), Xid: r.Uint32(), GID: ""}
}

func TestPGTimeExtremes(t *testing.T) {
	for _, us := range []int64{0, 1, -1, math.MaxInt64, math.MinInt64, 1e6 - 1, -1e6 + 1} {
		b := []byte{'B', 0, 0, 0, 0, 0, 0, 0, 0}
		b = append(b, byte(us>>56), byte(us>>48), byte(us>>40), byte(us>>32), byte(us>>24), byte(us>>16), byte(us>>8), byte(us))
		b = append(b, 0, 0, 0, 1)
		m, err := decoding.Parse(b, false, decoding.Options{})
		if err != nil {
			t.Fatal(err)
		}
		again, err := decoding.Append(nil, m, false, decoding.Options{})
		if err != nil || !bytes.Equal(again, b) {
			t.Errorf("µs %d: Append = %x, %v; want %x", us, again, err, b)
		}
	}
	m, _ := decoding.Parse([]byte{'B', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, false, decoding.Options{})
	if got := m.(*decoding.Begin).CommitTime; !got.Equal(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)) || got.Location() != time.UTC {
		t.Errorf("PostgreSQL epoch decodes as %v", got)
	}
}

// TestChangeAccessors: XID and RelationOID say what the fields of each change type say, decoded
// inside a stream block, so that no caller needs a type switch to learn them.
func TestChangeAccessors(t *testing.T) {
	tup := decoding.Tuple{{Kind: decoding.ColumnText, Data: []byte("1")}}
	for _, tc := range []struct {
		m   decoding.Message
		rel uint32 // 0: not a row change
	}{
		{&decoding.Insert{Xid: 701, RelationID: 42, New: tup}, 42},
		{&decoding.Update{Xid: 702, RelationID: 43, New: tup}, 43},
		{&decoding.Delete{Xid: 703, RelationID: 44, OldKind: 'K', Old: tup}, 44},
		{&decoding.Truncate{Xid: 704, RelationIDs: []uint32{45, 46}}, 0},
		{&decoding.LogicalMessage{Xid: 705, Flags: 1, Prefix: "p", Content: []byte("c")}, 0},
		{&decoding.Relation{Xid: 706, RelationID: 47, Namespace: "public", Name: "t", ReplicaIdentity: 'd'}, 0},
		{&decoding.DataType{Xid: 707, TypeOID: 99, Namespace: "public", Name: "mood"}, 0},
	} {
		m, err := decoding.Parse(enc(t, tc.m, true, decoding.Options{}), true, decoding.Options{})
		if err != nil {
			t.Fatal(err)
		}
		c, ok := m.(decoding.TxnMessage)
		if !ok {
			t.Fatalf("%T is not a Change", m)
		}
		if want := reflect.ValueOf(tc.m).Elem().FieldByName("Xid").Uint(); uint64(c.XID()) != want {
			t.Errorf("%T: XID() = %d, want %d", m, c.XID(), want)
		}
		rc, ok := m.(decoding.RowChange)
		if ok != (tc.rel != 0) || ok && rc.RelationOID() != tc.rel {
			t.Errorf("%T: RowChange %v, want relation %d", m, ok, tc.rel)
		}
	}
	for _, m := range []decoding.Message{begin, &decoding.Commit{}, &decoding.StreamStart{}, &decoding.StreamCommit{}} {
		if _, ok := m.(decoding.TxnMessage); ok {
			t.Errorf("%T is a Change", m)
		}
	}
}

func TestNextAllocs(t *testing.T) {
	data := enc(t, ins, true, decoding.Options{})
	start := enc(t, &decoding.StreamStart{Xid: 1}, false, decoding.Options{})
	stop := enc(t, &decoding.StreamStop{}, false, decoding.Options{})
	d := decoding.NewDecoder(decoding.Options{})
	allocs := testing.AllocsPerRun(100, func() {
		_, _ = d.Accept(start)
		_, _ = d.Accept(data)
		_, _ = d.Accept(stop)
		_, _ = decoding.ParseHeader(data, true)
	})
	if allocs != 0 {
		t.Fatalf("Next/ParseHeader allocate %v times", allocs)
	}
}

// TestChangeXid: the xid of the messages that change rows, 0 for the others (a Relation inside a
// stream block carries an xid too, but begins no subtransaction's changes).
func TestChangeXid(t *testing.T) {
	for _, tc := range []struct {
		m    decoding.Message
		want uint32
	}{
		{&decoding.Insert{Xid: 7}, 7},
		{&decoding.Update{Xid: 8}, 8},
		{&decoding.Delete{Xid: 9}, 9},
		{&decoding.Truncate{Xid: 10}, 10},
		{&decoding.Insert{}, 0},
		{&decoding.Relation{Xid: 11}, 0},
		{&decoding.LogicalMessage{Xid: 12}, 0},
		{&decoding.Commit{}, 0},
	} {
		if got := decoding.ChangeXid(tc.m); got != tc.want {
			t.Errorf("ChangeXid(%T) = %d, want %d", tc.m, got, tc.want)
		}
	}
}
