package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"runtime/debug"
	rtmetrics "runtime/metrics"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/pgreorder/pgreorder/apply"
	"github.com/pgreorder/pgreorder/apply/conflict"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/metrics"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/replication"
	"github.com/pgreorder/pgreorder/snapshot"
)

func init() {
	register("apply", "replicate a publication into another PostgreSQL database, exactly once", runApply)
}

const applyUsage = `usage: pgreorder apply -source DSN -target DSN -slot NAME -publication NAME [flags]

Replicates the publication into the target database: each source transaction is applied in one
target transaction together with the slot's row in the progress table, and acknowledged to the
source only once committed there. Stopped (Ctrl-C, SIGTERM) or killed, it resumes from the
progress row without losing or repeating a transaction. Connection failures are retried; a change
the target refuses (missing table or column, permission, constraint) stops it with an error naming
the table, the source transaction and its commit LSN.

Progress goes to stderr: one line every -progress while there is something to report (what was
applied, conflicts, then as pgreorder stream: received, acknowledged, lag in bytes and in time,
rates, memory, spilled); with -metrics-addr, Prometheus metrics are served on
http://ADDR/metrics (see docs/metrics.md).

A transaction is acknowledged to the source only once the target has flushed it to disk together
with the progress row, so a crash of the target server loses nothing the source will not send
again; idle positions (WAL with nothing published) are written to the progress row before the
slot confirms them. The slot is therefore never ahead of the progress row: if it is (the target
was restored from an older backup, say), the transactions in between are lost for the target, and
apply stops with an error saying so, unless -accept-slot-ahead is given. The progress row records
the source's system identifier: a progress row of another source system (a rebuilt source, or
another source using the same slot name) stops apply too.

The target's tables must exist with the source's columns and hold what the source held when the
slot was created, or, with -copy, be empty: -copy makes the initial copy when the target has no
progress row for the slot yet. It creates the slot (it must not exist) with an exported snapshot,
copies the published tables as they were at the slot's consistent point into the target's tables
(the schema is not copied: create the tables first, or let -schema-changes add-columns create the
missing ones), writes the progress row once every row is
committed, and streams from that point on, with no gap and no overlap. A copy cut short (crash,
kill, lost connection) is discarded when apply starts again: the slot is dropped, the tables it
copied into are truncated, and the copy starts over. A target table that holds rows stops -copy
before anything is copied, unless -copy-truncate is given. Once the progress row exists, -copy
does nothing: keep it on the command line of a service.

A table added to the publication later is copied too (with or without -copy), from a snapshot of
its own and in one target transaction, before its changes are applied: no row missing or twice.
-copy-new-tables=false applies its changes from then on only, as PostgreSQL's subscriber does
until REFRESH PUBLICATION, and logs that its earlier rows are not copied.

Migrations (docs/migrations.md has the cut-over procedure): -schema-changes add-columns creates the
published tables the target lacks from the source's definition (columns, types, NOT NULL, primary
key) and adds the columns the source adds to the target's tables; -skip-lsn LSN skips the one transaction the target
refused (every error that stops apply on a change names its LSN); -sync-sequences copies the
published tables' sequences forward to the target (-sync-sequences-once: once, then exit);
-until-caught-up exits once everything the source had written when apply started is applied.

Memory: apply's Go heap is collected when it has grown to 5 times what the last collection
left (GOGC=400), within a soft limit of -work-mem plus 64MB (or twice the live heap, if more);
setting GOGC or GOMEMLIMIT in the environment replaces both, and -work-mem unlimited keeps Go's
defaults.

Profiling: -cpuprofile FILE writes a CPU profile of the process from start to exit, and
-memprofile FILE the allocations it made (sampled, as runtime/pprof's allocs profile) when it
exits, for go tool pprof (e.g. go tool pprof -top FILE; -sample_index=alloc_space for bytes).

Modes:
  buffered  whole transactions at their commit, one at a time (large ones held in memory up to
            -work-mem, then on disk)
  eager     large (streamed) transactions applied while they run on the source, each on a worker
            connection of its own, with savepoints for their subtransactions; committed in order
  parallel  eager, and committed transactions applied on -workers connections, in runs applied
            set-based like buffered's groups, at once when they touch different rows; committed
            in order, or with -commit-order relaxed, each as soon as the transactions it depends
            on (same rows, same unique values) committed

-commit-order relaxed (parallel only) lets the target briefly show a transaction without an
earlier, independent one. What is acknowledged to the source stays the prefix of transactions
all committed on the target; the workers record what they committed past it in the progress
table's companion table (PROGRESS_TABLE_ahead), in the same target transaction, so that after a
crash or a kill apply resumes from the prefix and skips exactly those transactions.

Passwords: a password in a connection string on the command line is visible to every local user
(ps, /proc). Give it in the PGPASSWORD environment variable or in a password file (~/.pgpass, or
PGPASSFILE / passfile=FILE) instead. Messages print connection strings with passwords as xxxxx.
Flags, the most used first:
`

