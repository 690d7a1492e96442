package detect

import (
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/pgreorder/pgreorder/apply/conflict"
	"github.com/pgreorder/pgreorder/decoding"
)

// Detection is what a session knows about the target for conflict detection; shared by its
// targets, read-only once made.
type Detection struct {
	Config  *conflict.Config
	TrackTS bool     // the target has track_commit_timestamp on
	Ours    []uint32 // the Applier's replication origins' ids, when it has origins
	Origin  string   // the Applier's (the leader's) origin name, or ""
	Tomb    *Tombstones
	LogSQL  string // inserts conflict rows into conflict.Config.LogTable, or ""
	Log     *slog.Logger
}

// On reports whether conflict detection is on.
func (d *Detector) On() bool { return d.Detection != nil }

// OriginCheck reports whether updates and deletes check the origin of the row they change.
func (d *Detection) OriginCheck() bool { return d.TrackTS && len(d.Ours) > 0 }

// Locks reports whether the local rows of a conflict of one of types are looked up locked:
// when one is resolved by last_update_wins, whose decision rests on the rows' commit times and
// must still hold when the source's change is written. A row looked up unlocked could be changed
// by a local transaction between the lookup and that write, which would then undo the newer
// local change (the UPDATE or DELETE waits for that transaction's lock and then goes on with
// the new version). Locking costs UPDATE privilege on the table, which writing needs anyway.
func (d *Detection) Locks(types ...conflict.Type) bool {
	for _, ct := range types {
		if d.Config.Resolution(ct) == conflict.LastUpdateWins {
			return true
		}
	}
	return false
}

// Remote is the source transaction a target applies, as conflict reports name it.
type Remote struct {
	Xid        uint32
	CommitTime time.Time // zero until known (a transaction applied before its commit arrived)
	Origin     string
	End        decoding.LSN
}

// FmtUnchanged marks a kept value the source did not send (an unchanged TOASTed value).
const FmtUnchanged = -1

// Keep copies a statement's parameters for conflict resolution; it returns where they are.
func (d *Detector) Keep(params [][]byte, formats []int16) (at, n int32) {
	at = int32(len(d.argv))
	for i, p := range params {
		var f int16
		if i < len(formats) {
			f = formats[i]
		}
		d.argf = append(d.argf, f)
		if p == nil {
			d.argv = append(d.argv, nil)
			continue
		}
		start := len(d.arena)
		d.arena = append(d.arena, p...)
		d.argv = append(d.argv, d.arena[start:len(d.arena):len(d.arena)])
	}
	return at, int32(len(params))
}

// KeepTuple copies a source row.
func (d *Detector) KeepTuple(tup decoding.Tuple) (at, n int32) {
	at = int32(len(d.argv))
	for _, c := range tup {
		switch c.Kind {
		case decoding.ColumnNull:
			d.argv, d.argf = append(d.argv, nil), append(d.argf, 0)
		case decoding.ColumnUnchanged:
			d.argv, d.argf = append(d.argv, nil), append(d.argf, FmtUnchanged)
		default:
			f := int16(0)
			if c.Kind == decoding.ColumnBinary {
				f = 1
			}
			start := len(d.arena)
			d.arena = append(d.arena, c.Data...)
			d.argv, d.argf = append(d.argv, d.arena[start:len(d.arena):len(d.arena)]), append(d.argf, f)
		}
	}
	return at, int32(len(tup))
}

// Kept returns kept values; the arena is not reused until ResetArgs.
func (d *Detector) Kept(at, n int32) ([][]byte, []int16) {
	return d.argv[at : at+n : at+n], d.argf[at : at+n : at+n]
}

func (d *Detector) ResetArgs() {
	if !d.On() {
		return
	}
	clear(d.argv)
	d.argv, d.argf, d.arena = d.argv[:0], d.argf[:0], d.arena[:0]
	if cap(d.arena) > argsMax {
		d.arena = nil
	}
}

// NewConflict starts the report of a conflict of the transaction being applied.
func (d *Detector) NewConflict(ct conflict.Type, m *Table) *conflict.Report {
	r := d.OpSrc
	c := &conflict.Report{Type: ct, Relation: m.Name, RemoteXid: r.Xid, RemoteFinalLSN: r.End,
		RemoteCommitTime: r.CommitTime, RemoteOrigin: r.Origin}
	return c
}

