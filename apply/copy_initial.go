package apply

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/pgreorder/pgreorder/apply/internal/target"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/configerr"
	"github.com/pgreorder/pgreorder/internal/pgsession"
	"github.com/pgreorder/pgreorder/internal/retry"
	"github.com/pgreorder/pgreorder/snapshot"
)

// The initial copy (Config.Copy). A session that finds no progress row for its slot creates the
// slot with an exported snapshot, copies the published tables in that snapshot into the target
// (package snapshot reads them; each chunk is written through the target's COPY path in a target
// transaction of its own), then writes the progress row at the slot's consistent point and
// streams from there.
//
// The chunks commit one by one, on several connections, so a crash leaves part of a copy on the
// target. The copy table (the progress table's name with "_copy") says so: a row (slot, '') is
// committed, durably, before the slot is created, and a row (slot, table) for every target table
// before the first row is written into it; the transaction that writes the progress row deletes
// them. A session that finds the slot's copy rows but no progress row drops the slot, truncates
// the tables they name, and starts the copy over. The slot is never dropped without them: a slot
// that exists while the target records neither progress nor a copy is not this applier's
// (ErrCopySlotExists).

var (
	// ErrTargetNotEmpty: Config.Copy would copy into a target table that holds rows, and
	// Config.CopyTruncate is off. Nothing was copied and the slot was dropped again.
	ErrTargetNotEmpty = retry.Stop("apply: initial copy: target table is not empty")
	// ErrCopySlotExists: Config.Copy found the slot on the source, but the target has neither a
	// progress row for it nor the record of a copy that created it: the slot was made by someone
	// else, and the target may lack what the source committed before it. Drop the slot to copy
	// afresh, or run without Copy if the target already holds the data.
	ErrCopySlotExists = retry.Stop("apply: initial copy: the slot exists, but the target has no record of it")
)

// copyStageTimeout bounds the clean-up of the target after a failed copy.
const copyStageTimeout = 30 * time.Second

// copyConfig prepares the initial copy for the Feed: the copy table (created if missing) and
// whether it records a copy of the slot that began and did not finish, the Copier that writes
// into the target, and the snapshot's configuration. The copy's steps (the slot of a copy cut
// short dropped, the slot created with an exported snapshot, the copy, the stream started at
// once and read after it) are changefeed.InitialCopy's; the copy table is apply's record of them
// (see copyTarget). On failure what was copied is discarded once the slot is dropped; what could
// not be discarded, the next session does.
func (s *session) copyConfig(ctx context.Context) (c *copyTarget, begun bool, scfg snapshot.Config, err error) {
	ct := target.CompanionTable(s.leader.Table(s.cfg.ProgressTable), "_copy")
	if err := s.createCopyTable(ctx, ct); err != nil {
		return nil, false, scfg, err
	}
	rows, err := target.Query(ctx, s.leader.PG(), "SELECT relation FROM "+ct+" WHERE slot = $1", s.cfg.Source.Slot)
	if err != nil {
		return nil, false, scfg, fmt.Errorf("apply: reading the copy table %s: %w", ct, err)
	}
	// The connection, publications and binary values are the stream's (InitialCopy).
	scfg = snapshot.Config{Workers: s.cfg.CopyWorkers, Logger: s.log}
	if s.cfg.hooks != nil {
		scfg.ChunkSize = s.cfg.hooks.copyChunkSize
	}
	return &copyTarget{s: s, ct: ct}, len(rows) > 0, scfg, nil
}

// copyTarget is apply's side of changefeed.InitialCopy: the copy table records the copy, the
// chunks are written into the target tables, and the progress row marks the copy done.
type copyTarget struct {
	s    *session
	ct   string
	maps map[uint32]*target.Table // by source table OID
	tgs  []*target.Conn           // one per snapshot worker
}

