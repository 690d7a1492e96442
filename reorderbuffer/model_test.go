package reorderbuffer_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/spill"
	"github.com/pgreorder/pgreorder/spillcompress"
	"github.com/stretchr/testify/require"
)

// The model test generates random server-like pgoutput streams — interleaved streamed
// transactions with nested savepoints, rollbacks to savepoints, releases, concurrent-abort
// strays, restarts with first_segment, top-level aborts, two-phase transactions, plain
// transactions and non-transactional messages between the blocks — together with the
// transactions a naive, unlimited in-memory model says must come out, and checks the Buffer
// against it under several memory limits.

type wire struct {
	lsn  decoding.LSN
	data []byte
	// What a server restarted at a confirmed position P sends again: a message is sent again
	// when decide >= P. decide is the LSN that decides whether the server decodes the message's
	// transaction again (its commit, PREPARE or abort; a COMMIT PREPARED's own LSN; a
	// non-transactional message's LSN); 0 for strays, which are not sent again.
	owner  uint32
	decide decoding.LSN
}

type wantTxn struct {
	xid     uint32
	gid     string
	nontx   bool
	content string
	values  []string
	end     decoding.LSN
}

type simChange struct {
	writer uint32
	val    string // the inserted value
	rel    uint32
	want   string // what the consumer must see: value@column, or message:content
}

type simTxn struct {
	xid        uint32
	parent     map[uint32]uint32 // subxact -> parent (sub)xact
	stack      []uint32          // open savepoints' subxacts, innermost last
	changes    []simChange       // surviving changes so far
	started    bool
	relSent    map[uint32]bool // relations described since the last start or abort
	used       map[uint32]bool // relations ever described: locked against DDL until the end
	prepared   bool
	gid        string
	preparedAt decoding.LSN
	vals       []string // prepared: the values it commits with
	msgs       []int    // indexes in gen.out of the messages of its content phase
}

type gen struct {
	t       testing.TB
	rng     *rand.Rand
	opts    decoding.Options
	out     []wire
	want    []wantTxn
	lsn     decoding.LSN
	nextXid uint32
	seq     int
	open    []*simTxn
	held    []*simTxn // prepared, waiting for COMMIT/ROLLBACK PREPARED
	cur     *simTxn   // the transaction whose content is being emitted

	// Schema: relVersion is each relation's current version (changed by DDL in plain
	// transactions); described is the version in effect for the consumer, in stream order.
	relVersion map[uint32]int
	described  map[uint32]int
}

func (g *gen) emit(m decoding.Message, inStream bool) {
	g.t.Helper()
	b, err := decoding.Append(nil, m, inStream, g.opts)
	require.NoError(g.t, err)
	g.lsn += 0x10
	w := wire{lsn: g.lsn, data: b}
	if g.cur != nil {
		w.owner = g.cur.xid
		g.cur.msgs = append(g.cur.msgs, len(g.out))
	}
	g.out = append(g.out, w)
}

// decide sets the deciding LSN of x's content phase and ends it.
func (g *gen) decide(x *simTxn, lsn decoding.LSN) {
	for _, i := range x.msgs {
		g.out[i].decide = lsn
	}
	x.msgs = nil
}

// emitOwn emits a message that decides for itself (COMMIT PREPARED, a non-transactional message).
func (g *gen) emitOwn(m decoding.Message, owner uint32) {
	g.emit(m, false)
	g.out[len(g.out)-1].owner = owner
	g.out[len(g.out)-1].decide = g.lsn
}

func (g *gen) xid() uint32 { g.nextXid++; return g.nextXid }

func (g *gen) value(xid uint32) string { g.seq++; return fmt.Sprintf("v%d-%d", xid, g.seq) }

func relation(id, xid uint32) *decoding.Relation {
	return &decoding.Relation{Xid: xid, RelationID: id, Namespace: "public", Name: fmt.Sprintf("t%d", id),
		ReplicaIdentity: 'd', Columns: []decoding.RelationColumn{{Flags: 1, Name: "v", TypeOID: 25, TypeMod: -1}}}
}