// applyFlags are the flags of `pgreorder apply`.
type applyFlags struct {
	sourceFlags    // -source, -slot, -publication
	spillFlags     // -work-mem, -spill-dir, -spill-compression
	monitorFlags   // -status-interval, -progress, -metrics-addr, -v
	newTablesFlags // -copy-new-tables

	target, mode, table, commitOrder string
	createSlot, binary, syncCommit   bool
	acceptSlotAhead                  bool
	copy, copyTruncate               bool
	workers, copyWorkers             int
	slotWait, startTimeout           time.Duration
	cpuProfile                       string
	memProfile                       string

	// Conflicts and origins.
	origin, originFilter, resolutions, logTable string
	noDetection                                 bool
	retention                                   time.Duration
	uninstall                                   bool

	// Migrations.
	skipLSN, schemaChanges                          string
	syncSequences, syncSequencesOnce, untilCaughtUp bool
	syncSequencesInterval                           time.Duration
}

func (f *applyFlags) register(fs *flag.FlagSet) {
	f.sourceFlags.register(fs, "logical replication slot on the source (pgoutput)")
	fs.StringVar(&f.target, "target", "", "connection string (`DSN`) of the target database")
	fs.BoolVar(&f.createSlot, "create-slot", false, "create the slot if it does not exist")
	fs.BoolVar(&f.copy, "copy", false, "make the initial copy into the target's empty tables if the target has no progress row for the slot (see above)")
	fs.BoolVar(&f.copyTruncate, "copy-truncate", false, "truncate target tables that hold rows before copying into them "+
		"(-copy, and tables added to the publication) instead of stopping")
	fs.IntVar(&f.copyWorkers, "copy-workers", 0, fmt.Sprintf("with -copy, tables (or parts of tables) copied at once, each over a connection to the source and one to the target (default %d)",
		snapshot.DefaultWorkers))
	fs.StringVar(&f.mode, "mode", "buffered", "buffered, eager or parallel (see above)")
	fs.StringVar(&f.commitOrder, "commit-order", "source", "source or relaxed: with -mode parallel, relaxed commits a transaction as soon as those it "+
		"depends on committed, ahead of earlier independent ones (see above)")
	fs.IntVar(&f.workers, "workers", 0, fmt.Sprintf("worker connections to the target (default %d for eager, %d for parallel)",
		apply.DefaultEagerWorkers, apply.DefaultParallelWorkers))
	f.spillFlags.register(fs)
	f.newTablesFlags.register(fs)
	fs.BoolVar(&f.binary, "binary", false, "ask for binary column values (column types must match on both sides)")
	fs.Var(syncCommitFlag{&f.syncCommit}, "synchronous-commit", "on or off: on waits for each target commit as the target's "+
		"synchronous_commit says (on: its WAL flush; remote_apply and the other levels when set for the target role or in -target) "+
		"before acknowledging it (default off: commit with synchronous_commit = off and flush in groups, still acknowledging only "+
		"flushed commits)")
	fs.StringVar(&f.table, "progress-table", apply.DefaultProgressTable, "target table of the progress rows (created if missing)")
	fs.BoolVar(&f.acceptSlotAhead, "accept-slot-ahead", false, "continue when the slot's confirmed position is ahead of the target's "+
		"progress row, without the transactions in between, which the target lost (by default apply stops: see above)")
	f.monitorFlags.register(fs, 0)
	durationVar(fs, &f.slotWait, "slot-wait", apply.DefaultSlotWait, "how long to wait for another session that holds the slot "+
		"(on the target: another apply of the slot, or the connections left by one that died; on the source: another walsender "+
		"streaming from it) before stopping with an error naming it (0: do not wait; -1: no limit)")
	startTimeoutVar(fs, &f.startTimeout, "apply", "the target and the source")
	fs.StringVar(&f.cpuProfile, "cpuprofile", "", "write a CPU profile (runtime/pprof, for go tool pprof) of the whole run to FILE, ended when apply exits")
	fs.StringVar(&f.memProfile, "memprofile", "", "write the allocations of the whole run (runtime/pprof's allocs profile, for go tool pprof) to FILE when apply exits")
	fs.StringVar(&f.origin, "origin", "", "replication origin marking the target transactions "+
		"(and origin_w1... for workers): needed by -origin-filter none on the way back, and for *_origin_differs")
	fs.StringVar(&f.originFilter, "origin-filter", "", `pgoutput's origin option on the source: "any", or "none" (PostgreSQL 16+: `+
		"leave out changes another replication applied on the source, for bidirectional setups)")
	fs.StringVar(&f.resolutions, "conflict", "", "conflict resolutions, type=resolution comma-separated, "+
		"e.g. insert_exists=last_update_wins,update_missing=apply_remote; types: "+
		strings.Join(conflictTypeNames(), ", ")+"; resolutions: error, skip, apply_remote, last_update_wins "+
		"(default as PostgreSQL: error for *_exists and multiple_unique_conflicts, apply_remote for *_origin_differs, skip otherwise)")
	fs.BoolVar(&f.noDetection, "no-conflict-detection", false, "send changes without conflict checks "+
		"(update_missing and delete_missing are still counted; a unique violation stops)")
	durationVar(fs, &f.retention, "conflict-retention", 0, "detect update_deleted: record local deletions on the target "+
		"and keep them this long (e.g. 5m; 0: off)")
	fs.StringVar(&f.logTable, "conflict-log-table", "", "target table receiving one row per conflict (created if missing)")
	fs.StringVar(&f.skipLSN, "skip-lsn", "", "skip the source transaction with this commit LSN, once, instead of applying it "+
		"(as ALTER SUBSCRIPTION ... SKIP): give the LSN the error that stopped apply names; it must be the next transaction to apply. "+
		"Its changes are lost on the target; the skip is logged and recorded in the progress row")
	fs.StringVar(&f.schemaChanges, "schema-changes", "none", "none, or add-columns: a published table the target lacks is created "+
		"from the source's definition (columns with the source's types, NOT NULL, the primary key; no default, other constraint, "+
		"index or trigger) before the copy, when streaming starts, or at its first change; its schema and types must exist on the "+
		"target. A column the source adds to a published table is added to the target table (the source's type, nullable, "+
		"no default) in the transaction of the first change that needs it; columns dropped or renamed on the source are reported "+
		"and kept on the target. Without it a missing table (all of them are named at once) or such a column stops apply")
	fs.BoolVar(&f.syncSequences, "sync-sequences", false, "copy the values of the source's sequences owned by the published tables' "+
		"columns (serial, identity) to the target's sequences of the same names, forward only: when streaming starts, every "+
		"-sync-sequences-interval, and when apply stops cleanly; a sequence missing on the target stops apply")
	durationVar(fs, &f.syncSequencesInterval, "sync-sequences-interval", apply.DefaultSyncSequencesInterval,
		"with -sync-sequences, the time between two synchronizations")
	fs.BoolVar(&f.syncSequencesOnce, "sync-sequences-once", false, "synchronize the sequences once (as -sync-sequences does) and exit, "+
		"without applying anything: the last step of a cut-over")
	fs.BoolVar(&f.untilCaughtUp, "until-caught-up", false, "exit (status 0) once everything the source had written when apply "+
		"started is applied on the target and acknowledged, printing \"caught up to LSN X\": stop writes to the source first (see docs/migrations.md)")
	fs.BoolVar(&f.uninstall, "uninstall", false, "retire the applier instead of running it: remove from the target the slot's rows of the progress table and of the tables beside it (_copy, _tables, _ahead), "+
		"the -origin origins and the tombstone table, function and triggers of -conflict-retention, then exit (the applier must be stopped; "+
		"the slot on the source is left: drop it there)")
}

