package apply

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/pgreorder/pgreorder/apply/internal/ddl"
	"github.com/pgreorder/pgreorder/apply/internal/detect"
	"github.com/pgreorder/pgreorder/apply/internal/initcopy"
	"github.com/pgreorder/pgreorder/apply/internal/schedule"
	"github.com/pgreorder/pgreorder/apply/internal/target"
	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/pgsession"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/replication"
)

// session is one replication connection and the target connections that apply what it hands
// out, from the target's progress row until an error or the end of the context.
type session struct {
	a      *Applier
	cfg    *Config
	log    *slog.Logger
	stats  *counters
	reg    *target.Registry
	stream *replication.Stream

	leader   *target.Conn
	progSQL  string
	flushSQL string             // the flushing transaction's progress upsert (see flushWAL)
	key      target.ProgressKey // the progress row's key and source system

	det    *detect.Detection     // conflict detection; nil when off
	ours   []uint32              // the Applier's replication origins, when it has them
	skip   skipState             // Config.SkipLSN
	schema ddl.Watch             // the relations' descriptions, for columns the source dropped
	tables *initcopy.Tables      // the published tables the target holds whole (tables_added.go)
	mem    *reorderbuffer.Memory // Eager and Parallel: the one limit of the reorder buffer and the workers' queues

	cancel    context.CancelCauseFunc // ends the session with the first error
	persisted decoding.LSN            // a durable progress row is at or past it

	// resume is where the stream starts: after the progress row's position, or after the
	// initial copy's consistent point once the copy is done (copyTarget.Done).
	resume   decoding.LSN
	buffered bool // applied as Buffered: Config.Mode, or a session that skips (Config.SkipLSN)

	// Relaxed commit order (ahead.go).
	aheadTable  string         // quoted and qualified
	applied     schedule.Ahead // committed ahead of the prefix before the session started
	hadProgress bool           // the slot had a progress row when the session started
}

// session starts the session of the Feed's attempt t, up to where the Feed takes over: it
// connects to the target, identifies the source (src: the connection the attempt streams on),
// fences off an earlier session's connections, reads the progress row (and, with Config.Copy
// and no progress row, the copy table), and sets rcfg. What it opens, t's end closes.
func (a *Applier) session(parent context.Context, t *attempt, src *changefeed.Source, rcfg *replication.Config) (err error) {
	s := &session{a: a, cfg: &a.cfg, log: a.cfg.Logger, stats: &a.stats, reg: target.NewRegistry()}
	t.s = s
	ctx, cancel := context.WithCancelCause(parent)
	s.cancel, t.ctx = cancel, ctx
	t.close(func() { cancel(nil) })
	s.leader, err = connectTarget(ctx, s.cfg.targetOptions(), "pgreorder apply "+s.cfg.Source.Slot, &s.stats.Counters)
	if err != nil {
		return err
	}
	t.close(func() { s.leader.Close(context.WithoutCancel(ctx)) })
	sys, slot, err := src.Identify(ctx)
	if err != nil {
		return &sourceError{twoPhaseSlot(err, s.cfg.Source.Slot)}
	}
	s.a.connected.Store(true)
	s.key = target.ProgressKey{Slot: s.cfg.Source.Slot, System: sys.ID, Timeline: sys.Timeline}
	s.tables = s.newTables()
	s.noteStart(sys.XLogPos)
	if err := s.fence(ctx); err != nil {
		return err
	}
	resume, legacy, err := s.setupProgress(ctx, s.leader)
	if err != nil {
		return err
	}
	if resume, err = s.setupAhead(ctx, resume); err != nil {
		return err
	}
	if resume > sys.XLogPos {
		return fmt.Errorf("%w: the progress row of slot %q is at %s, beyond the source's current WAL position %s: "+
			"the source is not the server the target was replicated from, or it lost WAL (restored from an older backup); "+
			"the target cannot continue from it: copy the target again (delete the slot's progress row first)",
			ErrSourceChanged, s.cfg.Source.Slot, resume, sys.XLogPos)
	}
	s.persisted = resume
	if slot != nil && resume != 0 && slot.ConfirmedFlush > resume {
		if resume, err = s.slotAhead(ctx, resume, slot.ConfirmedFlush, legacy); err != nil {
			return err
		}
	}
	if err := s.prepareProgress(ctx, s.leader); err != nil {
		return err
	}
	if err := s.setupSkip(ctx, resume); err != nil {
		return err
	}
	if err := s.setupConflicts(ctx); err != nil { // the leader's origin too: before it writes
		return err
	}
	if s.det != nil && s.det.Tomb != nil {
		t.close(s.det.Tomb.Start(ctx))
	}
	// The tables a stream needs, and the tables added to the publications since the target was
	// copied (copied now); the initial copy checks and records the tables it copies.
	if !s.cfg.Copy || resume != 0 {
		published, err := s.checkTables(ctx) // tables.go
		if err != nil {
			return err
		}
		if err := s.followTables(ctx, published, resume); err != nil { // tables_added.go
			return err
		}
	}
	// The session that skips, or that leaves out changes of tables copied after they were added,
	// applies as Buffered.
	s.buffered = s.cfg.Mode == Buffered || s.skip.pending || s.tables.SyncTo() > resume
	buffered := s.buffered
	if !s.leader.ReplicaRole() {
		s.log.Info("the target role may not set session_replication_role: triggers and foreign keys fire for replicated changes")
	}
	bufferFiles, _ := spillFiles(!buffered)
	if !buffered { // the workers' queues and the reorder buffer share one limit
		s.mem = reorderbuffer.NewMemory(s.cfg.Source.Buffer.WorkMem)
		s.mem.TrackPeak(&s.stats.memPeak)
		rcfg.Buffer.Memory = s.mem
	}
	rcfg.Buffer.MaxOpenFiles = bufferFiles
	rcfg.Buffer.SkipThrough = resume
	rcfg.Buffer.Incremental = !buffered
	rcfg.Buffer.HandOutAdvances = true // idle advances are persisted in the progress row before the slot confirms them
	s.resume = resume
	if s.cfg.Copy && resume == 0 { // no progress row: the target has yet to be copied
		if t.copier, t.begun, _, err = s.copyConfig(ctx); err != nil {
			return err
		}
	}
	return nil
}

