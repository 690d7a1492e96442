package target

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/copycodec"
)

// Runs of inserts: the inserts into one table gather into a run, which goes through COPY when it
// is long enough and as INSERT statements in the batch otherwise.

const (
	// copyMinRows is the shortest run of inserts into one table that goes through COPY; shorter
	// runs are INSERT statements in the batch, which cost no round trip of their own.
	copyMinRows = 4
	// insertBufMax bounds the bytes of a run of inserts held before it is sent.
	insertBufMax = 1 << 20
	// copyHoldRows is the run of inserts SendAhead sends rather than keeps for more to join.
	copyHoldRows = 8192
)

// insertRun is the run of inserts not yet sent: rows of m, each field as in COPY binary (a
// 4-byte length, -1 for NULL, then the bytes).
type insertRun struct {
	m       *Table
	binary  bool // the run's values are binary ('b'), else text
	buf     []byte
	rows    int
	copyBuf []byte // the COPY data, its room kept for the next run
}

// takes says whether tup, of m and binary or not, may join the run: the run is empty, or of
// the same table and kind of values (a row of NULLs only goes with either).
func (r *insertRun) takes(m *Table, bin bool, tup decoding.Tuple) bool {
	return r.rows == 0 || (r.m == m && (r.binary == bin || allNull(tup)))
}

// add appends tup, of m, to the run.
func (r *insertRun) add(m *Table, bin bool, tup decoding.Tuple) {
	if r.rows == 0 {
		r.m, r.binary = m, bin
	}
	for _, c := range tup {
		if c.Kind == decoding.ColumnNull {
			r.buf = binary.BigEndian.AppendUint32(r.buf, 0xffffffff)
			continue
		}
		r.buf = binary.BigEndian.AppendUint32(r.buf, uint32(len(c.Data)))
		r.buf = append(r.buf, c.Data...)
	}
	r.rows++
}

// full says whether the run holds as many bytes as it may before it is sent.
func (r *insertRun) full() bool { return len(r.buf) >= insertBufMax }

// reset empties the run, keeping its room unless it grew large.
func (r *insertRun) reset() {
	r.m, r.rows = nil, 0
	r.buf = r.buf[:0]
	if cap(r.buf) > 4*insertBufMax {
		r.buf = nil
	}
}

// copyIn returns the run as the data and the statement of a COPY.
func (r *insertRun) copyIn() (data []byte, sql string) {
	m := r.m
	fields := make([]copycodec.Field, len(m.cols))
	buf := r.copyBuf[:0]
	if r.binary {
		buf = append(buf, copycodec.BinaryHeader...)
		for rest := r.buf; len(rest) > 0; {
			buf = binary.BigEndian.AppendUint16(buf, uint16(len(fields)))
			start := rest
			rest = insRow(rest, fields)
			buf = append(buf, start[:len(start)-len(rest)]...)
		}
		buf = append(buf, copycodec.BinaryTrailer...)
		sql = "COPY " + m.Name + " " + m.copyCols + " FROM STDIN (FORMAT binary)"
	} else {
		for rest := r.buf; len(rest) > 0; {
			rest = insRow(rest, fields)
			buf = copycodec.AppendTextRow(buf, fields)
		}
		sql = "COPY " + m.Name + " " + m.copyCols + " FROM STDIN"
	}
	r.copyBuf = buf
	if cap(r.copyBuf) > 4*insertBufMax {
		r.copyBuf = nil
	}
	return buf, sql
}

// rowClass says how a tuple's values can be sent: all text (or NULL), all binary, or mixed.
func rowClass(tup decoding.Tuple) (binary, mixed bool) {
	var text, bin bool
	for _, c := range tup {
		switch c.Kind {
		case decoding.ColumnText:
			text = true
		case decoding.ColumnBinary:
			bin = true
		}
	}
	return bin, text && bin
}

func (t *Conn) Insert(ctx context.Context, m *Table, tup decoding.Tuple) error {
	if len(tup) != len(m.cols) {
		return &ChangeError{Op: OpInsert, Relation: m.Name, Err: fmt.Errorf("row has %d columns, the relation %d", len(tup), len(m.cols))}
	}
	bin, mixed := rowClass(tup)
	if mixed {
		if err := t.FlushInserts(ctx); err != nil {
			return err
		}
		return t.insertStatement(ctx, m, tup)
	}
	if !t.ins.takes(m, bin, tup) {
		if err := t.FlushInserts(ctx); err != nil {
			return err
		}
	}
	t.ins.add(m, bin, tup)
	if t.det.On() {
		t.det.InsSrcs = append(t.det.InsSrcs, t.curSrc())
	}
	if t.ins.full() || t.stepwise {
		return t.FlushInserts(ctx)
	}
	return nil
}

func allNull(tup decoding.Tuple) bool {
	for _, c := range tup {
		if c.Kind != decoding.ColumnNull {
			return false
		}
	}
	return true
}