func conflictTypeNames() []string {
	var out []string
	for _, ct := range conflict.Types() {
		out = append(out, ct.String())
	}
	return out
}

// config checks the flags and makes the apply configuration.
func (f *applyFlags) config(fs *flag.FlagSet) (apply.Config, error) {
	if fs.NArg() != 0 {
		return apply.Config{}, fmt.Errorf("unexpected arguments: %s (every option is a flag; see pgreorder apply -h)", strings.Join(fs.Args(), " "))
	}
	missing := f.sourceFlags.missing()
	if f.target == "" {
		at := 0 // after -source
		if f.source == "" {
			at = 1
		}
		missing = slices.Insert(missing, at, "-target")
	}
	if len(missing) > 0 {
		return apply.Config{}, fmt.Errorf("missing %s (see pgreorder apply -h)", strings.Join(missing, ", "))
	}
	if err := f.monitorFlags.check(); err != nil {
		return apply.Config{}, err
	}
	mode, err := apply.ParseMode(f.mode)
	if err != nil {
		return apply.Config{}, fmt.Errorf("-mode %q: valid values are buffered, eager and parallel", f.mode)
	}
	commitOrder, err := apply.ParseCommitOrder(f.commitOrder)
	if err != nil {
		return apply.Config{}, fmt.Errorf("-commit-order %q: valid values are source and relaxed", f.commitOrder)
	}
	if commitOrder == apply.CommitRelaxed && mode != apply.Parallel {
		return apply.Config{}, fmt.Errorf("-commit-order relaxed goes with -mode parallel (-mode is %v, which commits in the source's order only)", mode)
	}
	originFilter, err := replication.ParseOriginFilter(f.originFilter)
	if err != nil {
		return apply.Config{}, fmt.Errorf("-origin-filter %q: valid values are any and none", f.originFilter)
	}
	if f.workers < 0 || f.workers > apply.MaxWorkers {
		return apply.Config{}, fmt.Errorf("-workers %d: want 1 to %d", f.workers, apply.MaxWorkers)
	}
	if f.copyWorkers < 0 || f.copyWorkers > apply.MaxWorkers {
		return apply.Config{}, fmt.Errorf("-copy-workers %d: want 1 to %d", f.copyWorkers, apply.MaxWorkers)
	}
	if f.copyWorkers != 0 && !f.copy {
		return apply.Config{}, errors.New("-copy-workers goes with -copy")
	}
	workMem, comp, err := f.spillFlags.parse()
	if err != nil {
		return apply.Config{}, err
	}
	res, err := conflict.ParseResolutions(f.resolutions, nil)
	if err != nil {
		return apply.Config{}, fmt.Errorf("-conflict: %w", err)
	}
	var skipLSN decoding.LSN
	if f.skipLSN != "" {
		if skipLSN, err = decoding.ParseLSN(f.skipLSN); err != nil || skipLSN == 0 {
			return apply.Config{}, fmt.Errorf("-skip-lsn %q: want the commit LSN the error that stopped apply names, such as 0/1D48BB0", f.skipLSN)
		}
	}
	if f.syncSequencesInterval <= 0 {
		return apply.Config{}, fmt.Errorf("-sync-sequences-interval %v: want an interval such as 10s", f.syncSequencesInterval)
	}
	if f.syncSequencesOnce && (f.untilCaughtUp || f.uninstall) {
		return apply.Config{}, errors.New("-sync-sequences-once synchronizes the sequences and exits: it goes without -until-caught-up and -uninstall")
	}
	schemaChanges, err := apply.ParseSchemaChanges(f.schemaChanges)
	if err != nil {
		return apply.Config{}, fmt.Errorf("-schema-changes %q: valid values are none and add-columns", f.schemaChanges)
	}
	return apply.Config{
		Source: replication.Config{
			ConnString:     f.source,
			Slot:           f.slot,
			Publications:   f.publications,
			CreateSlot:     f.createSlot,
			Failover:       f.failover,
			Binary:         f.binary,
			StatusInterval: f.status,
			OriginFilter:   originFilter,
			Buffer:         reorderbuffer.Config{WorkMem: workMem, Dir: f.dir, SpillCompressor: comp},
		},
		Target:            f.target,
		Copy:              f.copy,
		CopyTruncate:      f.copyTruncate,
		NewTables:         f.newTables(),
		CopyWorkers:       f.copyWorkers,
		Mode:              mode,
		CommitOrder:       commitOrder,
		Workers:           f.workers,
		SynchronousCommit: f.syncCommit,
		AcceptSlotAhead:   f.acceptSlotAhead,
		ProgressTable:     f.table,
		SlotWait:          cliSlotWait(f.slotWait),
		StartTimeout:      cliSlotWait(f.startTimeout),
		Origin:            f.origin,
		Conflicts: conflict.Config{
			Off:         f.noDetection,
			Resolutions: res,
			Retention:   f.retention,
			LogTable:    f.logTable,
		},
		SkipLSN:               skipLSN,
		SchemaChanges:         schemaChanges,
		SyncSequences:         f.syncSequences,
		SyncSequencesInterval: f.syncSequencesInterval,
		UntilCaughtUp:         f.untilCaughtUp,
		Logger:                f.logger(),
	}, nil
}

