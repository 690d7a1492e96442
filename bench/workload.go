package bench

import (
	"fmt"
	"iter"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/pgreorder/pgreorder/decoding"
)

// Options are the pgoutput options every generated stream uses: protocol 2 (streaming = on), so
// that the stream is readable by pglogrepl.ParseV2 as well.
var Options = decoding.Options{ProtoVersion: 2, AbortInfo: decoding.AbortInfoNever}

// ServerChangeBytes is roughly what one small change costs in the server's reorder buffer
// (a ReorderBufferChange and its heap tuple). Generators size stream blocks with it: the server
// streams a transaction when its changes reach logical_decoding_work_mem, so a block holds about
// serverWorkMem / ServerChangeBytes changes.
const ServerChangeBytes = 150

// Workload is a deterministic pgoutput stream: the same Workload yields the same bytes every
// time. It is generated lazily, one message at a time, into a buffer that is reused, so a
// stream of any size costs no memory: the consumer must copy what it keeps (the reorder buffer's
// Add does).
type Workload struct {
	Name    string
	Seed    uint64
	Changes int64 // Insert, Update and Delete messages the stream carries
	Kept    int64 // of those, the changes of committed (sub)transactions: what a consumer hands out
	Txns    int64 // committed transactions

	gen func(w *writer)
}

// Messages yields each message of the stream with its LSN. The slice is reused: it is valid only
// until the next iteration step.
func (wl *Workload) Messages() iter.Seq2[decoding.LSN, []byte] {
	return func(yield func(decoding.LSN, []byte) bool) {
		w := &writer{yield: yield, rng: rand.New(rand.NewPCG(wl.Seed, 0x9e3779b97f4a7c15)), lsn: 0x1000000}
		defer func() {
			if r := recover(); r != nil && r != errStopped {
				panic(r)
			}
		}()
		wl.gen(w)
	}
}

// String describes the workload and its seed, for logs.
func (wl *Workload) String() string {
	return fmt.Sprintf("%s (seed %d, %d changes, %d kept, %d transactions)", wl.Name, wl.Seed, wl.Changes, wl.Kept, wl.Txns)
}

// errStopped unwinds a generator when the consumer stops iterating.
var errStopped = fmt.Errorf("bench: iteration stopped")

// writer encodes messages into one reused buffer and yields them. The message structs are
// reused too, so generating a message allocates nothing.
type writer struct {
	yield func(decoding.LSN, []byte) bool
	rng   *rand.Rand
	buf   []byte
	lsn   decoding.LSN
	now   time.Time

	ins    decoding.Insert
	upd    decoding.Update
	cols   [6]decoding.Column
	vals   [6][]byte
	start  decoding.StreamStart
	commit decoding.StreamCommit
	abort  decoding.StreamAbort
	begin  decoding.Begin
	pcom   decoding.Commit
	stop   decoding.StreamStop
}

func (w *writer) emit(m decoding.Message, inStream bool) {
	var err error
	w.buf, err = decoding.Append(w.buf[:0], m, inStream, Options)
	if err != nil {
		panic(fmt.Sprintf("bench: generator made an invalid message: %v", err))
	}
	w.lsn += decoding.LSN(len(w.buf))
	if !w.yield(w.lsn, w.buf) {
		panic(errStopped)
	}
}

func (w *writer) streamStart(xid uint32, first bool) {
	w.start = decoding.StreamStart{Xid: xid, FirstSegment: first}
	w.emit(&w.start, false)
}

func (w *writer) streamStop() { w.emit(&w.stop, false) }

func (w *writer) streamCommit(xid uint32) {
	w.commit = decoding.StreamCommit{Xid: xid, CommitLSN: w.lsn + 1, EndLSN: w.lsn + 64, CommitTime: w.now}
	w.emit(&w.commit, false)
	w.lsn += 64
}

func (w *writer) streamAbort(xid, sub uint32) {
	w.abort = decoding.StreamAbort{Xid: xid, SubXid: sub}
	w.emit(&w.abort, false)
}

func (w *writer) beginTxn(xid uint32) {
	w.begin = decoding.Begin{FinalLSN: w.lsn + 1<<20, CommitTime: w.now, Xid: xid}
	w.emit(&w.begin, false)
}

func (w *writer) commitTxn() {
	w.pcom = decoding.Commit{CommitLSN: w.lsn + 1, EndLSN: w.lsn + 64, CommitTime: w.now}
	w.emit(&w.pcom, false)
	w.lsn += 64
}