// Follow applies the stream, once the Feed started it: from the progress row's position, or
// from the initial copy's consistent point. It returns the error that ended the session.
func (s *session) Follow(ctx context.Context, stream *replication.Stream) error {
	s.stream = stream
	if id := stream.System().ID; id != s.key.System {
		return fmt.Errorf("%w: the source was database system %s a moment ago and is now system %s", ErrSourceChanged, s.key.System, id)
	}
	resume := s.resume
	s.persisted = max(s.persisted, resume)
	if err := s.ensureProgress(ctx, resume); err != nil {
		return err
	}
	// Everything through the progress row's position is on the target already.
	s.stats.Applied(s.persisted)
	s.a.markStreaming()
	s.log.Info("applying", "slot", s.cfg.Source.Slot, "mode", s.cfg.Mode, "resume_after", resume)
	return s.engine().Run(ctx)
}

// fence makes sure that no connection of an earlier session for the slot still works on the
// target before this one reads the progress row. A session whose process died leaves backends
// that finish what they already received, a commit included, before they notice; reading the
// progress row before that commit and applying the transaction again would apply it twice.
//
// Two advisory locks per slot: the leader's connection holds the first for the whole session,
// the workers' connections hold the second in shared mode. A new session takes the first (so
// the previous leader's backend is gone), then the second exclusively for a moment (so are the
// previous workers'), and only then reads the progress row. While another connection holds a
// lock, fence names it (pid, application_name, client) at once and waits for it up to SlotWait:
// a backend whose client died ends when the server notices; one of a session still running (a
// second Applier for the slot) does not, and fence then stops with a *SlotInUseError.
func (s *session) fence(ctx context.Context) error {
	lead, workers := s.fenceKeys()
	if err := s.waitLock(ctx, lead); err != nil {
		return err
	}
	if err := s.waitLock(ctx, workers); err != nil {
		return err
	}
	if err := s.leader.Unlock(ctx, workers); err != nil {
		return fmt.Errorf("apply: %w", err)
	}
	return nil
}

