package target

import (
	"context"
	"strconv"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/apply/conflict"
)

// The batch: the statements queued on a connection, sent in one round trip once it is large (or
// before a COPY, a commit, or what needs their results), and their results checked in order.

// BatchMaxOps and batchMaxBytes bound a batch of statements before it is sent.
const (
	BatchMaxOps   = 1000
	batchMaxBytes = 1 << 20
)

// batchOp describes one statement of a batch, to check its result.
type batchOp struct {
	op   byte   // 'I', 'U', 'D', 'T', or 0 for transaction control
	rel  *Table // the table, for I, U and D
	name string // the tables, for T

	// With conflict detection (see detect.Detector.Keep): the statement, its parameters kept at
	// (arg, narg) (the identity's from keyAt on), and for an UPDATE the new row at (row, nrow).
	st        *stmt
	arg, narg int32
	keyAt     int32
	row, nrow int32
	guarded   bool  // sent after SAVEPOINT pgr_guard: a unique violation is an update_exists
	check     bool  // the commit's check (see commitCheck)
	set       bool  // a set statement, or the savepoint around them (see coalesce.go)
	setEnd    bool  // the release of that savepoint: the set statements succeeded
	src       int32 // the source transaction, in srcs

	// For a SAVEPOINT (markSave) or ROLLBACK TO SAVEPOINT (markRollback) of subtransaction
	// sub: the row counts to keep or restore once its result arrives.
	mark int8
	sub  uint32
}

const (
	markSave     = 1
	markRollback = 2
)

// Control appends a statement without parameters or result to check.
func (t *Conn) Control(sql string) {
	t.newBatch()
	t.batch.ExecParams(sql, nil, nil, nil, nil)
	t.ops = append(t.ops, batchOp{})
	t.bytes += len(sql) + 32
}

func (t *Conn) newBatch() {
	if t.batch == nil {
		t.batch = &pgconn.Batch{}
	}
}

// queue appends an execution of s to the batch.
func (t *Conn) queue(s *stmt, params [][]byte, formats []int16, op batchOp) {
	op.st = s
	if t.det.On() {
		op.arg, op.narg = t.det.Keep(params, formats)
		op.src = t.curSrc()
	}
	t.newBatch()
	if allZero(formats) {
		formats = nil
	}
	t.batch.ExecPrepared(s.name, params, formats, nil)
	t.ops = append(t.ops, op)
	t.bytes += 32
	for _, p := range params {
		t.bytes += len(p) + 4
	}
}

func allZero(f []int16) bool {
	for _, v := range f {
		if v != 0 {
			return false
		}
	}
	return true
}

// maybeFlush sends the batch once it is large, or once it uses more statements than the
// connection may keep prepared (sent, they can be evicted).
func (t *Conn) maybeFlush(ctx context.Context) error {
	if len(t.ops) >= BatchMaxOps || t.bytes >= batchMaxBytes || t.stmts.over() || t.stepwise {
		return t.FlushBatch(ctx)
	}
	return nil
}

// FlushBatch sends the batch (after preparing the statements it uses) and checks each result.
func (t *Conn) FlushBatch(ctx context.Context) error {
	if err := t.prepareStatements(ctx); err != nil {
		return err
	}
	if t.batch == nil {
		return nil
	}
	b, ops := t.batch, t.ops
	t.batch, t.ops, t.bytes = nil, t.ops[:0], 0
	t.stmts.sent() // the statements of the batch may be evicted once it is sent
	t.stats.RoundTrips.Add(1)
	t.stats.Statements.Add(int64(len(ops)))
	mrr := t.pg.ExecBatch(ctx, b)
	i := 0
	var first, failed error
	var missed []int // ops that met no row or a conflict: resolved once the batch is done
	for mrr.NextResult() {
		rr := mrr.ResultReader()
		if i >= len(ops) {
			rr.Close()
			break
		}
		op := ops[i]
		i++
		affected := int64(-1)
		if t.det.On() && op.st != nil {
			// A checked statement returns the rows it changed (see checkedSQL).
			for rr.NextRow() {
				if v := rr.Values(); len(v) > 0 {
					affected, _ = strconv.ParseInt(string(v[0]), 10, 64)
				}
			}
		}
		tag, err := rr.Close()
		if err != nil {
			first, failed = t.statementError(op, err), err
			break
		}
		if affected < 0 {
			affected = tag.RowsAffected()
		}
		if op.set {
			if op.setEnd {
				t.rows.add(t.co.rows)
				for _, nt := range t.failed {
					t.co.recycle(nt)
				}
				clear(t.failed)
				t.co.rows, t.failed = rowCounts{}, t.failed[:0]
				t.setDone++
			}
			continue
		}
		if t.det.On() && op.st != nil && affected == 0 {
			missed = append(missed, i-1)
			continue
		}
		if op.mark != 0 {
			t.markRows(op)
			continue
		}
		t.checkResult(op, tag)
	}
	if err := mrr.Close(); err != nil && first == nil {
		// A statement without rows that fails yields no result of its own: the results so far
		// say which one it was.
		op := batchOp{}
		if i < len(ops) {
			op = ops[i]
			i++
		}
		first, failed = t.statementError(op, err), err
	}
	defer t.det.ResetArgs()
	if first != nil {
		if i > 0 && ops[i-1].set {
			return t.setFailed(ctx, first, failed, ops[:i-1], missed)
		}
		if i > 0 && ops[i-1].guarded && isViolation(failed) {
			return t.updateExists(ctx, ops[i-1], first, ops[:i-1], missed)
		}
		if i > 0 && ops[i-1].check {
			return t.heldBack(ctx, ops[:i-1], missed)
		}
		return first
	}
	if err := t.resolveAll(ctx, ops, missed); err != nil {
		return err
	}
	return nil
}

// checkResult counts a statement's rows, and the conflicts of an UPDATE or DELETE that found no
// row: skipped, as PostgreSQL's subscriber does.
func (t *Conn) checkResult(op batchOp, tag pgconn.CommandTag) {
	switch op.op {
	case 'I':
		if t.opts.InitialCopy {
			t.stats.InitialCopyRows.Add(1)
		} else {
			t.rows.inserts++
		}
	case 'U':
		if tag.RowsAffected() == 0 {
			t.stats.Conflicts[conflict.UpdateMissing].Add(1)
			t.log.Warn("conflict detected: the row to update does not exist on the target; skipped",
				"relation", op.rel.Name, "conflict", "update_missing")
			return
		}
		t.rows.updates++
	case 'D':
		if tag.RowsAffected() == 0 {
			t.stats.Conflicts[conflict.DeleteMissing].Add(1)
			t.log.Warn("conflict detected: the row to delete does not exist on the target; skipped",
				"relation", op.rel.Name, "conflict", "delete_missing")
			return
		}
		t.rows.deletes++
	case 'T':
		t.rows.truncates++
	}
}