func (w *writer) relation(r *decoding.Relation, xid uint32, inStream bool) {
	r.Xid = 0
	if inStream {
		r.Xid = xid
	}
	w.emit(r, inStream)
}

// tuple fills the reused column array with text values of the given integers (and a fixed
// filler when filler > 0) and returns it as a Tuple.
func (w *writer) tuple(filler []byte, ints ...int64) decoding.Tuple {
	n := 0
	for _, v := range ints {
		w.vals[n] = strconv.AppendInt(w.vals[n][:0], v, 10)
		w.cols[n] = decoding.Column{Kind: decoding.ColumnText, Data: w.vals[n]}
		n++
	}
	if filler != nil {
		w.cols[n] = decoding.Column{Kind: decoding.ColumnText, Data: filler}
		n++
	}
	return w.cols[:n]
}

func (w *writer) insert(xid, rel uint32, inStream bool, t decoding.Tuple) {
	w.ins = decoding.Insert{RelationID: rel, New: t}
	if inStream {
		w.ins.Xid = xid
	}
	w.emit(&w.ins, inStream)
}

func (w *writer) update(xid, rel uint32, inStream bool, t decoding.Tuple) {
	w.upd = decoding.Update{RelationID: rel, New: t}
	if inStream {
		w.upd.Xid = xid
	}
	w.emit(&w.upd, inStream)
}

// blocker cuts one transaction's changes into stream blocks of at most per changes, as the
// server does when the transaction reaches its logical_decoding_work_mem.
type blocker struct {
	w       *writer
	xid     uint32
	per     int64
	n       int64 // changes in the open block
	open    bool
	started bool // the first segment was sent
}

func (bl *blocker) ensure() {
	if !bl.open {
		bl.w.streamStart(bl.xid, !bl.started)
		bl.started, bl.open, bl.n = true, true, 0
	}
}

// change is called before each change; it opens a block if none is open.
func (bl *blocker) change() {
	bl.ensure()
	bl.n++
}

// after is called after each change; it closes the block when it is full.
func (bl *blocker) after() {
	if bl.n >= bl.per {
		bl.close()
	}
}

func (bl *blocker) close() {
	if bl.open {
		bl.w.streamStop()
		bl.open = false
	}
}

// blockChanges is how many changes the server puts into one stream block at serverWorkMem.
func blockChanges(serverWorkMem int64) int64 {
	return max(1, serverWorkMem/ServerChangeBytes)
}

// The relations of the generated workloads (OIDs are arbitrary but fixed).
var (
	relTest = decoding.Relation{RelationID: 16384, Namespace: "public", Name: "test", ReplicaIdentity: 'd',
		Columns: []decoding.RelationColumn{{Name: "c", TypeOID: 23, TypeMod: -1}}}
	relAccounts = decoding.Relation{RelationID: 16401, Namespace: "public", Name: "pgbench_accounts", ReplicaIdentity: 'd',
		Columns: []decoding.RelationColumn{{Flags: 1, Name: "aid", TypeOID: 23, TypeMod: -1},
			{Name: "bid", TypeOID: 23, TypeMod: -1}, {Name: "abalance", TypeOID: 23, TypeMod: -1},
			{Name: "filler", TypeOID: 1042, TypeMod: 88}}}
	relTellers = decoding.Relation{RelationID: 16404, Namespace: "public", Name: "pgbench_tellers", ReplicaIdentity: 'd',
		Columns: []decoding.RelationColumn{{Flags: 1, Name: "tid", TypeOID: 23, TypeMod: -1},
			{Name: "bid", TypeOID: 23, TypeMod: -1}, {Name: "tbalance", TypeOID: 23, TypeMod: -1},
			{Name: "filler", TypeOID: 1042, TypeMod: 88}}}
	relBranches = decoding.Relation{RelationID: 16407, Namespace: "public", Name: "pgbench_branches", ReplicaIdentity: 'd',
		Columns: []decoding.RelationColumn{{Flags: 1, Name: "bid", TypeOID: 23, TypeMod: -1},
			{Name: "bbalance", TypeOID: 23, TypeMod: -1}, {Name: "filler", TypeOID: 1042, TypeMod: 92}}}
	relHistory = decoding.Relation{RelationID: 16410, Namespace: "public", Name: "pgbench_history", ReplicaIdentity: 'd',
		Columns: []decoding.RelationColumn{{Name: "tid", TypeOID: 23, TypeMod: -1},
			{Name: "bid", TypeOID: 23, TypeMod: -1}, {Name: "aid", TypeOID: 23, TypeMod: -1},
			{Name: "delta", TypeOID: 23, TypeMod: -1}, {Name: "mtime", TypeOID: 1114, TypeMod: -1}}}
)