// waitLock takes the advisory lock key exclusively on the leader's connection, waiting for the
// connections that hold it up to SlotWait.
func (s *session) waitLock(ctx context.Context, key int64) error {
	wait := s.cfg.slotWait()
	var said string
	waited, err := s.leader.WaitLock(ctx, key, wait, func(holders []replication.Backend, waited time.Duration) error {
		e := &SlotInUseError{Slot: s.cfg.Source.Slot, Holders: holders}
		// No holder in pg_locks: it let go between the two queries (or the role may not see
		// it); try again before saying anything.
		if desc := e.holders(); desc != said && (len(holders) > 0 || waited > time.Second) {
			limit := "no limit"
			if wait >= 0 {
				limit = wait.String()
			}
			s.log.Warn("the slot is in use on the target by another connection: waiting for it to end", "slot", s.cfg.Source.Slot,
				"holders", desc, "wait_limit", limit)
			said = desc
		}
		if wait >= 0 && waited >= wait {
			e.Waited = waited
			return e
		}
		return nil
	})
	if _, inUse := errors.AsType[*SlotInUseError](err); err != nil && !inUse && err != ctx.Err() {
		return fmt.Errorf("apply: %w", err)
	}
	if err == nil && waited > 0 {
		s.log.Info("the other connections of the slot on the target ended", "slot", s.cfg.Source.Slot, "waited", waited.Round(time.Millisecond))
	}
	return err
}

// fenceKeys returns the advisory lock keys of the sessions of this source system's slot on the
// target (advisory locks are per database). What the fence orders is the work of sessions that
// apply the same stream: the same slot of the same source system. Sessions of another system with
// a slot of the same name do not wait for these; they find the progress row naming this system
// and stop (ErrSourceChanged).
func (s *session) fenceKeys() (lead, workers int64) {
	return fenceKeys(s.key.System, s.cfg.Source.Slot)
}

// fenceKeys returns the advisory lock keys of the sessions of slot of the source system.
func fenceKeys(system, slot string) (lead, workers int64) { return target.FenceKeys(system, slot) }

// twoPhaseSlot rewrites the replication package's check of a slot made with two-phase decoding,
// which names replication's option, for the Applier, which reads slots without it.
func twoPhaseSlot(err error, slot string) error {
	var ce *replication.CheckError
	if !errors.As(err, &ce) || ce.Setting != "two_phase" {
		return err
	}
	c := *ce
	c.Problem = fmt.Sprintf("slot %q decodes prepared transactions at PREPARE (two_phase); apply reads slots without "+
		"two-phase decoding (a prepared transaction is applied at its COMMIT PREPARED)", slot)
	c.Fix = "use a slot created without two-phase decoding"
	return &c
}

// slotAhead handles a slot whose confirmed position is ahead of the progress row: an error,
// unless Config.AcceptSlotAhead (or the progress row predates the source system's columns: the
// versions that wrote such rows let the slot confirm idle positions they never recorded), in
// which case the progress row moves to the slot's position, durably, and that is returned.
func (s *session) slotAhead(ctx context.Context, resume, confirmed decoding.LSN, legacy bool) (decoding.LSN, error) {
	if !s.cfg.AcceptSlotAhead && !legacy {
		return 0, fmt.Errorf("%w: slot %q confirmed %s, but the target's progress row is at %s: the source transactions "+
			"that committed in between were acknowledged but are not on the target, and the source will not send them "+
			"again (the target lost them: restored from an older backup, or a crash of a target that does not flush its "+
			"WAL). Resynchronize the target (delete the slot's progress row, drop the slot, and copy again), or accept "+
			"the loss and continue from the slot's position (Config.AcceptSlotAhead)", ErrSlotAhead, s.cfg.Source.Slot, confirmed, resume)
	}
	if legacy {
		s.log.Info("the slot is ahead of a progress row written before progress rows recorded idle positions: "+
			"moving the row to the slot's position", "slot", s.cfg.Source.Slot, "end_lsn", resume, "confirmed_flush_lsn", confirmed)
	} else {
		s.log.Warn("the slot is ahead of the target's progress row: continuing without the transactions in between, "+
			"as AcceptSlotAhead allows", "slot", s.cfg.Source.Slot, "end_lsn", resume, "confirmed_flush_lsn", confirmed)
	}
	if err := s.leader.FlushWAL(ctx, s.flushSQL, s.key.Args(confirmed)); err != nil {
		return 0, err
	}
	s.persisted = confirmed
	s.stats.Applied(confirmed)
	return confirmed, nil
}