// column names the first column of a relation at schema version v.
func column(v int) string {
	if v == 0 {
		return "v"
	}
	return fmt.Sprintf("v%d", v)
}

// describe emits relation rel at its current version, for a writer xid in a stream.
func (g *gen) describe(rel, xid uint32, inStream bool) {
	r := relation(rel, xid)
	r.Columns[0].Name = column(g.relVersion[rel])
	g.emit(r, inStream)
}

// val is the model's record of one inserted value and the column the consumer must resolve it to.
func val(v string, version int) string { return v + "@" + column(version) }

// locked reports whether an open or held transaction uses rel, so that DDL must wait.
func (g *gen) locked(rel uint32) bool {
	for _, x := range g.open {
		if x.used[rel] {
			return true
		}
	}
	for _, x := range g.held {
		if x.used[rel] {
			return true
		}
	}
	return false
}

func insert(rel, xid uint32, val string) *decoding.Insert {
	return &decoding.Insert{Xid: xid, RelationID: rel, New: decoding.Tuple{{Kind: 't', Data: []byte(val)}}}
}

var epoch = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// plain emits a whole non-streamed transaction (Begin…Commit or Begin Prepare…Prepare). It
// describes its relation when the consumer has no description yet or at random (pgoutput
// describes again after invalidations), and a committed one may change the relation (DDL) half
// way, describing it again.
func (g *gen) plain(prepare bool) {
	x := &simTxn{xid: g.xid(), used: map[uint32]bool{}}
	n := g.rng.IntN(4)
	var vals []string
	final := decoding.LSN(0) // fixed below, once the commit's position is known
	g.cur = x
	beginAt := len(g.out)
	if prepare {
		x.gid = fmt.Sprintf("gid-%d", x.xid)
		x.prepared = true
		g.emit(&decoding.BeginPrepare{PrepareLSN: final, EndLSN: final + 8, PrepareTime: epoch, Xid: x.xid, GID: x.gid}, false)
	} else {
		g.emit(&decoding.Begin{FinalLSN: final, CommitTime: epoch, Xid: x.xid}, false)
	}
	rel := uint32(1 + g.rng.IntN(3))
	x.used[rel] = true
	seen := g.described[rel]
	_, known := g.described[rel]
	if !known || g.rng.IntN(4) == 0 {
		g.describe(rel, 0, false)
		seen, known = g.relVersion[rel], true
	}
	ddl := -1
	if !prepare && !g.locked(rel) && g.rng.IntN(8) == 0 {
		ddl = g.rng.IntN(n + 1)
	}
	for k := 0; k <= n; k++ {
		if k == ddl {
			g.relVersion[rel]++
			g.describe(rel, 0, false)
			seen = g.relVersion[rel]
		}
		if k == n {
			break
		}
		v := g.value(x.xid)
		vals = append(vals, val(v, seen))
		x.changes = append(x.changes, simChange{writer: x.xid, val: v, rel: rel, want: val(v, seen)})
		g.emit(insert(rel, 0, v), false)
	}
	if prepare {
		x.preparedAt = g.lsn + 0x10
		g.emit(&decoding.Prepare{PrepareLSN: g.lsn + 0x10, EndLSN: g.lsn + 0x18, PrepareTime: epoch, Xid: x.xid, GID: x.gid}, false)
		g.out[beginAt].data, _ = decoding.Append(nil, &decoding.BeginPrepare{PrepareLSN: g.lsn, EndLSN: g.lsn + 8,
			PrepareTime: epoch, Xid: x.xid, GID: x.gid}, false, g.opts)
		g.decide(x, x.preparedAt)
		g.cur = nil
		g.described[rel] = g.relVersion[rel]
		x.vals = vals
		g.held = append(g.held, x)
		return
	}
	g.emit(&decoding.Commit{CommitLSN: g.lsn + 0x10, EndLSN: g.lsn + 0x18, CommitTime: epoch}, false)
	g.out[beginAt].data, _ = decoding.Append(nil, &decoding.Begin{FinalLSN: g.lsn, CommitTime: epoch, Xid: x.xid}, false, g.opts)
	g.decide(x, g.lsn)
	g.cur = nil
	g.described[rel] = g.relVersion[rel]
	g.want = append(g.want, wantTxn{xid: x.xid, values: vals, end: g.lsn + 0x8})
}

