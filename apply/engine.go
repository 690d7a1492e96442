package apply

import (
	"context"
	"fmt"
	"strconv"

	"github.com/pgreorder/pgreorder/apply/internal/engine"
	"github.com/pgreorder/pgreorder/apply/internal/target"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/reorderbuffer"
)

// The session hands its stream to an engine (package apply/internal/engine), which applies it
// in the configured mode. What the engine cannot decide alone comes back here through
// engineHost: the errors that stop Run or restart the session, the tests' hooks, and the
// workers' connections, which the session sets up as it sets up the leader's.

// asyncDelay is how long after an unflushed commit a commit is made synchronous while the stream
// keeps delivering (see engine.DefaultAsyncDelay).
const asyncDelay = engine.DefaultAsyncDelay

// engine returns the engine that applies the session's stream.
func (s *session) engine() *engine.Engine {
	mode := s.cfg.Mode
	if s.buffered {
		mode = engine.Buffered
	}
	_, queueFiles := spillFiles(true)
	cfg := engine.Config{Mode: mode, Workers: s.cfg.Workers, Relaxed: s.cfg.relaxed(), SynchronousCommit: s.cfg.SynchronousCommit,
		Memory: s.mem, SpillDir: s.cfg.Source.Buffer.Dir, SpillCompressor: s.cfg.Source.Buffer.SpillCompressor,
		QueueFiles: queueFiles, UntilCaughtUp: s.cfg.UntilCaughtUp, SwitchAt: s.switchAt(), Skip: s.skip.pending, SkipLSN: s.cfg.SkipLSN, SkipSQL: s.skip.sql,
		AsyncDelay: s.cfg.asyncDelay(), Now: s.cfg.now, Hooks: s.cfg.hooks != nil, Stepwise: s.cfg.stepwise, RunTxns: s.cfg.runTxns,
		WorkersOnly: s.cfg.hooks != nil && s.cfg.hooks.workersOnly}
	return engine.New(cfg, engine.Session{Leader: s.leader, Key: s.key, FlushSQL: s.flushSQL, Stream: s.stream, Registry: s.reg,
		Log: s.log, Alone: s.det != nil && s.leader.Origin() != "" && lastUpdateWins(&s.cfg.Conflicts), Applied: s.applied,
		Persisted: s.persisted, Serial: s.a.serial, Stepwise: s.a.stepwise, Txns: &s.stats.txns, Stats: &s.stats.eng,
		TargetStats: &s.stats.Counters, Commits: &s.a.commits, Until: &s.a.until, Reached: &s.a.reached,
		Host: engineHost{s}})
}

// engineHost is the session as the engine's engine.Host.
type engineHost struct{ s *session }

func (h engineHost) Hook(ctx context.Context, stage string, x engine.Ref) error {
	return h.s.cfg.hook(ctx, stage, txnRef(x))
}

func (h engineHost) TxnError(x engine.Ref, err error) error { return h.s.txnError(txnRef(x), err) }

func (h engineHost) Restart(xids []uint32, reason error) error {
	return &restartError{xids: xids, reason: reason}
}

func (h engineHost) SkipRefused(t *reorderbuffer.Txn) error { return h.s.skipRefused(t) }

func (h engineHost) NoteRelation(r *target.Relation) { h.s.a.ddl.Note(&h.s.schema, r) }

func (h engineHost) Admit(t *reorderbuffer.Txn) error { return h.s.admit(t) }

// switchAt is where a session that applies as Buffered only to leave out the changes of tables
// copied after they were added ends, to apply in the configured mode (engine.Config.SwitchAt).
func (s *session) switchAt() decoding.LSN {
	if s.cfg.Mode == Buffered || s.tables.SyncTo() <= s.resume {
		return 0
	}
	return s.tables.SyncTo()
}

// ConnectWorker opens worker i's connection: it holds the workers' fence lock in shared mode
// (see fence), has the progress upsert (and relaxed, the ahead table's) prepared, and its
// conflict detection attached.
func (h engineHost) ConnectWorker(ctx context.Context, i int) (_ *target.Conn, err error) {
	s := h.s
	tg, err := h.Connect(ctx, "w"+strconv.Itoa(i))
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			tg.Close(context.WithoutCancel(ctx))
		}
	}()
	_, key := s.fenceKeys()
	if err := tg.LockShared(ctx, key); err != nil {
		return nil, fmt.Errorf("apply: %w", err)
	}
	if err := s.prepareProgress(ctx, tg); err != nil {
		return nil, err
	}
	if s.cfg.relaxed() {
		if err := tg.PrepareAhead(ctx, target.AheadSQL(s.aheadTable)); err != nil {
			return nil, err
		}
	}
	if err := s.attachConflicts(ctx, tg, i); err != nil {
		return nil, err
	}
	return tg, nil
}

func (h engineHost) Connect(ctx context.Context, suffix string) (*target.Conn, error) {
	s := h.s
	return connectTarget(ctx, s.cfg.targetOptions(), "pgreorder apply "+s.cfg.Source.Slot+" "+suffix, &s.stats.Counters)
}