// Begin empties whatever an earlier copy left and records this one, before the slot exists.
func (c *copyTarget) Begin(ctx context.Context, _ string) error {
	return c.s.resetCopy(ctx, c.ct, true)
}

// Plan maps the tables, checks that the targets are empty, records them, and connects the
// copy's target connections.
func (c *copyTarget) Plan(ctx context.Context, sess *snapshot.Session) (err error) {
	if c.maps, err = c.s.prepareCopy(ctx, c.ct, sess.Tables()); err != nil {
		return err
	}
	c.tgs = make([]*target.Conn, sess.Workers())
	_, fence := c.s.fenceKeys()
	o := c.s.cfg.targetOptions()
	o.InitialCopy = true // the copy's rows count in Stats.InitialCopyRows
	for i := range c.tgs {
		tg, err := connectTarget(ctx, o, "pgreorder apply "+c.s.cfg.Source.Slot+" c"+strconv.Itoa(i+1), &c.s.stats.Counters)
		if err != nil {
			return err
		}
		c.tgs[i] = tg
		// As the workers: a later session waits for these connections to be gone.
		if err := tg.LockShared(ctx, fence); err != nil {
			return fmt.Errorf("apply: %w", err)
		}
		if err := c.s.copyOriginSetup(ctx, tg, i+1); err != nil {
			return err
		}
	}
	return nil
}

// Chunk copies one chunk in a target transaction of its own, on the connection of the snapshot
// worker that reads it.
func (c *copyTarget) Chunk(ctx context.Context, ch *snapshot.Chunk) error {
	if err := c.s.copyChunk(ctx, c.tgs[ch.Worker], c.maps[ch.Table.OID], ch); err != nil {
		return fmt.Errorf("apply: initial copy: %w", err)
	}
	return nil
}

// Done writes the progress row at the consistent point.
func (c *copyTarget) Done(ctx context.Context, cp decoding.LSN) error {
	c.closeTargets(ctx)
	if err := c.s.cfg.hook(ctx, "copy-done", txnRef{EndLSN: cp}); err != nil {
		return err
	}
	if err := c.s.finishCopy(ctx, c.ct, cp); err != nil {
		return err
	}
	c.s.resume = cp
	return nil
}

// Discard empties what was copied and deletes the copy's rows, once the slot is dropped. It is
// best effort (the session is ending with an error already): what fails is left to the next
// session, which finds the copy's rows.
func (c *copyTarget) Discard(ctx context.Context, noSlot bool) {
	c.closeTargets(ctx)
	if !noSlot {
		c.s.log.Warn("the failed initial copy's slot could not be dropped; the next run will", "slot", c.s.cfg.Source.Slot)
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), copyStageTimeout)
	defer cancel()
	if err := c.s.resetCopy(ctx, c.ct, false); err != nil {
		c.s.log.Warn("discarding the failed initial copy; the next run will", "slot", c.s.cfg.Source.Slot, "err", err)
		return
	}
	c.s.log.Info("failed initial copy discarded: slot dropped, copied rows removed", "slot", c.s.cfg.Source.Slot)
}

func (c *copyTarget) closeTargets(ctx context.Context) {
	for _, tg := range c.tgs {
		if tg != nil {
			tg.Close(context.WithoutCancel(ctx))
		}
	}
	c.tgs = nil
}

// createCopyTable creates the copy table if it is missing.
func (s *session) createCopyTable(ctx context.Context, ct string) error {
	rows, err := target.Query(ctx, s.leader.PG(), "SELECT pg_catalog.to_regclass($1) IS NOT NULL", ct)
	if err != nil {
		return fmt.Errorf("apply: looking for the copy table: %w", err)
	}
	if string(rows[0][0]) == "t" {
		return nil
	}
	err = s.leader.PG().Exec(ctx, "CREATE TABLE "+ct+" (slot text NOT NULL, relation text NOT NULL, PRIMARY KEY (slot, relation))").Close()
	if err != nil && !pgsession.IsCode(err, "42P07") && !pgsession.IsCode(err, "23505") { // made meanwhile
		return fmt.Errorf("apply: creating the copy table %s: %w", ct, err)
	}
	return nil
}