// block emits one stream block of x with up to n operations.
func (g *gen) block(x *simTxn, n int) {
	g.cur = x
	defer func() { g.cur = nil }()
	first := !x.started
	x.started = true
	g.emit(&decoding.StreamStart{Xid: x.xid, FirstSegment: first}, false)
	var aborted []uint32
	for i := 0; i < n && aborted == nil; i++ {
		switch r := g.rng.IntN(100); {
		case r < 55: // insert by the innermost open (sub)transaction
			w := x.xid
			if len(x.stack) > 0 {
				w = x.stack[len(x.stack)-1]
			}
			rel := uint32(1 + g.rng.IntN(3))
			if !x.relSent[rel] {
				g.describe(rel, w, true)
				x.relSent[rel] = true
				x.used[rel] = true
			}
			v := g.value(x.xid)
			x.changes = append(x.changes, simChange{writer: w, val: v, rel: rel, want: val(v, g.relVersion[rel])})
			g.emit(insert(rel, w, v), true)
		case r < 60: // a transactional logical message carries the top-level xid
			if len(x.stack) > 0 {
				// Written by a subtransaction, it would still carry the top-level xid: the
				// stream cannot tell which subtransaction it belongs to.
				continue
			}
			c := fmt.Sprintf("tx-note-%d", g.seq)
			g.seq++
			x.changes = append(x.changes, simChange{writer: x.xid, want: "message:" + c})
			g.emit(&decoding.LogicalMessage{Xid: x.xid, Flags: 1, LSN: g.lsn + 0x10, Prefix: "p", Content: []byte(c)}, true)
		case r < 75: // SAVEPOINT
			s := g.xid()
			p := x.xid
			if len(x.stack) > 0 {
				p = x.stack[len(x.stack)-1]
			}
			x.parent[s] = p
			x.stack = append(x.stack, s)
		case r < 85: // RELEASE SAVEPOINT
			if len(x.stack) > 0 {
				x.stack = x.stack[:len(x.stack)-1]
			}
		default: // ROLLBACK TO SAVEPOINT at a random depth
			if len(x.stack) == 0 {
				continue
			}
			d := g.rng.IntN(len(x.stack))
			aborted = g.subtree(x, x.stack[d:])
			x.stack = x.stack[:d]
		}
	}
	g.emit(&decoding.StreamStop{}, true)
	if aborted != nil {
		g.abortSubs(x, aborted)
	}
}

// subtree returns the given subxacts and all their descendants, children before parents.
func (g *gen) subtree(x *simTxn, roots []uint32) []uint32 {
	in := map[uint32]bool{}
	for _, r := range roots {
		in[r] = true
	}
	changed := true
	for changed {
		changed = false
		for s, p := range x.parent {
			if in[p] && !in[s] {
				in[s], changed = true, true
			}
		}
	}
	var out []uint32
	for s := range in {
		out = append(out, s)
	}
	slices.Sort(out)
	slices.Reverse(out) // later xids (children) first
	return out
}

// abortSubs emits Stream Abort for each aborted subxact that streamed changes, and forgets them.
func (g *gen) abortSubs(x *simTxn, subs []uint32) {
	prev := g.cur
	g.cur = x
	defer func() { g.cur = prev }()
	dead := map[uint32]bool{}
	wrote := map[uint32]bool{}
	for _, c := range x.changes {
		wrote[c.writer] = true
	}
	for _, s := range subs {
		dead[s] = true
		if wrote[s] {
			g.emit(&decoding.StreamAbort{Xid: x.xid, SubXid: s}, false)
		}
		delete(x.parent, s)
	}
	if g.rng.IntN(4) == 0 { // concurrent-abort stray: an empty block, then an abort naming an unknown subxid
		g.emit(&decoding.StreamStart{Xid: x.xid}, false)
		g.emit(&decoding.StreamStop{}, true)
		g.emit(&decoding.StreamAbort{Xid: x.xid, SubXid: g.xid()}, false)
	}
	x.changes = slices.DeleteFunc(x.changes, func(c simChange) bool { return dead[c.writer] })
	clear(x.relSent) // pgoutput describes relations again after any Stream Abort
}

