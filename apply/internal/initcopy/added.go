package initcopy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/pgreorder/pgreorder/apply/internal/target"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/snapshot"
)

// CopyAdded copies the tables added to the publications that Tables.Start returned: open takes
// a snapshot of those keep selects (on a temporary slot: changefeed.OpenTableSnapshot), and
// returns it with its consistent point and the function that closes it; Added copies them, and
// tables notes them copied. It logs each step, and calls the hook "added-copied" once committed.
func (c *Copier) CopyAdded(ctx context.Context, tables *Tables, added []target.Published,
	open func(ctx context.Context, keep func(*snapshot.Table) bool) (*snapshot.Session, decoding.LSN, func(), error)) error {
	oids := make(map[uint32]bool, len(added))
	names := make([]string, len(added))
	for i, p := range added {
		oids[p.OID] = true
		names[i] = Display(p.Name)
	}
	slices.Sort(names)
	list := strings.Join(names, ", ")
	start := time.Now()
	c.Log.Info("tables added to the publications: taking a snapshot of them (the temporary slot waits for the transactions "+
		"running on the source to end)", "tables", list, "slot", c.Slot)
	sess, cp, done, err := c.openWatched(ctx, list, func(ctx context.Context) (*snapshot.Session, decoding.LSN, func(), error) {
		return open(ctx, func(t *snapshot.Table) bool { return oids[t.OID] })
	})
	if err != nil {
		return fmt.Errorf("apply: copying the tables added to the publications (%s): %w", list, err)
	}
	defer done()
	if len(sess.Tables()) == 0 {
		c.Log.Info("the tables added to the publications are no longer published: nothing to copy", "tables", list)
		return nil
	}
	c.Log.Info("tables added to the publications: copying their rows, then applying their changes", "tables", list,
		"consistent_point", cp, "slot", c.Slot)
	tg, err := c.Host.Connect(ctx, 1)
	if err != nil {
		return err
	}
	defer tg.Close(context.WithoutCancel(ctx))
	rows, err := c.Added(ctx, tg, sess, cp)
	if _, ok := errors.AsType[*target.ChangeError](err); ok {
		err = c.Host.MappingError(err)
	}
	if err != nil {
		return fmt.Errorf("apply: copying the tables added to the publications (%s): %w", list, err)
	}
	tables.Copied(sess.Tables(), cp)
	if err := c.Host.Hook(ctx, "added-copied", cp); err != nil {
		return err
	}
	c.Log.Info("tables added to the publications copied", "tables", list, "rows", rows,
		"elapsed", time.Since(start).Round(time.Millisecond))
	return nil
}

// Added copies the tables that sess reads, tables added to the publications after the slot's
// copy (or first start), from a snapshot whose consistent point is cp, into the target in ONE
// transaction on tg, a connection of the copy's (Host.Connect). The same transaction records
// the tables in the tables table with cp as their synced position, durably: after a crash
// either the tables are whole on the target and recorded, or neither happened and the copy
// starts over. Target tables that hold rows stop the copy (Host.NotEmpty) or, with Truncate,
// are emptied in that transaction. It returns the rows copied. On failure the transaction is left
// open: the caller closes tg.
func (c *Copier) Added(ctx context.Context, tg *target.Conn, sess *snapshot.Session, cp decoding.LSN) (int64, error) {
	if sess.Workers() != 1 {
		return 0, errors.New("the copy of added tables reads with one worker") // one transaction, one connection
	}
	tables := sess.Tables()
	maps, mapped, err := c.mapTables(ctx, tables)
	if err != nil {
		return 0, err
	}
	tg.Begin(0, nil) // no source transaction
	if err := tg.FlushPending(ctx); err != nil {
		return 0, err
	}
	full, names, err := tg.NonEmpty(ctx, mapped)
	if err != nil {
		return 0, err
	}
	if len(full) > 0 {
		if !c.Truncate {
			return 0, c.Host.NotEmpty(full)
		}
		c.Log.Info("truncating target tables that hold rows before copying them", "tables", strings.Join(full, ", "))
		if err := tg.Truncate(ctx, names); err != nil {
			return 0, fmt.Errorf("truncating the target tables: %w", err)
		}
	}
	if err := tg.RecordTables(ctx, c.TablesTable, c.Key, known(tables, cp), false); err != nil {
		return 0, err
	}
	if _, err := target.Query(ctx, tg.PG(), "SET LOCAL synchronous_commit = on"); err != nil {
		return 0, err
	}
	res, err := sess.Run(ctx, func(ctx context.Context, ch *snapshot.Chunk) error {
		m := maps[ch.Table.OID]
		if m == nil {
			return fmt.Errorf("no target mapping for %s", ch.Table)
		}
		if err := c.Host.Hook(ctx, "added-chunk", cp); err != nil {
			return err
		}
		return insertRows(ctx, tg, m, ch)
	})
	if err != nil {
		return 0, err
	}
	if err := tg.CommitCopy(ctx); err != nil {
		return 0, err
	}
	return res.Rows, nil
}

// openWatched runs open while watchBlocked looks at the source (with Source set), and returns
// the *BlockedError that stopped it, if one did.
func (c *Copier) openWatched(ctx context.Context, tables string,
	open func(ctx context.Context) (*snapshot.Session, decoding.LSN, func(), error)) (*snapshot.Session, decoding.LSN, func(), error) {
	if c.Source == nil {
		return open(ctx)
	}
	octx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := watchBlocked(octx, cancel, tables, c.Source)
	sess, cp, done, err := open(octx)
	stop()
	if be, ok := errors.AsType[*BlockedError](context.Cause(octx)); ok && err != nil {
		return nil, 0, nil, be
	}
	return sess, cp, done, err
}