// Resolve decides what to do about c: it returns whether to apply the source change, or an
// error when the resolution is conflict.Error. The report is kept until the transaction commits.
func (d *Detector) Resolve(c *conflict.Report) (bool, *conflict.StopError) {
	r := d.Config.Resolution(c.Type)
	apply := false
	switch r {
	case conflict.ApplyRemote:
		apply = true
	case conflict.LastUpdateWins:
		apply = d.remoteWins(c)
		if apply {
			r, c.Winner = conflict.ApplyRemote, conflict.RemoteWins
		} else {
			r, c.Winner = conflict.Skip, conflict.LocalWins
		}
	case conflict.Error:
		c.Resolution = r
		return false, newConflictError(c)
	}
	c.Resolution = r
	d.Reports = append(d.Reports, c)
	return apply, nil
}

// remoteWins compares the source transaction's commit time with the local rows' (for
// update_deleted, the deletion's): the later wins. A source transaction whose commit has not
// arrived yet commits after now. Equal times are decided by the rows' text, the greater
// winning, so that two nodes replicating to each other pick the same version.
func (d *Detector) remoteWins(c *conflict.Report) bool {
	rt := d.OpSrc.CommitTime
	if rt.IsZero() {
		rt = d.Now()
	}
	for _, l := range c.Local {
		switch {
		case l.CommitTime.IsZero() || l.CommitTime.Before(rt):
		case l.CommitTime.After(rt):
			return false
		default:
			if rowText(l.Row) >= rowText(c.Remote) {
				return false
			}
		}
	}
	return true
}

func rowText(row []conflict.ColumnValue) string {
	var b strings.Builder
	for _, c := range row {
		if c.Value == nil {
			b.WriteString("\x00N")
		} else {
			b.WriteString("\x00V" + *c.Value)
		}
	}
	return b.String()
}

// CompleteReports fills in the commit of the source transaction in reports made before it
// arrived (a transaction applied as its parts arrive).
func (d *Detector) CompleteReports() {
	for _, c := range d.Reports {
		if c.RemoteCommitTime.IsZero() {
			c.RemoteCommitTime = d.Remote.CommitTime
		}
		if c.RemoteFinalLSN == 0 {
			c.RemoteFinalLSN = d.Remote.End
		}
		if c.RemoteOrigin == "" {
			c.RemoteOrigin = d.Remote.Origin
		}
	}
}

// emitReports logs and counts the conflicts of the transaction that just committed.
func (d *Detector) emitReports(counts *ConflictCounts, log *slog.Logger) {
	for _, c := range d.Reports {
		counts[c.Type].Add(1)
		LogConflict(c, log, slog.LevelWarn)
	}
	d.DropReports()
}

func (d *Detector) DropReports() {
	clear(d.Reports)
	d.Reports, d.marks = d.Reports[:0], d.marks[:0]
}

// Source records the source transaction being applied: its xid, and once its commit arrived, c.
func (d *Detector) Source(xid uint32, c *SourceCommit) {
	d.Remote = Remote{Xid: xid}
	if c != nil {
		d.Remote.CommitTime, d.Remote.Origin, d.Remote.End = c.Time, c.Origin, c.End
	}
	if !d.On() {
		return
	}
	if n := len(d.Srcs); n > 0 && d.Srcs[n-1].Xid == xid {
		d.Srcs[n-1] = d.Remote // its commit arrived
	} else {
		d.Srcs = append(d.Srcs, d.Remote)
	}
}

// Savepoint marks the reports made before the savepoint of subtransaction sub.
func (d *Detector) Savepoint(sub uint32) {
	if d.On() {
		d.marks = append(d.marks, reportMark{sub: sub, n: len(d.Reports)})
	}
}

// RollbackTo drops the reports made since the savepoint of sub: the subtransaction's conflicts
// are undone with it.
func (d *Detector) RollbackTo(sub uint32) {
	for i, m := range d.marks {
		if m.sub == sub {
			clear(d.Reports[m.n:])
			d.Reports, d.marks = d.Reports[:m.n], d.marks[:i+1]
			break
		}
	}
}