// firstXid is the xid of the first generated transaction.
const firstXid = 1000

// ManySubxacts is PostgreSQL's "many subtransactions" case: one transaction that runs a
// PL/pgSQL loop of n iterations, each inserting one row into test(c int) inside its own
// exception block, so each row is written by its own subtransaction. It arrives streamed, in
// blocks as the server sends them at serverWorkMem (the published case used 4MB).
func ManySubxacts(n int64, serverWorkMem int64, seed uint64) *Workload {
	return &Workload{
		Name: fmt.Sprintf("many-subxacts n=%d", n), Seed: seed, Changes: n, Kept: n, Txns: 1,
		gen: func(w *writer) {
			const top = firstXid
			bl := blocker{w: w, xid: top, per: blockChanges(serverWorkMem)}
			for i := range n {
				bl.change()
				if i == 0 {
					w.relation(&relTest, top+1, true)
				}
				sub := uint32(top + 1 + i)
				w.insert(sub, relTest.RelationID, true, w.tuple(nil, w.rng.Int64N(1<<31)))
				bl.after()
			}
			bl.close()
			w.streamCommit(top)
		},
	}
}

// BulkInsert is PostgreSQL's "single big insertion": insert into test select
// generate_series(1, n), one transaction, streamed in blocks of serverWorkMem.
func BulkInsert(n int64, serverWorkMem int64, seed uint64) *Workload {
	return RollbackToSavepoint(n, 0, serverWorkMem, seed)
}

// RollbackToSavepoint is the parallel-apply study's case: one transaction inserts n rows into
// test(c int); the last pct percent of them are inserted after a SAVEPOINT and rolled back with
// ROLLBACK TO SAVEPOINT before the commit. It arrives streamed in blocks of serverWorkMem. As
// on the server, the changes still waiting in the server's memory at the rollback (the last,
// partial block) are dropped there if they belong to the subtransaction, and a Stream Abort is
// sent only if some of the subtransaction's changes were already streamed.
func RollbackToSavepoint(n int64, pct int, serverWorkMem int64, seed uint64) *Workload {
	kept := n - n*int64(pct)/100
	per := blockChanges(serverWorkMem)
	streamed := n - n%per // changes in full blocks, sent while the transaction runs
	tail := max(0, kept-streamed)
	name := fmt.Sprintf("bulk-insert n=%d", n)
	if pct > 0 {
		name = fmt.Sprintf("rollback-to-savepoint n=%d pct=%d", n, pct)
	}
	return &Workload{
		Name: name, Seed: seed, Changes: streamed + tail, Kept: kept, Txns: 1,
		gen: func(w *writer) {
			const top, sub = firstXid, firstXid + 1
			bl := blocker{w: w, xid: top, per: per}
			row := func(i int64) {
				xid := uint32(top)
				if i >= kept {
					xid = sub
				}
				bl.change()
				if i == 0 {
					w.relation(&relTest, xid, true)
				}
				w.insert(xid, relTest.RelationID, true, w.tuple(nil, i+1))
				bl.after()
			}
			for i := range streamed {
				row(i)
			}
			if kept < streamed {
				w.streamAbort(top, sub)
			}
			for i := streamed; i < streamed+tail; i++ {
				if i == streamed && kept < streamed {
					// After a Stream Abort pgoutput sends the relation again.
					bl.ensure()
					w.relation(&relTest, top, true)
				}
				row(i)
			}
			bl.close()
			w.streamCommit(top)
		},
	}
}

// pgbench's scale-dependent sizes (pgbench -i -s scale).
const (
	pgbenchAccountsPerBranch = 100000
	pgbenchTellersPerBranch  = 10
)

// filler is pgbench_accounts' blank-padded char(84) filler as pgbench -i leaves it.
var filler = []byte("                                                                                    ")