// setupProgress creates the progress table if it is missing (and adds the source system's
// columns to one made before they existed), checks that the slot's row, if any, belongs to the
// source system, and returns the slot's position.
func (s *session) setupProgress(ctx context.Context, tg *target.Conn) (_ decoding.LSN, legacy bool, err error) {
	table := tg.Table(s.cfg.ProgressTable)
	s.progSQL, s.flushSQL = target.ProgressSQL(table)
	upgraded, err := tg.SetupProgressTable(ctx, table)
	if err != nil {
		return 0, false, fmt.Errorf("apply: %w", err)
	}
	if upgraded {
		s.log.Info("progress table upgraded: it records the source system of each slot", "table", table)
	}
	row, found, err := tg.ReadProgress(ctx, table, s.cfg.Source.Slot)
	if err != nil {
		return 0, false, fmt.Errorf("apply: %w", err)
	}
	if !found {
		return 0, false, nil
	}
	lsn, sysID, timeline := row.End, row.System, row.Timeline
	k := s.key
	switch {
	case !row.HasSystem:
		// Written before the table recorded systems: it is taken to be this source's, once.
		if err := tg.RecordSystem(ctx, table, k); err != nil {
			return 0, false, fmt.Errorf("apply: %w", err)
		}
		s.log.Info("the slot's progress row records no source system: it now records this source's", "slot", k.Slot,
			"system_id", k.System, "timeline", k.Timeline, "end_lsn", lsn)
		lsn, _, err := s.setupProgress(ctx, tg) // read again: another session may have recorded one meanwhile
		return lsn, true, err
	case sysID != k.System:
		return 0, false, fmt.Errorf("%w: the progress row of slot %q in %s holds positions of source system %s, but the source is "+
			"system %s: positions of one system mean nothing on another. If the target is to follow the new source, copy it "+
			"again from that source (delete the slot's progress row first); if two sources replicate into this target, "+
			"give each its own slot name or progress table", ErrSourceChanged, k.Slot, table, sysID, k.System)
	case timeline > k.Timeline:
		return 0, false, fmt.Errorf("%w: the progress row of slot %q in %s was written on timeline %d of source system %s, but the "+
			"source is on timeline %d: it went back in time (restored from a backup?) and may not have what the target "+
			"applied; copy the target again from it (delete the slot's progress row first)", ErrSourceChanged, k.Slot, table,
			timeline, k.System, k.Timeline)
	case timeline < k.Timeline:
		if err := tg.RecordTimeline(ctx, table, k); err != nil {
			return 0, false, fmt.Errorf("apply: %w", err)
		}
		s.log.Info("the source is on a new timeline (a promoted standby)", "slot", k.Slot, "system_id", k.System,
			"timeline", k.Timeline, "was", timeline)
	}
	s.stats.Applied(lsn)
	return lsn, false, nil
}

// prepareProgress prepares the progress upsert on tg.
func (s *session) prepareProgress(ctx context.Context, tg *target.Conn) error {
	return tg.PrepareProgress(ctx, s.progSQL)
}

// txnError turns a change's error into an *ApplyError naming the source transaction; other
// errors (connections, transient server errors) are returned as they are.
func (s *session) txnError(x txnRef, err error) error {
	var ce *target.ChangeError
	if !errors.As(err, &ce) {
		return err
	}
	if errors.Is(err, target.ErrOutOfOrder) && !s.a.stepwise[x.Xid] {
		// A conflict's resolution had to come before statements its batch sent: applied again
		// one statement at a time.
		return &restartError{xids: []uint32{x.Xid}, reason: err, stepwise: true}
	}
	if ce.Kind == target.KindSchemaMismatch && pgsession.IsCode(err, pgsession.UndefinedColumn) && !s.a.serial[x.Xid] {
		// undefined_column: the target table lost a column after the session read it; a new
		// session reads the table again, and names the column (or adds it back).
		return &restartError{xids: []uint32{x.Xid}, reason: err}
	}
	s.conflictStopped(err)
	cause := ce.Err
	if ce.Kind == target.KindData && ce.Relation != "" {
		cause = s.a.ddl.TypeNote(ce.Relation, cause)
	}
	return &ApplyError{Kind: kindErr(ce.Kind), Relation: ce.Relation, Op: ce.Op, Xid: x.Xid, CommitLSN: x.CommitLSN,
		EndLSN: x.EndLSN, Err: cause}
}

// sourceError marks an error of the session's first connection to the source (the target's say
// so in their message), for the error Run stops with when it never reached both servers.
type sourceError struct{ err error }

func (e *sourceError) Error() string { return e.err.Error() }
func (e *sourceError) Unwrap() error { return e.err }
