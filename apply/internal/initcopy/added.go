package initcopy

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/pgreorder/pgreorder/apply/internal/target"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/snapshot"
)

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
	})
	if err != nil {
		return 0, err
	}
	if err := tg.CommitCopy(ctx); err != nil {
		return 0, err
	}
	return res.Rows, nil
}
