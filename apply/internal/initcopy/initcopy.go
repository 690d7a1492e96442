package initcopy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/pgreorder/pgreorder/apply/internal/target"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/snapshot"
)

// stageTimeout bounds the clean-up of the target after a failed copy.
const stageTimeout = 30 * time.Second

// Host is what the copy calls back into the session for.
type Host interface {
	// Hook reports a stage to the tests' hooks ("copy-chunk", "copy-done" with the consistent
	// point); an error fails the copy.
	Hook(ctx context.Context, stage string, end decoding.LSN) error
	// Connect opens the target connection of the copy's worker i (from 1): rows it writes count
	// as the initial copy's, it holds the workers' fence lock, and it carries the copy's origin.
	Connect(ctx context.Context, i int) (*target.Conn, error)
	// CheckTables checks that the target has the tables to copy into, or creates them.
	CheckTables(ctx context.Context, tables []*snapshot.Table) error
	// MappingError returns the error for a table that cannot be mapped (a *target.ChangeError).
	MappingError(err error) error
	// NotEmpty returns the error that stops a copy into tables that hold rows.
	NotEmpty(tables []string) error
	// Copied notes the copy done, the stream to resume after cp, and the source tables it
	// copied (as the tables table records them).
	Copied(cp decoding.LSN, tables []target.KnownTable)
}

// Copier writes the initial copy into the target (changefeed's Copier).
type Copier struct {
	Leader    *target.Conn // the session's; the copy table's statements run on it
	CopyTable string       // quoted
	// TablesTable (quoted) records the source tables the target holds whole (target.KnownTable):
	// Done records those of the copy, Added the added ones it copies.
	TablesTable string
	Slot        string
	// Source, when set, runs a statement on an ordinary connection to the source: the copy of
	// added tables uses it to find a snapshot that waits for commits that wait for a synchronous
	// standby none of which streams (BlockedError).
	Source   func(ctx context.Context, sql string) ([][][]byte, error)
	Key      target.ProgressKey
	Upsert   string // the progress row's (target.ProgressSQL)
	Truncate bool   // empty target tables that hold rows (else Host.NotEmpty)
	Log      *slog.Logger
	Registry *target.Registry
	Stats    *target.Counters
	Host     Host

	maps   map[uint32]*target.Table // by source table OID
	copied []target.KnownTable
	tgs    []*target.Conn // one per snapshot worker
}

// Begin empties whatever an earlier copy left and records this one, before the slot exists.
func (c *Copier) Begin(ctx context.Context, _ string) error {
	return c.reset(ctx, true)
}

// Plan maps the tables, checks that the targets are empty, records them, and connects the
// copy's target connections.
func (c *Copier) Plan(ctx context.Context, sess *snapshot.Session) (err error) {
	if c.maps, err = c.prepare(ctx, sess.Tables()); err != nil {
		return err
	}
	c.tgs = make([]*target.Conn, sess.Workers())
	for i := range c.tgs {
		if c.tgs[i], err = c.Host.Connect(ctx, i+1); err != nil {
			return err
		}
	}
	return nil
}

// Chunk copies one chunk in a target transaction of its own, on the connection of the snapshot
// worker that reads it.
func (c *Copier) Chunk(ctx context.Context, ch *snapshot.Chunk) error {
	if err := c.chunk(ctx, c.tgs[ch.Worker], c.maps[ch.Table.OID], ch); err != nil {
		return fmt.Errorf("apply: initial copy: %w", err)
	}
	return nil
}

// Done writes the progress row at the consistent point.
func (c *Copier) Done(ctx context.Context, cp decoding.LSN) error {
	c.closeTargets(ctx)
	if err := c.Host.Hook(ctx, "copy-done", cp); err != nil {
		return err
	}
	if err := c.Leader.FinishCopy(ctx, c.CopyTable, c.TablesTable, c.Upsert, c.Key, cp, c.copied); err != nil {
		return fmt.Errorf("apply: initial copy: writing the progress row: %w", err)
	}
	c.Stats.Applied(cp)
	c.Host.Copied(cp, c.copied)
	return nil
}

// Discard empties what was copied and deletes the copy's rows, once the slot is dropped. It is
// best effort (the session is ending with an error already): what fails is left to the next
// session, which finds the copy's rows.
func (c *Copier) Discard(ctx context.Context, noSlot bool) {
	c.closeTargets(ctx)
	if !noSlot {
		c.Log.Warn("the failed initial copy's slot could not be dropped; the next run will", "slot", c.Slot)
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stageTimeout)
	defer cancel()
	if err := c.reset(ctx, false); err != nil {
		c.Log.Warn("discarding the failed initial copy; the next run will", "slot", c.Slot, "err", err)
		return
	}
	c.Log.Info("failed initial copy discarded: slot dropped, copied rows removed", "slot", c.Slot)
}

