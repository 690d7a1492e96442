package target

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/apply/internal/detect"
	"github.com/pgreorder/pgreorder/decoding"
)

// The target transaction: begin, savepoints, rollback, commit with the progress row, and the rows
// it applied, counted once it commits.

// rowMark is the row count of the target transaction at the savepoint of subtransaction sub.
type rowMark struct {
	sub  uint32
	rows rowCounts
}

// Begin starts a transaction applying source transaction xid (see Source); BEGIN goes out
// with the first batch.
func (t *Conn) Begin(xid uint32, c *detect.SourceCommit) {
	t.inTxn = true
	t.Control("BEGIN")
	t.Source(xid, c)
}

// Savepoint takes a savepoint before the first change of subtransaction sub.
func (t *Conn) Savepoint(ctx context.Context, sub uint32) error {
	if err := t.unhold(ctx); err != nil {
		return err
	}
	if err := t.FlushInserts(ctx); err != nil {
		return err
	}
	if err := t.settleChecks(ctx); err != nil {
		return err
	}
	t.Control("SAVEPOINT s" + strconv.FormatUint(uint64(sub), 10))
	t.ops[len(t.ops)-1].mark, t.ops[len(t.ops)-1].sub = markSave, sub
	t.det.Savepoint(sub)
	return nil
}

// RollbackTo undoes everything since the savepoint of sub.
func (t *Conn) RollbackTo(ctx context.Context, sub uint32) error {
	if err := t.unhold(ctx); err != nil {
		return err
	}
	t.dropInserts() // not sent yet: nothing to undo on the server
	if err := t.settleChecks(ctx); err != nil {
		return err
	}
	t.Control("ROLLBACK TO SAVEPOINT s" + strconv.FormatUint(uint64(sub), 10))
	t.ops[len(t.ops)-1].mark, t.ops[len(t.ops)-1].sub = markRollback, sub
	t.det.RollbackTo(sub)
	return t.maybeFlush(ctx)
}

// Rollback ends the transaction without applying it. Statements not sent are dropped.
func (t *Conn) Rollback(ctx context.Context) error {
	t.co, t.failed = t.co.next(), nil
	t.dropInserts()
	t.batch, t.ops, t.bytes = nil, t.ops[:0], 0
	t.det.Rollback()
	t.DropRows()
	if !t.inTxn {
		return nil
	}
	t.inTxn = false
	return t.pg.Exec(ctx, "ROLLBACK").Close()
}

// SendAhead is FlushPending for a connection about to wait for more changes of the same
// transaction (a worker whose queue ran dry while the transaction streams): it sends the
// statements not sent yet but keeps a run of fewer than copyHoldRows inserts, which the next
// changes may lengthen. A COPY statement costs the target a price at its end that grows faster
// than its rows up to 1,000 (BenchmarkCopyRun: about 1.6 ms of the backend's CPU for a COPY of
// 1,000 rows, 2.9 ms for one of 8,192), so a run cut at every part of a streamed transaction (a
// few hundred rows each at a small logical_decoding_work_mem) costs the target several times
// what fewer, longer runs do. The run kept is sent by the next change that does not join it, by
// FlushPending, or at the commit.
func (t *Conn) SendAhead(ctx context.Context) error {
	if t.ins.rows > 0 && t.ins.rows < copyHoldRows && !t.stepwise && len(t.co.order) == 0 {
		return t.FlushBatch(ctx)
	}
	return t.FlushPending(ctx)
}

// FlushPending sends every statement and insert not sent yet.
func (t *Conn) FlushPending(ctx context.Context) error {
	if err := t.flushSets(ctx); err != nil {
		return err
	}
	if err := t.FlushInserts(ctx); err != nil {
		return err
	}
	return t.FlushBatch(ctx)
}

// Commit sends what is pending, the progress row for end, and COMMIT, in one round trip when
// no COPY is pending. Without Config.SynchronousCommit, sync makes this commit wait for the WAL flush.
func (t *Conn) Commit(ctx context.Context, key ProgressKey, end decoding.LSN, sync bool) error {
	if t.progress == nil {
		return errors.New("apply: the progress statement is not prepared on the target connection")
	}
	return t.commit(ctx, t.progress, key.Args(end), end, sync)
}

