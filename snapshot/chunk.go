package snapshot

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/copycodec"
)

// Handler receives the chunks of the copy. Run calls it from Config.Workers goroutines at once,
// each with a chunk of its own: it must be safe for concurrent use. It reads the chunk's rows by
// ranging over Changes (directly, or through a pgvalue.Decoder's Changes) to the end, and returns
// nil once it has handled them; an error stops the whole copy, and Run returns it inside a
// *ChunkError. The rows are read from the server while the handler iterates: a slow handler slows
// the copy of its chunk, never the others. A handler that waits for something else (a target
// database) must stop waiting when ctx is done: Run, and Session.Close, wait for it.
type Handler func(ctx context.Context, c *Chunk) error

var errIteratedTwice = errors.New("snapshot: a chunk's Changes can be iterated only once")

// errStopped ends the COPY when the handler breaks out of its loop.
var errStopped = errors.New("snapshot: the handler stopped reading")

// Chunk is a part of one table, copied on one worker connection: the whole table, one
// partition, or a range of the pages of either. Together, the chunks of a table hold each of its
// rows (those its row filter publishes) exactly once, as they were at the snapshot's point.
//
// A Chunk is a pgvalue.Source: pgvalue.Decoder.Changes(chunk) yields its rows as pgvalue.Change
// values with Op decoding.MsgInsert, resolved against the same relation and types the stream's
// Relation and Type messages give, so that a consumer handles a copied ("read") row exactly as
// an insert. It can tell them apart by where they come from: a Chunk, not a streamed
// transaction.
type Chunk struct {
	Table  *Table
	Index  int    // the chunk's index among the table's chunks, from 0
	Worker int    // the worker copying it, from 0 to the number of workers - 1: for per-worker state
	Source string // the relation read: the table, or one of its partitions
	// Pages is the range of pages read, as "[lo,hi)" or "[lo,end)", "" for the whole relation.
	Pages string

	ctx    context.Context
	s      *Session
	conn   *pgconn.PgConn
	sql    string
	binary bool

	started  bool
	complete bool
	stopped  bool
	err      error
	rows     int64
	ins      decoding.Insert
}

// ConsistentPoint returns the LSN of the snapshot the chunk is read in: the slot's consistent
// point.
func (c *Chunk) ConsistentPoint() decoding.LSN { return c.s.snap.ConsistentPoint }

// Relation returns the table's relation for its OID, and false for any other id.
func (c *Chunk) Relation(id uint32) (*decoding.Relation, bool) {
	if id != c.Table.OID {
		return nil, false
	}
	return c.Table.Relation, true
}

// Type returns the description of a type the table's columns use that is not built in, as the
// stream's Type message gives it.
func (c *Chunk) Type(oid uint32) (*decoding.DataType, bool) { return c.Table.Type(oid) }

// Rows returns the number of rows read so far.
func (c *Chunk) Rows() int64 { return c.rows }

// String describes the chunk, as "public.t chunk 2/8 pages [256,384)".
func (c *Chunk) String() string {
	s := c.Table.String() + " chunk " + strconv.Itoa(c.Index+1) + "/" + strconv.Itoa(c.Table.Chunks)
	if c.Source != c.Table.sqlName() {
		s += " partition " + c.Source
	}
	if c.Pages != "" {
		s += " pages " + c.Pages
	}
	return s
}

// Changes runs the chunk's COPY and yields each row, as a decoding.Change whose Msg is a
// *decoding.Insert of the table (its RelationID is the table's OID; its New tuple holds the
// published columns in the Relation's order, each decoding.ColumnText or ColumnBinary as
// Config.Binary asks, or ColumnNull), whose Relation is the table's and whose Schema is the
// chunk. It can be iterated once. The Insert and the Data of its columns are valid until the next iteration
// step: they alias the connection's buffers; copy what must last longer. A failure (server,
// connection, context, malformed data) is yielded as the last element, with a nil message.
// Breaking out of the loop abandons the chunk, and the copy fails (ErrNotConsumed) unless the
// handler returns an error of its own.
func (c *Chunk) Changes() iter.Seq2[decoding.Change, error] {
	return func(yield func(decoding.Change, error) bool) {
		if c.started {
			yield(decoding.Change{}, errIteratedTwice)
			return
		}
		c.started = true
		if c.conn == nil {
			c.err = ErrClosed
			yield(decoding.Change{}, c.err)
			return
		}
		c.ins = decoding.Insert{RelationID: c.Table.OID}
		rr := copycodec.NewRowReader(c.binary, c.Table.kinds, func(t decoding.Tuple) error {
			c.ins.New = t
			c.rows++
			c.Table.rows.Add(1)
			if !yield(decoding.Change{Msg: &c.ins, Relation: c.Table.Relation, Schema: c}, nil) {
				c.stopped = true
				return errStopped
			}
			return nil
		})
		tag, err := c.conn.CopyTo(c.ctx, rr, c.sql)
		if c.stopped {
			// The COPY was abandoned: pgconn closed the connection.
			c.s.markBroken(c.Worker)
			return
		}
		if err == nil {
			err = rr.Finish()
		}
		if err == nil {
			if n, ok := copyCount(tag); !ok || n != rr.Rows() {
				err = &FormatError{Row: rr.Rows(), Problem: fmt.Sprintf("the server reports %q, %d rows were read", tag, rr.Rows())}
			}
		}
		if fe := (*copycodec.FormatError)(nil); errors.As(err, &fe) {
			err = &FormatError{Row: fe.Row, Problem: fe.Problem}
		}
		if err != nil {
			if c.ctx.Err() != nil && !errors.Is(err, c.ctx.Err()) {
				err = fmt.Errorf("%w (%w)", c.ctx.Err(), err)
			}
			c.err = err
			c.s.markBroken(c.Worker)
			yield(decoding.Change{}, err)
			return
		}
		c.complete = true
	}
}

// copyCount parses the row count of a "COPY n" command tag.
func copyCount(tag pgconn.CommandTag) (int64, bool) {
	n, ok := strings.CutPrefix(tag.String(), "COPY ")
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseInt(n, 10, 64)
	return v, err == nil
}

// chunkSQL returns the COPY statement of a chunk: the table's published columns, from src,
// within the pages [lo, hi) (lo < 0: every page; hi < 0: to the end), with the row filter.
func chunkSQL(t *Table, src source, lo, hi int64, binary bool) string {
	var b strings.Builder
	b.WriteString("COPY (SELECT ")
	b.WriteString(strings.Join(t.exprs, ", "))
	b.WriteString(" FROM ")
	if src.only {
		b.WriteString("ONLY ")
	}
	b.WriteString(src.sqlName)
	var conds []string
	if lo > 0 {
		conds = append(conds, fmt.Sprintf("ctid >= '(%d,0)'::pg_catalog.tid", lo))
	}
	if hi >= 0 {
		conds = append(conds, fmt.Sprintf("ctid < '(%d,0)'::pg_catalog.tid", hi))
	}
	if t.RowFilter != "" {
		conds = append(conds, "("+t.RowFilter+")")
	}
	if len(conds) > 0 {
		b.WriteString(" WHERE ")
		b.WriteString(strings.Join(conds, " AND "))
	}
	b.WriteString(") TO STDOUT")
	if binary {
		b.WriteString(" (FORMAT binary)")
	}
	return b.String()
}