func (g *gen) values(x *simTxn) []string {
	var v []string
	for _, c := range x.changes {
		v = append(v, c.want)
	}
	return v
}

// finish ends x: commit, abort or prepare.
func (g *gen) finish(x *simTxn) {
	if !x.started { // never streamed: the server sends nothing for it at all... unless it commits
		g.block(x, 1)
	}
	g.cur = x
	defer func() { g.cur = nil }()
	switch r := g.rng.IntN(10); {
	case r < 6:
		g.emit(&decoding.StreamCommit{Xid: x.xid, CommitLSN: g.lsn + 0x10, EndLSN: g.lsn + 0x18, CommitTime: epoch}, false)
		g.decide(x, g.lsn)
		g.want = append(g.want, wantTxn{xid: x.xid, values: g.values(x), end: g.lsn + 8})
	case r < 8:
		subs := g.subtree(x, x.stack)
		g.abortSubs(x, subs)
		g.emit(&decoding.StreamAbort{Xid: x.xid, SubXid: x.xid}, false)
		g.decide(x, g.lsn)
	default:
		x.gid = fmt.Sprintf("gid-%d", x.xid)
		x.prepared = true
		x.preparedAt = g.lsn + 0x10
		g.emit(&decoding.StreamPrepare{PrepareLSN: g.lsn + 0x10, EndLSN: g.lsn + 0x18, PrepareTime: epoch, Xid: x.xid, GID: x.gid}, false)
		g.decide(x, x.preparedAt)
		x.vals = g.values(x)
		g.held = append(g.held, x)
	}
}

// restart re-sends x from its first change, as the server does when it decodes a transaction
// again (for instance after a reconnect it was not told about).
func (g *gen) restart(x *simTxn) {
	g.cur = x
	defer func() { g.cur = nil }()
	g.emit(&decoding.StreamStart{Xid: x.xid, FirstSegment: true}, false)
	clear(x.relSent)
	for _, c := range x.changes {
		if strings.HasPrefix(c.want, "message:") {
			g.emit(&decoding.LogicalMessage{Xid: x.xid, Flags: 1, LSN: g.lsn + 0x10, Prefix: "p", Content: []byte(strings.TrimPrefix(c.want, "message:"))}, true)
			continue
		}
		if !x.relSent[c.rel] {
			g.describe(c.rel, c.writer, true)
			x.relSent[c.rel] = true
		}
		g.emit(insert(c.rel, c.writer, c.val), true)
	}
	g.emit(&decoding.StreamStop{}, true)
}

// endPrepared emits COMMIT PREPARED (or ROLLBACK PREPARED) of held transaction x.
func (g *gen) endPrepared(x *simTxn, commit bool) {
	if commit {
		g.emitOwn(&decoding.CommitPrepared{CommitLSN: g.lsn + 0x10, EndLSN: g.lsn + 0x18, CommitTime: epoch, Xid: x.xid, GID: x.gid}, x.xid)
		g.want = append(g.want, wantTxn{xid: x.xid, gid: x.gid, values: x.vals, end: g.lsn + 8})
	} else {
		g.emitOwn(&decoding.RollbackPrepared{PrepareEndLSN: x.preparedAt + 8, RollbackEndLSN: g.lsn + 0x18, PrepareTime: epoch, RollbackTime: epoch, Xid: x.xid, GID: x.gid}, x.xid)
	}
}