// inTxn runs f in a transaction on the leader's connection; sync makes its commit wait for the
// WAL flush (unless Config.SynchronousCommit leaves that to the role's setting). A failure rolls
// it back.
func (s *session) inTxn(ctx context.Context, sync bool, f func() error) error {
	conn := s.leader.PG()
	if err := conn.Exec(ctx, "BEGIN").Close(); err != nil {
		return err
	}
	err := f()
	if err == nil && sync && !s.cfg.SynchronousCommit {
		err = conn.Exec(ctx, "SET LOCAL synchronous_commit = on").Close()
	}
	if err == nil {
		return conn.Exec(ctx, "COMMIT").Close()
	}
	if !conn.IsClosed() {
		conn.Exec(context.WithoutCancel(ctx), "ROLLBACK").Close()
	}
	return err
}

// resetCopy empties the tables the copy table records for the slot and deletes its rows, in one
// transaction; with begin, it records a new copy (the slot's row with an empty relation),
// durably.
func (s *session) resetCopy(ctx context.Context, ct string, begin bool) error {
	err := s.inTxn(ctx, begin, func() error {
		// The tables as they are now: partitioned ones are truncated whole, others without
		// their inheritance children; dropped ones are gone already.
		rows, err := target.Query(ctx, s.leader.PG(), `SELECT r.relation, c.relkind = 'p'
FROM `+ct+` r JOIN pg_catalog.pg_class c ON c.oid = pg_catalog.to_regclass(r.relation)
WHERE r.slot = $1 AND r.relation <> '' ORDER BY r.relation`, s.cfg.Source.Slot)
		if err != nil {
			return err
		}
		var names []string
		for _, r := range rows {
			names = append(names, truncateTarget(string(r[0]), string(r[1]) == "t"))
		}
		if len(names) > 0 {
			s.log.Info("emptying the tables of an unfinished initial copy", "tables", strings.Join(names, ", "))
			if _, err := s.leader.PG().ExecParams(ctx, "TRUNCATE "+strings.Join(names, ", "), nil, nil, nil, nil).Close(); err != nil {
				return err
			}
		}
		if _, err := target.Query(ctx, s.leader.PG(), "DELETE FROM "+ct+" WHERE slot = $1", s.cfg.Source.Slot); err != nil {
			return err
		}
		if begin {
			_, err = target.Query(ctx, s.leader.PG(), "INSERT INTO "+ct+" (slot, relation) VALUES ($1, '')", s.cfg.Source.Slot)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("apply: initial copy: resetting the copy table %s: %w", ct, err)
	}
	return nil
}

// truncateTarget returns the name to TRUNCATE: the table alone, or a partitioned table whole.
func truncateTarget(name string, partitioned bool) string {
	if partitioned {
		return name
	}
	return "ONLY " + name
}

// prepareCopy checks that the target has every table to copy (or creates them, with
// Config.SchemaChanges), maps each to its target table, checks that the target tables are
// empty (or, with Config.CopyTruncate, empties them), and records them in the copy table, in one
// transaction. It returns the mappings by source table OID.
func (s *session) prepareCopy(ctx context.Context, ct string, tables []*snapshot.Table) (map[uint32]*target.Table, error) {
	if err := s.copyTables(ctx, tables); err != nil { // tables.go: all missing at once, or created
		return nil, err
	}
	maps := make(map[uint32]*target.Table, len(tables))
	for _, t := range tables {
		ri := s.reg.Intern(t.Relation, t)
		m, err := s.leader.Mapping(ctx, ri, target.OpCopy)
		if err != nil {
			var ce *target.ChangeError
			if errors.As(err, &ce) {
				err = changeError{ce}
			}
			return nil, fmt.Errorf("apply: initial copy: %w", err)
		}
		maps[t.OID] = m
	}
	err := s.inTxn(ctx, false, func() error {
		var full, names []string
		for _, t := range tables {
			m := maps[t.OID]
			name := truncateTarget(m.Name, m.Partitioned)
			rows, err := target.Query(ctx, s.leader.PG(), "SELECT EXISTS (SELECT FROM "+name+")")
			if err != nil {
				return fmt.Errorf("apply: initial copy: reading %s: %w", m.Name, err)
			}
			if string(rows[0][0]) == "t" {
				full = append(full, m.Name)
				names = append(names, name)
			}
		}
		if len(full) > 0 {
			if !s.cfg.CopyTruncate {
				return configerr.WithHint(ErrTargetNotEmpty, ": ", "%s (empty it, or set %s to let the copy truncate it)",
					strings.Join(full, ", "), field("CopyTruncate"))
			}
			s.log.Info("truncating target tables that hold rows before the initial copy", "tables", strings.Join(full, ", "))
			if _, err := s.leader.PG().ExecParams(ctx, "TRUNCATE "+strings.Join(names, ", "), nil, nil, nil, nil).Close(); err != nil {
				return fmt.Errorf("apply: initial copy: truncating the target tables: %w", err)
			}
		}
		for start := 0; start < len(tables); start += 1000 {
			batch := tables[start:min(start+1000, len(tables))]
			var b strings.Builder
			b.WriteString("INSERT INTO " + ct + " (slot, relation) VALUES ")
			args := []string{s.cfg.Source.Slot}
			for i, t := range batch {
				if i > 0 {
					b.WriteString(", ")
				}
				args = append(args, maps[t.OID].Name)
				b.WriteString("($1, $" + strconv.Itoa(len(args)) + ")")
			}
			b.WriteString(" ON CONFLICT DO NOTHING")
			if _, err := target.Query(ctx, s.leader.PG(), b.String(), args...); err != nil {
				return fmt.Errorf("apply: initial copy: recording the tables in %s: %w", ct, err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return maps, nil
}

// copyChunk writes the rows of one chunk through tg's insert path (COPY, or INSERTs for short
// runs) in one target transaction. On failure the transaction is left open: the copy fails as a
// whole and its connections are closed.
func (s *session) copyChunk(ctx context.Context, tg *target.Conn, m *target.Table, c *snapshot.Chunk) error {
	if m == nil {
		return fmt.Errorf("apply: initial copy: no target mapping for %s", c.Table)
	}
	if err := s.cfg.hook(ctx, "copy-chunk", txnRef{}); err != nil {
		return err
	}
	tg.Begin(0, nil) // no source transaction
	for msg, err := range c.Changes() {
		if err != nil {
			return err
		}
		ins, ok := msg.Msg.(*decoding.Insert)
		if !ok {
			return fmt.Errorf("apply: initial copy: %s yielded a %T", c, msg.Msg)
		}
		if err := tg.Insert(ctx, m, ins.New); err != nil {
			return err
		}
	}
	return tg.CommitCopy(ctx)
}

// finishCopy writes the progress row at the consistent point and deletes the copy's rows, in
// one durable transaction: from then on the copy is complete and the stream resumes after it.
func (s *session) finishCopy(ctx context.Context, ct string, cp decoding.LSN) error {
	err := s.inTxn(ctx, true, func() error {
		if _, err := target.Query(ctx, s.leader.PG(), s.progSQL, s.key.Slot, cp.String(), s.key.System, strconv.Itoa(s.key.Timeline)); err != nil {
			return err
		}
		_, err := target.Query(ctx, s.leader.PG(), "DELETE FROM "+ct+" WHERE slot = $1", s.cfg.Source.Slot)
		return err
	})
	if err != nil {
		return fmt.Errorf("apply: initial copy: writing the progress row: %w", err)
	}
	s.stats.Applied(cp)
	return nil
}