func runApply(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("apply", flag.ContinueOnError)
	var f applyFlags
	f.register(fs)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), applyUsage)
		printFlags(fs.Output(), fs, applyGroups)
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := f.config(fs)
	if err != nil {
		return err
	}
	if tuneCollector {
		defer tuneGC(cfg.WorkMemBytes())()
	}
	if f.cpuProfile != "" {
		stopProfile, err := startCPUProfile(f.cpuProfile)
		if err != nil {
			return err
		}
		defer func() {
			if perr := stopProfile(); perr != nil {
				cfg.Logger.Warn("writing the CPU profile", "file", f.cpuProfile, "err", perr)
			}
		}()
	}
	if f.memProfile != "" {
		// Created now, so that a path that cannot be written is an error before apply starts.
		mf, err := os.Create(f.memProfile)
		if err != nil {
			return fmt.Errorf("-memprofile: %w", err)
		}
		defer func() {
			err := pprof.Lookup("allocs").WriteTo(mf, 0)
			if cerr := mf.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				cfg.Logger.Warn("writing the allocation profile", "file", f.memProfile, "err", err)
			}
		}()
	}
	a, err := apply.New(cfg)
	if err != nil {
		return err
	}
	if f.uninstall {
		u, err := a.Uninstall(ctx, apply.UninstallOptions{Progress: true, Origins: true})
		if err != nil {
			return err
		}
		fmt.Printf("uninstalled slot %s from the target: %s\n", cfg.Source.Slot, u)
		return nil
	}
	if f.syncSequencesOnce {
		moved, err := a.SyncSequences(ctx)
		if err != nil {
			return err
		}
		fmt.Printf("sequences synchronized: %d moved forward\n", moved)
		return nil
	}
	log := cfg.Logger
	stop, err := monitorApply(a, f, log)
	if err != nil {
		return err
	}
	err = a.Run(ctx)
	flagHint(err)
	if serr := stop(context.WithoutCancel(ctx)); serr != nil {
		log.Warn("stopping the metrics server", "err", serr)
	}
	// The final counters, unless nothing was done (an apply that waited for its slot).
	st := a.Stats()
	moved := st
	moved.Sessions, moved.RetentionActive = 0, false
	if moved != (apply.Stats{}) {
		logApplyStats(log, st)
	}
	if lsn, ok := a.CaughtUp(); ok && err == nil {
		fmt.Printf("caught up to LSN %s\n", lsn)
	}
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return nil // Ctrl-C or SIGTERM: a clean stop; what was in flight is rolled back and resumed next time
	}
	if errors.Is(err, apply.ErrSlotAhead) {
		return fmt.Errorf("%w\n(-accept-slot-ahead continues from the slot's position without them)", err)
	}
	return err
}