func generate(t testing.TB, seed uint64, steps int) *gen {
	g := &gen{t: t, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), lsn: 0x1000000,
		relVersion: map[uint32]int{}, described: map[uint32]int{}}
	for range steps {
		switch r := g.rng.IntN(100); {
		case r < 10 || len(g.open) == 0:
			g.open = append(g.open, &simTxn{xid: g.xid(), parent: map[uint32]uint32{}, relSent: map[uint32]bool{}, used: map[uint32]bool{}})
		case r < 60:
			g.block(g.open[g.rng.IntN(len(g.open))], 1+g.rng.IntN(40))
		case r < 70:
			i := g.rng.IntN(len(g.open))
			x := g.open[i]
			g.open = slices.Delete(g.open, i, i+1)
			g.finish(x)
		case r < 80:
			g.plain(g.rng.IntN(5) == 0)
		case r < 84:
			if x := g.open[g.rng.IntN(len(g.open))]; x.started {
				g.restart(x)
			}
		case r < 88:
			if len(g.held) > 0 {
				i := g.rng.IntN(len(g.held))
				x := g.held[i]
				g.held = slices.Delete(g.held, i, i+1)
				g.endPrepared(x, g.rng.IntN(3) > 0)
			}
		case r < 90:
			c := fmt.Sprintf("note-%d", g.seq)
			g.seq++
			g.emitOwn(&decoding.LogicalMessage{Flags: 0, LSN: g.lsn + 0x10, Prefix: "p", Content: []byte(c)}, 0)
			g.want = append(g.want, wantTxn{nontx: true, content: c, end: g.lsn})
		case r < 91:
			// A stray top-level abort for a transaction that never streamed (PostgreSQL 18).
			g.emit(&decoding.StreamAbort{Xid: g.xid(), SubXid: g.nextXid}, false)
		default:
			g.block(g.open[g.rng.IntN(len(g.open))], 1+g.rng.IntN(200))
		}
	}
	for len(g.open) > 0 {
		x := g.open[0]
		g.open = g.open[1:]
		g.finish(x)
	}
	for _, x := range g.held {
		g.endPrepared(x, true)
	}
	g.held = nil
	return g
}

// record renders a handed-out transaction as the model writes it, checking that every insert
// resolves to a relation.
func record(t testing.TB, x *reorderbuffer.Txn) wantTxn {
	t.Helper()
	out := wantTxn{xid: x.Xid, gid: x.GID, nontx: x.NonTransactional, end: x.EndLSN}
	checkHeads(t, x)
	for c, err := range x.Changes() {
		m := c.Msg
		require.NoError(t, err)
		switch m := m.(type) {
		case *decoding.Insert:
			r, ok := c.Relation, c.Relation != nil
			require.True(t, ok, "insert into undescribed relation %d", m.RelationID)
			out.values = append(out.values, string(m.New[0].Data)+"@"+r.Columns[0].Name)
		case *decoding.LogicalMessage:
			if x.NonTransactional {
				out.content = string(m.Content)
			} else {
				out.values = append(out.values, "message:"+string(m.Content))
			}
		}
	}
	return out
}

// checkHeads checks that x.Heads yields what x.Changes yields, its row changes unparsed: the
// same types, relations, records and schema messages, in the same order.
func checkHeads(t testing.TB, x *reorderbuffer.Txn) {
	t.Helper()
	type seen struct {
		typ      decoding.MessageType
		relID    uint32
		rel      *decoding.Relation
		raw      string
		inStream bool
		msg      string
	}
	var want, got []seen
	for c, err := range x.Changes() {
		require.NoError(t, err)
		s := seen{typ: c.Msg.Type(), rel: c.Relation, raw: string(c.Raw), inStream: c.InStream}
		switch m := c.Msg.(type) {
		case decoding.RowChange:
			s.relID = m.RelationOID()
		default:
			s.msg = fmt.Sprintf("%+v", m)
		}
		want = append(want, s)
	}
	for h, err := range x.Heads() {
		require.NoError(t, err)
		s := seen{typ: h.Type, relID: h.RelationID, rel: h.Relation, raw: string(h.Raw), inStream: h.InStream}
		if h.Msg != nil {
			require.Equal(t, h.Type, h.Msg.Type())
			s.msg = fmt.Sprintf("%+v", h.Msg)
		}
		got = append(got, s)
	}
	require.Equal(t, want, got, "Heads against Changes, transaction %d", x.Xid)
}