// insRow reads the next row of the insert run from buf into fields.
func insRow(buf []byte, fields []copycodec.Field) []byte {
	for i := range fields {
		n := binary.BigEndian.Uint32(buf)
		buf = buf[4:]
		if n == 0xffffffff {
			fields[i] = copycodec.Field{Null: true}
			continue
		}
		fields[i] = copycodec.Field{Data: buf[:n:n]}
		buf = buf[n:]
	}
	return buf
}

// FlushInserts sends the pending run of inserts: through COPY when it is long enough (after the
// batch before it), else as INSERT statements in the batch.
func (t *Conn) FlushInserts(ctx context.Context) error {
	if t.ins.rows == 0 {
		return nil
	}
	if t.ins.rows < copyMinRows {
		t.flushInsertsToBatch()
		return t.maybeFlush(ctx)
	}
	m, n := t.ins.m, t.ins.rows
	guard := false
	if t.det.On() {
		rc, err := t.conflictInfo(ctx, m)
		if err != nil {
			return err
		}
		// A unique violation must not abort the transaction: the COPY goes after a savepoint,
		// and on a violation the run is sent again as INSERT ... ON CONFLICT DO NOTHING.
		guard = rc.OnConflict
	}
	resolved := t.det.Resolved
	if guard {
		t.Control("SAVEPOINT pgr_copy")
	}
	if err := t.FlushBatch(ctx); err != nil {
		return err
	}
	if guard && t.det.Resolved != resolved {
		// The batch's conflicts were resolved after the savepoint (their statements ran before
		// it): a rollback to it would undo the resolutions. Take it again after them.
		t.stats.RoundTrips.Add(1)
		if err := t.pg.Exec(ctx, "RELEASE SAVEPOINT pgr_copy; SAVEPOINT pgr_copy").Close(); err != nil {
			t.dropInserts()
			return err
		}
	}
	buf, sql := t.ins.copyIn()
	t.stats.RoundTrips.Add(1)
	t.stats.Statements.Add(1)
	tag, err := t.pg.CopyFrom(ctx, bytes.NewReader(buf), sql)
	if err != nil && guard && isViolation(err) {
		t.stats.RoundTrips.Add(1)
		if err := t.pg.Exec(ctx, "ROLLBACK TO SAVEPOINT pgr_copy; RELEASE SAVEPOINT pgr_copy").Close(); err != nil {
			t.dropInserts()
			return err
		}
		t.flushInsertsToBatch()
		return t.FlushBatch(ctx)
	}
	t.dropInserts()
	if err != nil {
		return t.statementError(batchOp{op: 'I', rel: m}, err)
	}
	if guard {
		t.Control("RELEASE SAVEPOINT pgr_copy")
	}
	if tag.RowsAffected() != int64(n) {
		return &ChangeError{Op: OpInsert, Relation: m.Name, Err: fmt.Errorf("COPY inserted %d rows, want %d", tag.RowsAffected(), n)}
	}
	if t.opts.InitialCopy {
		t.stats.InitialCopyRows.Add(int64(n))
	} else {
		t.rows.inserts += int64(n)
		t.rows.insertsViaCopy += int64(n)
	}
	return nil
}

// flushInsertsToBatch turns the pending run of inserts into INSERT statements in the batch.
func (t *Conn) flushInsertsToBatch() {
	if t.ins.rows == 0 {
		return
	}
	m := t.ins.m
	fields := make([]copycodec.Field, len(m.cols))
	formats := t.formats[:0]
	for range fields {
		if t.ins.binary {
			formats = append(formats, 1)
		} else {
			formats = append(formats, 0)
		}
	}
	t.formats = formats
	st := t.insertStmt(m)
	for row, rest := 0, t.ins.buf; len(rest) > 0; row++ {
		rest = insRow(rest, fields)
		params := t.params[:0]
		for _, f := range fields {
			if f.Null {
				params = append(params, nil)
			} else {
				params = append(params, nonNil(f.Data))
			}
		}
		t.params = params
		t.queue(st, params, formats, batchOp{op: 'I', rel: m})
		if row < len(t.det.InsSrcs) {
			t.ops[len(t.ops)-1].src = t.det.InsSrcs[row] // the run may span source transactions
		}
	}
	t.dropInserts()
}

// dropInserts forgets the run of inserts not sent.
func (t *Conn) dropInserts() {
	t.det.InsSrcs = t.det.InsSrcs[:0]
	t.ins.reset()
}

// insertStatement queues one INSERT of tup, whose values may mix text and binary.
func (t *Conn) insertStatement(ctx context.Context, m *Table, tup decoding.Tuple) error {
	params, formats := t.params[:0], t.formats[:0]
	for _, c := range tup {
		params, formats = appendParam(params, formats, c)
	}
	t.params, t.formats = params, formats
	t.queue(t.insertStmt(m), params, formats, batchOp{op: 'I', rel: m})
	return t.maybeFlush(ctx)
}