// Rollback forgets the target transaction rolled back.
func (d *Detector) Rollback() {
	d.ResetArgs()
	d.DropReports()
	d.Srcs = d.Srcs[:0]
}

// Committed records that the target transaction committed: its conflicts are counted and
// logged, and the apply lag is the tombstones'.
func (d *Detector) Committed(counts *ConflictCounts, log *slog.Logger) {
	if d.On() && d.Tomb != nil {
		d.Tomb.Committed(d.Remote.CommitTime)
	}
	d.emitReports(counts, log)
	d.Srcs = d.Srcs[:0]
}

// reportMark is the number of conflict reports made before a savepoint.
type reportMark struct {
	sub uint32
	n   int
}

// SrcOf returns the source transaction src (an index in Srcs) of a statement: a group (Buffered) applies several in
// one target transaction, and its conflicts are resolved after later ones were queued.
func (d *Detector) SrcOf(src int32) Remote {
	if src >= 0 && int(src) < len(d.Srcs) {
		return d.Srcs[src]
	}
	return d.Remote
}

// NumConflictTypes is the number of conflict types, for arrays indexed by them.
const NumConflictTypes = int(conflict.MultipleUniqueConflicts) + 1

// ConflictCounts count conflicts by type.
type ConflictCounts [NumConflictTypes]atomic.Int64

// conflictIdents and resolutionIdents are the Go names of the constants, for hints.
var (
	conflictIdents = [NumConflictTypes]string{
		conflict.InsertExists: "InsertExists", conflict.UpdateOriginDiffers: "UpdateOriginDiffers",
		conflict.UpdateExists: "UpdateExists", conflict.UpdateMissing: "UpdateMissing",
		conflict.DeleteOriginDiffers: "DeleteOriginDiffers", conflict.UpdateDeleted: "UpdateDeleted",
		conflict.DeleteMissing: "DeleteMissing", conflict.MultipleUniqueConflicts: "MultipleUniqueConflicts",
	}
	resolutionIdents = map[conflict.Resolution]string{
		conflict.Default: "Default", conflict.Error: "Error", conflict.Skip: "Skip",
		conflict.ApplyRemote: "ApplyRemote", conflict.LastUpdateWins: "LastUpdateWins",
	}
)

// newConflictError is the error of conflict c, which stops Run, with its hint in terms of Config.
func newConflictError(c *conflict.Report) *conflict.StopError {
	e := &conflict.StopError{Report: c}
	rs := e.Resolutions()
	h := "set Config.Conflicts.Resolutions[conflict." + conflictIdents[c.Type] + "] to conflict." + resolutionIdents[rs[0]]
	if len(rs) > 1 {
		h += " (or conflict." + resolutionIdents[rs[1]] + ")"
	}
	e.Hint = h + " to get past it"
	return e
}

// Detector is a target's conflict detection: the session's settings (nil when detection is
// off) and what it keeps of the transaction the target applies: the source transactions, the
// conflicts met and their savepoint marks, and the statements' parameters to resolve them with.
// The target calls it as it queues statements, as their results arrive and as it commits.
type Detector struct {
	*Detection
	Now func() time.Time // the clock of a commit not arrived yet (see remoteWins)

	Remote  Remote             // the source transaction being applied
	Reports []*conflict.Report // the transaction's conflicts, reported once it commits
	Srcs    []Remote           // the source transactions applied in the target transaction
	InsSrcs []int32            // per row of the insert run: its source transaction, in srcs
	OpSrc   Remote             // the source transaction of the change whose conflict is being resolved
	marks   []reportMark       // per savepoint taken: the reports made before it
	// Resolved counts the conflicts Resolved (statements looked up after they changed no row
	// or violated a unique constraint), so that a savepoint taken before a resolution can be
	// taken again after it.
	Resolved int
	// The batch's statements' parameters, kept (with detection) to resolve their conflicts:
	// argv[i] aliases arena (nil for NULL), argf[i] is its format (FmtUnchanged: not sent).
	argv  [][]byte
	argf  []int16
	arena []byte
}

// argsMax bounds the bytes of kept parameters held on to between batches.
const argsMax = 4 << 20

// SourceCommit is what the commit of a source transaction says, once it arrived.
type SourceCommit struct {
	Time   time.Time
	Origin string
	End    decoding.LSN
}