// commit is Commit, with the progress statement and its parameters given; end is the source
// transaction's end LSN, for the origin and the stats.
func (t *Conn) commit(ctx context.Context, progress *stmt, args [][]byte, end decoding.LSN, sync bool) error {
	if err := t.FlushInserts(ctx); err != nil {
		return err
	}
	if err := t.queueSets(ctx); err != nil {
		return err
	}
	check := t.hasChecked()
	for {
		t.newBatch()
		if check {
			t.commitCheck()
		}
		if t.origin != "" {
			t.originXact(end)
		}
		t.det.CompleteReports()
		t.queueLogRows()
		t.batch.ExecPrepared(progress.name, args, nil, nil)
		t.ops = append(t.ops, batchOp{})
		if sync && !t.opts.SynchronousCommit {
			t.Control("SET LOCAL synchronous_commit = on")
		}
		t.Control("COMMIT")
		t.inTxn = false
		err := t.FlushBatch(ctx)
		if err == errSetFailed {
			// A set statement failed: its changes go again, row by row, and then the commit.
			t.inTxn = true
			if err = t.replayFailed(ctx); err == nil {
				err = t.FlushInserts(ctx)
			}
			if err == nil {
				check = t.hasChecked()
				continue
			}
		}
		if err == errRecommit {
			// A checked statement of the batch met a conflict: the commit was held back and the
			// conflict resolved; commit now.
			t.inTxn, check = true, false
			continue
		}
		if err == nil {
			break
		}
		var ce *ChangeError
		if errors.As(err, &ce) && ce.Op == OpNone {
			ce.Op = OpCommit // a deferred constraint
		}
		t.det.DropReports()
		// The commit may not have been sent (a conflict held it back and its resolution
		// failed): a rollback must end the transaction.
		t.inTxn = true
		return err
	}
	t.det.Committed(&t.stats.Conflicts, t.log)
	t.CountRows()
	t.stats.Applied(end) // last: a reader that sees end sees the commit's conflicts counted
	return nil
}

// Source names the source transaction the target applies, for conflict reports and the
// origin's commit time: its xid, and once its commit arrived, c.
func (t *Conn) Source(xid uint32, c *detect.SourceCommit) {
	t.det.Source(xid, c)
}

// FlushWAL makes every commit that returned on the target before it durable, and writes the
// progress row at args' position (never moving it back), with one synchronous transaction.
//
// Why it is durable: PostgreSQL waits for the WAL flush at COMMIT (RecordTransactionCommit) only
// when the transaction wrote WAL before its commit record and synchronous_commit is not off; a
// transaction that only takes an xid commits asynchronously whatever synchronous_commit says, and
// flushes nothing. This one writes the progress row (an INSERT or an UPDATE, which always writes
// a heap record, even when the value does not change) with synchronous_commit on, so its COMMIT
// returns only once the WAL is flushed up to its commit record, past every record inserted before
// it: the commits that returned before it. The upsert returns pg_current_wal_insert_lsn() as it
// stood after those commits; after COMMIT, pg_current_wal_flush_lsn() must be at or past it, and
// is checked, so that a server that commits this transaction without flushing is found out
// rather than trusted.
func (t *Conn) FlushWAL(ctx context.Context, sql string, args [][]byte) error {
	t.stats.RoundTrips.Add(1)
	b := &pgconn.Batch{}
	b.ExecParams("BEGIN", nil, nil, nil, nil)
	b.ExecParams("SET LOCAL synchronous_commit = on", nil, nil, nil, nil)
	b.ExecParams(sql, args, nil, nil, nil)
	b.ExecParams("COMMIT", nil, nil, nil, nil)
	b.ExecParams("SELECT pg_catalog.pg_current_wal_flush_lsn()::text", nil, nil, nil, nil)
	res, err := t.pg.ExecBatch(ctx, b).ReadAll()
	if err != nil {
		return fmt.Errorf("apply: flushing the target's WAL: %w", err)
	}
	if len(res) != 5 || len(res[2].Rows) != 1 || len(res[4].Rows) != 1 {
		return fmt.Errorf("apply: flushing the target's WAL: the progress row of slot %q was not written "+
			"(it names another source system)", args[0])
	}
	var ins, flushed decoding.LSN
	if err := ins.UnmarshalText(res[2].Rows[0][0]); err != nil {
		return fmt.Errorf("apply: flushing the target's WAL: %w", err)
	}
	if err := flushed.UnmarshalText(res[4].Rows[0][0]); err != nil {
		return fmt.Errorf("apply: flushing the target's WAL: %w", err)
	}
	if flushed < ins {
		return fmt.Errorf("apply: the target's WAL is flushed to %s after a synchronous commit, short of %s "+
			"(is synchronous_commit forced off for the target role?)", flushed, ins)
	}
	return nil
}

// markRows keeps the row counts at a savepoint, or restores them at a rollback to it.
func (t *Conn) markRows(op batchOp) {
	if op.mark == markSave {
		t.rowMarks = append(t.rowMarks, rowMark{sub: op.sub, rows: t.rows})
		return
	}
	for i, m := range t.rowMarks {
		if m.sub == op.sub { // the savepoint stays, the rows since it are undone
			t.rows, t.rowMarks = m.rows, t.rowMarks[:i+1]
			return
		}
	}
}

// CountRows adds the rows of the transaction that committed to the stats.
func (t *Conn) CountRows() {
	t.stats.count(t.rows)
	t.DropRows()
}

// DropRows forgets the rows of a transaction that did not commit.
func (t *Conn) DropRows() {
	t.rows, t.rowMarks = rowCounts{}, t.rowMarks[:0]
}

// CommitCopy sends the pending rows and commits, without a progress row.
func (t *Conn) CommitCopy(ctx context.Context) error {
	if err := t.FlushInserts(ctx); err != nil {
		return err
	}
	t.Control("COMMIT")
	t.inTxn = false
	if err := t.FlushBatch(ctx); err != nil {
		return err
	}
	t.CountRows()
	return nil
}
