package apply

import (
	"context"
	"fmt"
	"strings"

	"github.com/pgreorder/pgreorder/apply/internal/target"
	"github.com/pgreorder/pgreorder/replication"
)

// UninstallOptions says what Uninstall removes besides the tombstone store. The zero value
// removes the tombstone store only.
type UninstallOptions struct {
	// Progress deletes the slot's rows from the progress table (Config.ProgressTable), from
	// its copy table and from its ahead table (relaxed commit order), and drops each of them once
	// no slot has a row in it. A later Run
	// starts from the slot's position on the source, or, with Config.Copy, copies again.
	Progress bool
	// Origins drops the Applier's replication origins on the target: Config.Origin and those of
	// its workers and of its initial copy's connections.
	Origins bool
}

// Uninstalled is what Uninstall removed from the target.
type Uninstalled struct {
	TombstoneTriggers []string // the tables whose tombstone trigger was dropped, quoted and qualified
	TombstoneFunction string   // the trigger function dropped, "" if there was none
	TombstoneTable    string   // the tombstone table dropped, "" if there was none
	ProgressRows      int64    // the slot's rows deleted from the progress, copy, tables and ahead tables
	DroppedTables     []string // those of the progress, copy and ahead tables dropped, left without rows
	Origins           []string // the replication origins dropped
}

// String says what was removed, in one line: "nothing to remove" when there was nothing.
func (u Uninstalled) String() string {
	var parts []string
	if n := len(u.TombstoneTriggers); n > 0 {
		parts = append(parts, fmt.Sprintf("the tombstone trigger of %d table(s) (%s)", n, strings.Join(u.TombstoneTriggers, ", ")))
	}
	if u.TombstoneFunction != "" {
		parts = append(parts, "the function "+u.TombstoneFunction)
	}
	if u.TombstoneTable != "" {
		parts = append(parts, "the tombstone table "+u.TombstoneTable)
	}
	if u.ProgressRows > 0 {
		parts = append(parts, fmt.Sprintf("%d row(s) of the slot in the progress table and the tables beside it", u.ProgressRows))
	}
	if len(u.DroppedTables) > 0 {
		parts = append(parts, "the table(s) "+strings.Join(u.DroppedTables, ", ")+", left empty")
	}
	if len(u.Origins) > 0 {
		parts = append(parts, "the replication origin(s) "+strings.Join(u.Origins, ", "))
	}
	if len(parts) == 0 {
		return "nothing to remove"
	}
	return "removed " + strings.Join(parts, "; ")
}

// Uninstall removes from the target what the Applier created there for update_deleted
// detection (conflict.Config.Retention): the tombstone trigger of every table, the trigger
// function and the tombstone table; and, as opts says, the slot's progress and the Applier's
// replication origins; it says what it removed (what is not there is left alone, silently). It
// fails with ErrSlotInUse while an Applier of the slot runs. The tombstone store is shared by the
// Appliers whose tombstone table is the same one: one of them that runs creates it again.
// Nothing on the source is touched: drop the slot there (pg_drop_replication_slot) when the
// Applier is retired.
func (a *Applier) Uninstall(ctx context.Context, opts UninstallOptions) (Uninstalled, error) {
	cfg := &a.cfg
	tg, err := target.Dial(ctx, cfg.targetOptions(), "pgreorder apply "+cfg.Source.Slot+" uninstall")
	if err != nil {
		return Uninstalled{}, configErr(err)
	}
	conn := tg.PG()
	defer conn.Close(context.WithoutCancel(ctx))
	// A running Applier of the slot holds its lead lock, keyed by the source system: the system
	// of the slot's progress row, or else the source's own (an Applier still in its initial copy
	// has no progress row yet).
	system, err := tg.ProgressSystem(ctx, cfg.ProgressTable, cfg.Source.Slot)
	if err != nil {
		return Uninstalled{}, fmt.Errorf("apply: uninstall: %w", err)
	}
	if system == "" {
		if system, err = sourceSystem(ctx, cfg); err != nil {
			return Uninstalled{}, fmt.Errorf("apply: uninstall: identifying the source system (to find a running Applier of the slot): %w", err)
		}
	}
	lead, _ := fenceKeys(system, cfg.Source.Slot)
	locked, err := tg.TryLock(ctx, lead)
	if err != nil {
		return Uninstalled{}, fmt.Errorf("apply: uninstall: %w", err)
	}
	if !locked {
		return Uninstalled{}, fmt.Errorf("%w: slot %q: stop it first", ErrSlotInUse, cfg.Source.Slot)
	}

	r, err := tg.RemoveInstalled(ctx, target.Uninstall{Slot: cfg.Source.Slot, TombstoneTable: cfg.Conflicts.TombstoneTable,
		ProgressTable: cfg.ProgressTable, Progress: opts.Progress, Origin: originIf(opts.Origins, cfg.Origin)})
	u := Uninstalled(r)
	if err != nil {
		return u, fmt.Errorf("apply: uninstall: %w", err)
	}
	return u, nil
}

// originIf returns origin if drop, else "".
func originIf(drop bool, origin string) string {
	if drop {
		return origin
	}
	return ""
}

// sourceSystem returns the source's system identifier (IDENTIFY_SYSTEM on a replication connection
// of its own), for an uninstall that finds no progress row naming it.
func sourceSystem(ctx context.Context, cfg *Config) (string, error) {
	rc := cfg.Source
	rc.Logger = nil
	conn, err := replication.Connect(ctx, rc)
	if err != nil {
		return "", twoPhaseSlot(err, cfg.Source.Slot)
	}
	defer conn.Close(ctx)
	return conn.System().ID, nil
}