// assembler is a consumer of parts (Config.Incremental): it applies each part as it comes,
// takes a "savepoint" at each subtransaction's first change, undoes what it is told to, and
// renders a transaction as the model writes it when it commits.
type assembler struct {
	open map[uint32]*applying
}

type applying struct {
	out      wantTxn
	subStart map[uint32]int // subtransaction -> index of its first value
}

// take handles one handed-out Txn; it returns the transaction rendered when it is complete.
func (a *assembler) take(t testing.TB, x *reorderbuffer.Txn) (wantTxn, bool) {
	t.Helper()
	if x.Part == reorderbuffer.Whole {
		require.Nil(t, a.open[x.Xid], "a whole transaction while parts of it are open")
		return record(t, x), true
	}
	if a.open == nil {
		a.open = map[uint32]*applying{}
	}
	ap := a.open[x.Xid]
	if ap == nil {
		require.NotEqual(t, reorderbuffer.PartSubAbort, x.Part, "undo of a transaction never begun")
		require.NotEqual(t, reorderbuffer.PartAbort, x.Part, "abort of a transaction never begun")
		ap = &applying{subStart: map[uint32]int{}}
		a.open[x.Xid] = ap
	}
	switch x.Part {
	case reorderbuffer.PartSubAbort:
		cut, ok := ap.subStart[x.SubXid]
		require.True(t, ok, "undo of subtransaction %d that wrote nothing handed out", x.SubXid)
		ap.out.values = ap.out.values[:cut]
		if cut == 0 {
			ap.out.values = nil
		}
		for s, i := range ap.subStart {
			if i >= cut {
				delete(ap.subStart, s)
			}
		}
		return wantTxn{}, false
	case reorderbuffer.PartAbort:
		delete(a.open, x.Xid)
		return wantTxn{}, false
	}
	checkHeads(t, x)
	for c, err := range x.Changes() {
		m := c.Msg
		require.NoError(t, err)
		switch m := m.(type) {
		case *decoding.Insert:
			if m.Xid != 0 && m.Xid != x.Xid {
				if _, ok := ap.subStart[m.Xid]; !ok {
					ap.subStart[m.Xid] = len(ap.out.values)
				}
			}
			r, ok := c.Relation, c.Relation != nil
			require.True(t, ok, "insert into undescribed relation %d", m.RelationID)
			ap.out.values = append(ap.out.values, string(m.New[0].Data)+"@"+r.Columns[0].Name)
		case *decoding.LogicalMessage:
			ap.out.values = append(ap.out.values, "message:"+string(m.Content))
		}
	}
	if x.Part != reorderbuffer.PartCommit {
		return wantTxn{}, false
	}
	delete(a.open, x.Xid)
	out := ap.out
	out.xid, out.gid, out.end = x.Xid, x.GID, x.EndLSN
	return out, true
}

// run feeds the stream to a Buffer and returns what came out, checking the memory limit and
// the invariants after every message.
func run(t testing.TB, stream []wire, cfg reorderbuffer.Config) ([]wantTxn, reorderbuffer.Stats) {
	return runShared(t, stream, cfg, nil)
}