func logApplyStats(log *slog.Logger, st apply.Stats) {
	log.Info("progress", "transactions", st.Txns, "applied_lsn", st.AppliedLSN, "inserts", st.Inserts,
		"inserts_via_copy", st.InsertsViaCopy, "initial_copy_rows", st.InitialCopyRows, "updates", st.Updates, "deletes", st.Deletes, "truncates", st.Truncates,
		"statements", st.Statements, "round_trips", st.RoundTrips, "insert_exists", st.InsertExists,
		"update_origin_differs", st.UpdateOriginDiffers, "update_exists", st.UpdateExists, "update_missing", st.UpdateMissing,
		"delete_origin_differs", st.DeleteOriginDiffers, "update_deleted", st.UpdateDeleted, "delete_missing", st.DeleteMissing,
		"multiple_unique_conflicts", st.MultipleUniqueConflicts, "tombstones", st.Tombstones, "sessions", st.Sessions, "serial_retries", st.SerialRetries,
		"deadlocks", st.Deadlocks, "runs_on_leader", st.RunsOnLeader, "runs_on_workers", st.RunsOnWorkers, "conflict_waits", st.ConflictWaits, "spooled", st.Spooled, "queue_spilled", st.QueueSpilled, "kept_parts", st.KeptParts, "skipped", st.Skipped,
		"columns_added", st.ColumnsAdded, "source_columns_gone", st.SourceColumnsGone, "sequence_syncs", st.SequenceSyncs)
}