func (c *Copier) closeTargets(ctx context.Context) {
	for _, tg := range c.tgs {
		if tg != nil {
			tg.Close(context.WithoutCancel(ctx))
		}
	}
	c.tgs = nil
}

// reset empties the tables the copy table records for the slot and deletes its rows, in one
// transaction; with begin, it records a new copy (the slot's row with an empty relation),
// durably.
func (c *Copier) reset(ctx context.Context, begin bool) error {
	if err := c.Leader.ResetCopy(ctx, c.CopyTable, c.Slot, begin, c.Log); err != nil {
		return fmt.Errorf("apply: initial copy: resetting the copy table %s: %w", c.CopyTable, err)
	}
	return nil
}

// prepare checks that the target has every table to copy (or creates them), maps each to its
// target table, checks that the target tables are empty (or, with Truncate, empties them), and
// records them in the copy table, in one transaction. It returns the mappings by source table
// OID.
func (c *Copier) prepare(ctx context.Context, tables []*snapshot.Table) (map[uint32]*target.Table, error) {
	maps, mapped, err := c.mapTables(ctx, tables)
	var ce *target.ChangeError
	if errors.As(err, &ce) {
		return nil, fmt.Errorf("apply: initial copy: %w", err)
	}
	if err != nil {
		return nil, err
	}
	c.copied = known(tables, 0)
	err = c.Leader.WithTxn(ctx, false, func() error {
		full, names, err := c.Leader.NonEmpty(ctx, mapped)
		if err != nil {
			return fmt.Errorf("apply: initial copy: %w", err)
		}
		if len(full) > 0 {
			if !c.Truncate {
				return c.Host.NotEmpty(full)
			}
			c.Log.Info("truncating target tables that hold rows before the initial copy", "tables", strings.Join(full, ", "))
			if err := c.Leader.Truncate(ctx, names); err != nil {
				return fmt.Errorf("apply: initial copy: truncating the target tables: %w", err)
			}
		}
		if err := c.Leader.RecordCopy(ctx, c.CopyTable, c.Slot, mapped); err != nil {
			return fmt.Errorf("apply: initial copy: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return maps, nil
}

// mapTables checks that the target has every table to copy (or creates them), and maps each to
// its target table (an error of the mapping is Host.MappingError's). It returns the mappings by source table OID, and in the order of tables.
func (c *Copier) mapTables(ctx context.Context, tables []*snapshot.Table) (map[uint32]*target.Table, []*target.Table, error) {
	if err := c.Host.CheckTables(ctx, tables); err != nil { // all missing at once, or created
		return nil, nil, err
	}
	maps := make(map[uint32]*target.Table, len(tables))
	mapped := make([]*target.Table, len(tables))
	for i, t := range tables {
		ri := c.Registry.Intern(t.Relation, t)
		m, err := c.Leader.Mapping(ctx, ri, target.OpCopy)
		if err != nil {
			var ce *target.ChangeError
			if errors.As(err, &ce) {
				err = c.Host.MappingError(err)
			}
			return nil, nil, err
		}
		maps[t.OID], mapped[i] = m, m
	}
	return maps, mapped, nil
}

// known returns the tables' rows of the tables table, with synced as their consistent point.
func known(tables []*snapshot.Table, synced decoding.LSN) []target.KnownTable {
	out := make([]target.KnownTable, len(tables))
	for i, t := range tables {
		out[i] = target.KnownTable{OID: t.OID, Name: t.String(), Synced: synced}
	}
	return out
}

// chunk writes the rows of one chunk through tg's insert path (COPY, or INSERTs for short
// runs) in one target transaction. On failure the transaction is left open: the copy fails as a
// whole and its connections are closed.
func (c *Copier) chunk(ctx context.Context, tg *target.Conn, m *target.Table, ch *snapshot.Chunk) error {
	if m == nil {
		return fmt.Errorf("apply: initial copy: no target mapping for %s", ch.Table)
	}
	if err := c.Host.Hook(ctx, "copy-chunk", 0); err != nil {
		return err
	}
	tg.Begin(0, nil) // no source transaction
	if err := insertRows(ctx, tg, m, ch); err != nil {
		return err
	}
	return tg.CommitCopy(ctx)
}

// insertRows writes the rows of ch into m through tg's insert path, in its open transaction.
func insertRows(ctx context.Context, tg *target.Conn, m *target.Table, ch *snapshot.Chunk) error {
	for msg, err := range ch.Changes() {
		if err != nil {
			return err
		}
		ins, ok := msg.Msg.(*decoding.Insert)
		if !ok {
			return fmt.Errorf("%s yielded a %T", ch, msg.Msg)
		}
		if err := tg.Insert(ctx, m, ins.New); err != nil {
			return err
		}
	}
	return nil
}