// runShared is run with a consumer that, when consumer is not nil, takes and gives back room in
// cfg.Memory between messages as consumer says (n > 0 takes n bytes, n < 0 gives back -n of
// what it holds): the Buffer's bytes and the consumer's together stay within the limit whenever
// the Buffer holds anything, and the Memory counts both.
func runShared(t testing.TB, stream []wire, cfg reorderbuffer.Config, consumer func() int64) ([]wantTxn, reorderbuffer.Stats) {
	t.Helper()
	b, err := reorderbuffer.New(cfg)
	require.NoError(t, err)
	var got []wantTxn
	limit := cfg.WorkMem
	if limit < 0 {
		limit = 0
	}
	if cfg.Memory != nil {
		limit = cfg.Memory.Limit()
	}
	var taken int64
	var a assembler
	for i, w := range stream {
		if consumer != nil {
			switch n := consumer(); {
			case n > 0 && cfg.Memory.Take(n):
				taken += n
			case n < 0:
				n = min(-n, taken)
				cfg.Memory.Give(n)
				taken -= n
			}
		}
		require.NoError(t, b.Add(w.lsn, w.data), "message %d", i)
		for x, ok := b.Next(); ok; x, ok = b.Next() {
			out, done := a.take(t, x)
			if !done {
				require.ErrorIs(t, b.Ack(x), reorderbuffer.ErrNotCommit)
				continue
			}
			got = append(got, out)
			require.NoError(t, b.Ack(x))
		}
		mem := b.Stats().MemoryBytes
		if cfg.Memory != nil {
			require.Equal(t, mem+taken, cfg.Memory.Used(), "the shared Memory counts the Buffer's bytes and the consumer's, after message %d", i)
			if mem > 0 {
				require.LessOrEqual(t, mem+taken, limit, "memory with the consumer's over the limit after message %d", i)
			}
		}
		require.LessOrEqual(t, mem, limit, "memory over the limit after message %d", i)
		require.NoError(t, b.CheckInvariants(), "after message %d", i)
	}
	require.Empty(t, a.open, "parts of transactions never ended")
	st := b.Stats()
	require.NoError(t, b.Close())
	require.NoError(t, b.Close(), "Close twice")
	if cfg.Memory != nil {
		require.Equal(t, taken, cfg.Memory.Used(), "a closed Buffer counts nothing")
	}
	return got, st
}

func seed(t testing.TB) uint64 {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("PGREORDER_SEED"); s != "" {
		_, err := fmt.Sscan(s, &seed)
		require.NoError(t, err)
	}
	t.Logf("seed %d (set PGREORDER_SEED to replay)", seed)
	return seed
}

func TestModel(t *testing.T) {
	seed := seed(t)
	rounds := 30
	if testing.Short() {
		rounds = 5
	}
	for r := range rounds {
		s := seed + uint64(r)
		g := generate(t, s, 300)
		for i, limit := range []int64{math.MaxInt64, 1 << 20, 4 << 10, reorderbuffer.SpillEverything} {
			dir := t.TempDir()
			incremental := (r+i)%2 == 1
			// Every other round spills compressed: subtransaction aborts then cut into blocks.
			var codec spill.Compressor
			if r%2 == 0 {
				codec = spillcompress.LZ4()
			}
			got, st := run(t, g.out, reorderbuffer.Config{WorkMem: limit, Dir: dir, Incremental: incremental, SpillCompressor: codec})
			require.Equal(t, g.want, got, "seed %d limit %d incremental %v compressed %v", s, limit, incremental, codec != nil)
			if limit > 0 {
				require.LessOrEqual(t, st.PeakMemoryBytes, limit, "seed %d: peak memory over the limit", s)
			}
			if limit == reorderbuffer.SpillEverything && st.StreamTxns > 0 {
				require.Positive(t, st.SpillBytes, "seed %d: nothing spilled with limit 0", s)
			}
			ents, err := os.ReadDir(dir)
			require.NoError(t, err)
			require.Empty(t, ents, "spill files left after Close (seed %d)", s)
		}
		// The same stream with the limit shared with a consumer that takes and gives back room
		// at random: the same transactions.
		for _, limit := range []int64{1 << 20, 16 << 10} {
			rng := rand.New(rand.NewPCG(s, uint64(limit)))
			consumer := func() int64 {
				switch rng.IntN(3) {
				case 0:
					return 1 + rng.Int64N(limit/2)
				case 1:
					return -1 - rng.Int64N(limit/2)
				}
				return 0
			}
			cfg := reorderbuffer.Config{Memory: reorderbuffer.NewMemory(limit), Dir: t.TempDir(), Incremental: r%2 == 0}
			got, _ := runShared(t, g.out, cfg, consumer)
			require.Equal(t, g.want, got, "seed %d shared limit %d incremental %v", s, limit, cfg.Incremental)
		}
	}
}