// monitorApply starts the metrics server (-metrics-addr) and the progress line (-progress) of
// apply, and returns what stops both.
func monitorApply(a *apply.Applier, f applyFlags, log *slog.Logger) (stop func(context.Context) error, err error) {
	if f.metricsAddr == "" && f.progress <= 0 {
		return func(context.Context) error { return nil }, nil
	}
	c, err := metrics.New(a, metrics.Options{})
	if err != nil {
		return nil, err
	}
	var srv *metrics.Server
	if f.metricsAddr != "" {
		h, err := metrics.Handler(c)
		if err != nil {
			return nil, err
		}
		if srv, err = metrics.Listen(f.metricsAddr, h); err != nil {
			return nil, fmt.Errorf("-metrics-addr: %w", err)
		}
		log.Info("serving metrics", "url", "http://"+srv.Addr()+"/metrics")
	}
	return monitoring(srv, f.progress, func(done <-chan struct{}) {
		printApplyProgress(done, os.Stderr, f.progress, func() (apply.Stats, metrics.Reading) { return a.Stats(), c.Reading() })
	}), nil
}

// printApplyProgress writes apply's progress line to w every interval until done is closed,
// when there is something to report: the counters moved since the last line, or the applier is
// not caught up. An applier that is caught up and idle prints nothing after the line that says
// so; one that has yet to stream (waiting for its slot or its target) and copies nothing prints
// nothing either.
func printApplyProgress(done <-chan struct{}, w io.Writer, every time.Duration, read func() (apply.Stats, metrics.Reading)) {
	t := time.NewTicker(every)
	defer t.Stop()
	var last apply.Stats
	var lastReading metrics.Reading
	printed := false
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		st, rd := read()
		cmp := st
		cmp.Sessions, cmp.RetentionActive = last.Sessions, last.RetentionActive
		switch {
		case cmp == last && rd.Activity.Started.IsZero():
			continue // no stream yet, and nothing copied: waiting for the slot, or the target
		case printed && cmp == last && !progressed(lastReading, rd):
			continue
		}
		fmt.Fprintf(w, "%s %s\n", rd.Time.Format(time.TimeOnly), applyProgressLine(st, rd))
		last, lastReading, printed = st, rd, true
	}
}

