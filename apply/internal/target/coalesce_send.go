package target

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/pgsession"
)

// Coalescing (see coalesce.go): sending the held changes, as set statements after SAVEPOINT
// pgr_set, or row by row, and again row by row when a set statement failed.

// sendRowByRow queues nt's held changes row by row, in order, and sends its later changes so.
func (t *Conn) sendRowByRow(ctx context.Context, nt *netTable) error {
	nt.rowPath = true
	log := nt.log
	nt.log, nt.rows, nt.keys = nil, nil, nil
	return t.replay(ctx, nt.m, log)
}

// replay applies held changes row by row, each named by its own source transaction.
func (t *Conn) replay(ctx context.Context, m *Table, log []held) error {
	defer func() { t.srcOverride = -1 }()
	for _, h := range log {
		t.srcOverride = h.src
		var err error
		switch h.op {
		case 'I':
			err = t.Insert(ctx, m, h.tup)
		case 'U':
			err = t.update(ctx, m, &decoding.Update{OldKind: h.oldKind, Old: h.old, New: h.tup})
		case 'D':
			err = t.delete(ctx, m, &decoding.Delete{OldKind: h.oldKind, Old: h.old})
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// unhold sends every held change row by row (a savepoint, a rollback to one), and forgets the
// tables' state.
func (t *Conn) unhold(ctx context.Context) error {
	order := t.co.order
	rows := t.co.rows
	t.co = t.co.next()
	t.co.rows = rows
	for _, nt := range order {
		if err := t.replay(ctx, nt.m, nt.log); err != nil {
			return err
		}
	}
	return nil
}

// unholdTables sends the held changes of the tables a truncate names row by row, and their
// later changes so.
func (t *Conn) unholdTables(ctx context.Context, ms []*Table) error {
	for _, m := range ms {
		if nt := t.co.tables[m]; nt != nil && !nt.rowPath {
			if err := t.sendRowByRow(ctx, nt); err != nil {
				return err
			}
		}
	}
	return nil
}

// errSetFailed says that a set statement failed and the transaction was rolled back to the
// savepoint before them: their changes are to be sent row by row (replayFailed).
var errSetFailed = errors.New("apply: a set statement failed")

// flushSets sends the held changes as set statements, now (see queueSets).
func (t *Conn) flushSets(ctx context.Context) error {
	if err := t.queueSets(ctx); err != nil {
		return err
	}
	err := t.FlushBatch(ctx)
	if err == errSetFailed {
		return t.replayFailed(ctx)
	}
	return err
}

// queueSets queues the held changes: tables with a run of setCopyMin inserts row by row
// (their inserts go through COPY, sent now), then the set statements of the others after
// SAVEPOINT pgr_set. The tables' state is cleared; what the set statements apply is kept in
// failed until they succeed (see FlushBatch) or fail (replayFailed).
func (t *Conn) queueSets(ctx context.Context) error {
	order := t.co.order
	t.co = t.co.next()
	t.co.noteSizes(order)
	t.failed = t.failed[:0]
	var sets []*netTable
	for _, nt := range order {
		switch {
		case len(nt.log) == 0:
		case nt.most >= setCopyMin:
			if err := t.replay(ctx, nt.m, nt.log); err != nil {
				return err
			}
		default:
			sets = append(sets, nt)
		}
	}
	if err := t.FlushInserts(ctx); err != nil {
		return err
	}
	if len(sets) == 0 {
		return nil
	}
	t.Control("SAVEPOINT pgr_set")
	t.ops[len(t.ops)-1].set = true
	for _, sql := range setPlanOn {
		t.Control(sql)
		t.ops[len(t.ops)-1].set = true
	}
	var rows rowCounts
	for _, nt := range sets {
		t.failed = append(t.failed, nt)
		t.queueTableSets(nt, &rows)
	}
	for _, sql := range setPlanOff {
		t.Control(sql)
		t.ops[len(t.ops)-1].set = true
	}
	t.Control("RELEASE SAVEPOINT pgr_set")
	t.ops[len(t.ops)-1].set, t.ops[len(t.ops)-1].setEnd = true, true
	t.co.rows = rows
	return nil
}

// setPlanOn and setPlanOff surround the set statements of a target transaction: between them
// the planner joins a set statement's value arrays to its table by a nested loop, one probe of
// the key's index per row, as PostgreSQL's subscriber finds each row, and neither by a hash or
// merge join, which reads the whole table (or its whole index), nor by a scan of the whole table
// joined to the arrays row by row. For a group of a few thousand rows of a table of a hundred
// thousand, held in shared buffers, the planner's costs (a random page read per probe) favour
// the whole-table joins, which took two to three times as long as the probes; with a higher
// random_page_cost it scans the table and compares each of its rows with every row of the group.
// Every table applied so has a unique index on the columns the statements join on. The settings
// are local to the transaction, and setPlanOff sets them back to the session's own (RESET:
// apply's sessions never SET them), so that statements after the set statements, and the
// triggers they fire, plan as the target's configuration says. A failed set statement rolls back
// to the savepoint, which undoes setPlanOn.
var (
	setPlanOn = []string{"SELECT pg_catalog.set_config('enable_hashjoin', 'off', true), " +
		"pg_catalog.set_config('enable_mergejoin', 'off', true), pg_catalog.set_config('enable_seqscan', 'off', true)"}
	setPlanOff = []string{"RESET enable_hashjoin", "RESET enable_mergejoin", "RESET enable_seqscan"}
)

// noteSizes records the changes each table of order held (see coalescer.sizes).
func (c *coalescer) noteSizes(order []*netTable) {
	if len(c.sizes) > sizeHintTables {
		clear(c.sizes)
	}
	for _, nt := range order {
		if nt.rowPath {
			continue
		}
		if c.sizes == nil {
			c.sizes = map[*Table]int{}
		}
		c.sizes[nt.m] = min(len(nt.log), sizeHintMax)
	}
}

// replayFailed sends the changes of the set statements that failed row by row.
func (t *Conn) replayFailed(ctx context.Context) error {
	failed := t.failed
	t.failed = nil
	t.setFallbacks++
	for _, nt := range failed {
		if err := t.replay(ctx, nt.m, nt.log); err != nil {
			return err
		}
	}
	return nil
}

// setFailed handles a set statement that failed: the transaction goes back to the savepoint
// before the set statements, and the conflicts the batch's statements before it met are
// resolved. err is the server's error, returned as it is when starting again can cure it or the
// connection broke (there is nothing to roll back to then).
func (t *Conn) setFailed(ctx context.Context, first, failed error, ops []batchOp, missed []int) error {
	var pgErr *pgconn.PgError
	if !errors.As(failed, &pgErr) || pgsession.TransientSQLState(pgErr.Code) {
		return first
	}
	t.co.rows = rowCounts{}
	t.stats.RoundTrips.Add(1)
	err := t.pg.Exec(ctx, "ROLLBACK TO SAVEPOINT pgr_set; RELEASE SAVEPOINT pgr_set; "+
		"SELECT pg_catalog.set_config('pgreorder.missed', '', true)").Close()
	if err != nil {
		return err
	}
	t.log.Debug("a set statement failed: its changes are sent again one by one", "err", failed)
	if err := t.resolveAll(ctx, ops, missed); err != nil {
		return err
	}
	return errSetFailed
}