// pgbenchTxn writes the changes of one pgbench TPC-B-like transaction: three updates and an
// insert, and before them the relations the stream has not described yet (sent tells which).
func (w *writer) pgbenchTxn(xid uint32, inStream bool, scale int64, sent *[4]bool) {
	aid := w.rng.Int64N(scale*pgbenchAccountsPerBranch) + 1
	tid := w.rng.Int64N(scale*pgbenchTellersPerBranch) + 1
	bid := w.rng.Int64N(scale) + 1
	delta := w.rng.Int64N(10001) - 5000
	for i, r := range []*decoding.Relation{&relAccounts, &relTellers, &relBranches, &relHistory} {
		if !sent[i] {
			w.relation(r, xid, inStream)
			sent[i] = true
		}
	}
	w.update(xid, relAccounts.RelationID, inStream, w.tuple(filler, aid, (aid-1)/pgbenchAccountsPerBranch+1, w.rng.Int64N(1e6)))
	null := decoding.Column{Kind: decoding.ColumnNull}
	t := w.tuple(nil, tid, (tid-1)/pgbenchTellersPerBranch+1, w.rng.Int64N(1e6))
	w.update(xid, relTellers.RelationID, inStream, append(t, null))
	t = w.tuple(nil, bid, w.rng.Int64N(1e6))
	w.update(xid, relBranches.RelationID, inStream, append(t, null))
	t = w.tuple(nil, tid, bid, aid, delta)
	w.vals[4] = w.now.AppendFormat(w.vals[4][:0], "2006-01-02 15:04:05.000000")
	t = append(t, decoding.Column{Kind: decoding.ColumnText, Data: w.vals[4]})
	w.insert(xid, relHistory.RelationID, inStream, t)
}

// SmallTxns is PostgreSQL's "many small transactions" case: pgbench -t txnsPerClient -c
// clients at scale 300, decoded with streaming off (every transaction arrives whole, one after
// the other): txnsPerClient×clients transactions of three updates and an insert each.
func SmallTxns(txnsPerClient, clients int64, seed uint64) *Workload {
	n := txnsPerClient * clients
	return &Workload{
		Name: fmt.Sprintf("small-txns %dx%d", txnsPerClient, clients), Seed: seed, Changes: 4 * n, Kept: 4 * n, Txns: n,
		gen: func(w *writer) {
			var sent [4]bool
			for i := range n {
				xid := uint32(firstXid + i)
				w.beginTxn(xid)
				w.pgbenchTxn(xid, false, 300, &sent)
				w.commitTxn()
			}
		},
	}
}

// SmallTxnsStreamed is the streamed variant of SmallTxns: the same pgbench-style changes, but
// clients transactions run at once, each of perTxn pgbench units (three updates and an insert),
// and all of them are streamed, their blocks of unitsPerBlock units interleaved round-robin, as
// when 32 sessions each run a long transaction; then they commit one after the other. This
// repeats until txnsPerClient×clients units were sent.
func SmallTxnsStreamed(txnsPerClient, clients, perTxn, unitsPerBlock int64, seed uint64) *Workload {
	units := txnsPerClient * clients
	rounds := max(1, units/(clients*perTxn))
	n := rounds * clients * perTxn
	return &Workload{
		Name:    fmt.Sprintf("small-txns-streamed %dx%d per=%d", txnsPerClient, clients, perTxn),
		Seed:    seed,
		Changes: 4 * n, Kept: 4 * n, Txns: rounds * clients,
		gen: func(w *writer) {
			xid := uint32(firstXid)
			for range rounds {
				sent := make([][4]bool, clients) // relations are sent once per streamed transaction
				for u := int64(0); u < perTxn; u += unitsPerBlock {
					for c := range clients {
						x := xid + uint32(c)
						w.streamStart(x, u == 0)
						for range min(unitsPerBlock, perTxn-u) {
							w.pgbenchTxn(x, true, 300, &sent[c])
						}
						w.streamStop()
					}
				}
				for c := range clients {
					w.streamCommit(xid + uint32(c))
				}
				xid += uint32(clients)
			}
		},
	}
}

// ManyOpenTxns is n streamed transactions open at once: each is streamed in one block of its
// relation and perTxn inserts, as when n sessions each ran a transaction that the server
// streamed (it streams the largest transaction when its memory is full, so a server with
// many sessions streams many small ones), and only then do they commit, one after the other.
// It measures what the consumer keeps per open transaction.
func ManyOpenTxns(n, perTxn int64, seed uint64) *Workload {
	return &Workload{
		Name: fmt.Sprintf("many-open-txns n=%d per=%d", n, perTxn), Seed: seed,
		Changes: n * perTxn, Kept: n * perTxn, Txns: n,
		gen: func(w *writer) {
			for i := range n {
				x := uint32(firstXid + i)
				w.streamStart(x, true)
				w.relation(&relTest, x, true)
				for range perTxn {
					w.insert(x, relTest.RelationID, true, w.tuple(nil, w.rng.Int64N(1<<31)))
				}
				w.streamStop()
			}
			for i := range n {
				w.streamCommit(uint32(firstXid + i))
			}
		},
	}
}