// applyProgressLine is apply's progress line: what was applied to the target, the conflicts and
// the initial copy if any, then the stream's summary (metrics.Reading.String), with the lag in
// bytes and in time.
func applyProgressLine(st apply.Stats, rd metrics.Reading) string {
	var b strings.Builder
	fmt.Fprintf(&b, "applied %d txns: %d inserts (%d via COPY), %d updates, %d deletes, %d truncates",
		st.Txns, st.Inserts, st.InsertsViaCopy, st.Updates, st.Deletes, st.Truncates)
	var conflicts int64
	for _, ct := range conflict.Types() {
		conflicts += st.Conflicts(ct)
	}
	if conflicts > 0 {
		fmt.Fprintf(&b, " | conflicts %d", conflicts)
	}
	if st.InitialCopyRows > 0 {
		fmt.Fprintf(&b, " | initial copy %d rows", st.InitialCopyRows)
	}
	b.WriteString(" | ")
	b.WriteString(rd.String())
	return b.String()
}

// tuneCollector says whether apply sets the garbage collector up for itself (tuneGC). Only main
// sets it: tests call runApply inside the test binary, whose collector settings are its own.
var tuneCollector bool

// applyHeapRoom is the memory beyond the work mem that apply's heap may take before the
// collector works harder to stay under it: the bound its memory is measured against.
const applyHeapRoom = 64 << 20

// tuneGC sets Go's collector up for apply, with work mem workMem in bytes, until the function
// it returns is called (which waits for its goroutine to stop). It does nothing if GOGC or
// GOMEMLIMIT is set (then they decide) or the work mem has no limit (then nothing bounds the
// heap, and Go's default stays). Otherwise a collection comes once the heap has grown to 5
// times what the last one left (GOGC=400, where 100 is Go's default), within a soft limit of
// the work mem plus applyHeapRoom. Applying allocates a few kB per transaction that live only
// until its group commits, while what stays live is small beside the work mem: collecting less
// often saves about a tenth of apply's CPU in catch-up, and the limit keeps the process's
// memory under the bound it is measured against. Should the live heap outgrow half the limit
// (many open transactions, a large catalog), the limit follows it, checked every second, so
// that the collector never runs more often than with Go's default.
func tuneGC(workMem int64) (stop func()) {
	if os.Getenv("GOGC") != "" || os.Getenv("GOMEMLIMIT") != "" || workMem > math.MaxInt64-applyHeapRoom {
		return func() {}
	}
	debug.SetMemoryLimit(collectorLimit(workMem, 0))
	debug.SetGCPercent(400)
	quit, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		live := []rtmetrics.Sample{{Name: "/gc/heap/live:bytes"}}
		for {
			select {
			case <-quit:
				return
			case <-tick.C:
			}
			rtmetrics.Read(live)
			if live[0].Value.Kind() == rtmetrics.KindUint64 {
				debug.SetMemoryLimit(collectorLimit(workMem, live[0].Value.Uint64()))
			}
		}
	}()
	return func() {
		close(quit)
		<-stopped
	}
}

// collectorLimit is apply's soft memory limit for a work mem of workMem bytes (at most
// math.MaxInt64 - applyHeapRoom) with live bytes of heap live after the last collection: the
// work mem plus applyHeapRoom, or twice the live heap if that is more.
func collectorLimit(workMem int64, live uint64) int64 {
	return max(workMem+applyHeapRoom, int64(min(live, math.MaxInt64/2))*2)
}

// startCPUProfile starts runtime/pprof's CPU profile into a new file at path and returns what
// stops it and closes the file.
func startCPUProfile(path string) (stop func() error, err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("-cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("-cpuprofile: %w", err)
	}
	return func() error {
		pprof.StopCPUProfile()
		return f.Close()
	}, nil
}
