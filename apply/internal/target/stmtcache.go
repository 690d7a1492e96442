package target

import (
	"container/list"
	"context"
	"errors"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// The statements prepared on a connection: a cache of them by relation and shape, bounded, least
// recently used evicted first, and the preparing of the new ones before the batch that uses them.

// DefaultMaxStatements is the bound on the statements prepared on one target connection when
// Options.MaxStatements is 0 (see stmtCache).
const DefaultMaxStatements = 256

// stmtCache holds the statements prepared on a connection, by relation and shape, the most
// recently used at the front of lru. Past max statements, the least recently used are
// deallocated (and prepared again when needed): each costs the server memory for its plan, and a
// target connection may write many tables. gen counts the batches sent (a statement used since
// the last one is in the batch being built and is not evicted); deallocate names the evicted
// statements that were prepared, pending the statements to prepare before the next batch.
type stmtCache struct {
	max        int
	stmts      map[stmtKey]*list.Element
	lru        list.List
	next       int
	gen        uint64
	deallocate []string
	pending    []prepare
}

// newStmtCache returns a cache of at most n statements (DefaultMaxStatements when 0).
func newStmtCache(n int) stmtCache {
	if n <= 0 {
		n = DefaultMaxStatements
	}
	return stmtCache{max: n}
}

// get returns the statement of key, marked used by the batch being built, or nil.
func (c *stmtCache) get(key stmtKey) *stmt {
	e := c.stmts[key]
	if e == nil {
		return nil
	}
	s := e.Value.(*stmt)
	s.gen = c.gen
	c.lru.MoveToFront(e)
	return s
}

// add names a new statement and keeps it, to be prepared before the next batch (p); it may
// evict others.
func (c *stmtCache) add(s *stmt, p prepare) {
	c.next++
	s.name, s.gen = "pgr_"+strconv.Itoa(c.next), c.gen
	if c.stmts == nil {
		c.stmts = map[stmtKey]*list.Element{}
	}
	c.stmts[s.key] = c.lru.PushFront(s)
	c.evict()
	p.s = s
	c.pending = append(c.pending, p)
}

// over says whether the cache holds more statements than it may keep (the batch being built
// uses them all): the batch is to be sent, so that they can be evicted.
func (c *stmtCache) over() bool { return c.lru.Len() > c.max }

// sent notes that the batch being built was sent: its statements may be evicted.
func (c *stmtCache) sent() {
	c.gen++
	c.evict()
}

type stmtKey struct {
	ri    *Relation
	shape string
}

// stmt is a prepared statement for one shape of change of one relation.
type stmt struct {
	name    string
	nparams int
	key     stmtKey
	gen     uint64 // the batch that last used it (stmtCache.gen)
	ready   bool   // prepared on the server
	cols    []int  // per parameter: the source column it carries

	// With conflict detection: the statement without its checks (plain: a plain INSERT, or an
	// UPDATE or DELETE whatever origin changed the row last), its parameter types, how its WHERE
	// identifies the row (where: the shape of the condition, full: REPLICA IDENTITY FULL), and
	// whether it may violate a unique constraint (risky: an UPDATE that sets a column of one).
	plain string
	oids  []uint32
	where []byte
	full  bool
	risky bool
}

// prepared returns the statement of the given shape for ri, preparing it (lazily, with the
// next batch) the first time.
func (t *Conn) prepared(m *Table, shape string, build func() (string, []uint32)) *stmt {
	key := stmtKey{m.info, shape}
	if s := t.stmts.get(key); s != nil {
		return s
	}
	sql, oids := build()
	s := &stmt{nparams: len(oids), key: key, cols: paramCols(m, shape)}
	if t.det.On() {
		s.plain, s.oids = sql, oids
		sql = t.checkedSQL(m, s, shape)
	}
	// Shapes begin with the statement's kind: 'I', 'U' or 'D'.
	t.stmts.add(s, prepare{sql: sql, oids: oids, op: shape[0], rel: m})
	return s
}

// paramCols returns, for a statement of the given shape, the source column each parameter
// carries (see insertStmt, update and delete).
func paramCols(m *Table, shape string) []int {
	var cols []int
	where := func(w string) {
		if m.Full {
			for i := 0; i < len(w) && i < len(m.cols); i++ {
				if w[i] == 1 {
					cols = append(cols, i)
				}
			}
			return
		}
		for j, i := range m.Key {
			if j < len(w) && w[j] == 1 {
				cols = append(cols, i)
			}
		}
	}
	switch shape[0] {
	case 'I':
		for i := range m.cols {
			cols = append(cols, i)
		}
	case 'U':
		set := shape[1:min(len(shape), 1+len(m.cols))]
		for i := 0; i < len(set); i++ {
			if set[i] != 0 {
				cols = append(cols, i)
			}
		}
		where(shape[1+len(set):])
	case 'D':
		where(shape[1:])
	}
	return cols
}

// evict drops the least recently used statements past max, but none the batch being built
// uses: their DEALLOCATE goes before the next statements are prepared.
func (c *stmtCache) evict() {
	for c.lru.Len() > c.max {
		e := c.lru.Back()
		s := e.Value.(*stmt)
		if s.gen == c.gen {
			return // the batch being built uses every statement left: they stay until it is sent
		}
		c.lru.Remove(e)
		delete(c.stmts, s.key)
		if s.ready {
			c.deallocate = append(c.deallocate, s.name)
			continue
		}
		for i, p := range c.pending {
			if p.s == s {
				c.pending = append(c.pending[:i], c.pending[i+1:]...)
				break
			}
		}
	}
}

type prepare struct {
	s    *stmt
	sql  string
	oids []uint32
	op   byte   // 'I', 'U' or 'D'
	rel  *Table // the table, for errors
}

// prepareStatements prepares the statements the batch is about to use.
func (t *Conn) prepareStatements(ctx context.Context) error {
	c := &t.stmts
	if len(c.deallocate) > 0 && len(c.pending) > 0 {
		var b strings.Builder
		for _, name := range c.deallocate {
			b.WriteString("DEALLOCATE " + name + ";") // names of our making: pgr_N
		}
		t.stats.RoundTrips.Add(1)
		if err := t.pg.Exec(ctx, b.String()).Close(); err != nil {
			return err
		}
		c.deallocate = c.deallocate[:0]
	}
	for len(c.pending) > 0 {
		p := c.pending[0]
		if _, err := t.pg.Prepare(ctx, p.s.name, p.sql, p.oids); err != nil {
			// The statement is ours, not the user's: the error names the table and, when the
			// server points into the statement, the column there.
			t.log.Debug("preparing a statement failed", "sql", p.sql, "err", err)
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Position > 0 {
				if i := columnAt(p.rel, p.sql, int(pgErr.Position)); i >= 0 {
					err = &columnError{column: p.rel.cols[i].name, typ: p.rel.cols[i].typ, err: err}
				}
			}
			return t.statementError(batchOp{op: p.op, rel: p.rel}, err)
		}
		p.s.ready = true
		t.stats.Prepares.Add(1)
		t.stats.preparedPeak(int64(c.lru.Len()))
		c.pending = c.pending[1:]
	}
	c.pending = nil
	return nil
}
