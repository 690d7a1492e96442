package apply

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/pgreorder/pgreorder/apply/internal/engine"
	"github.com/pgreorder/pgreorder/apply/internal/initcopy"
	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/configerr"
	"github.com/pgreorder/pgreorder/internal/retry"
	"github.com/pgreorder/pgreorder/replication"
	"github.com/pgreorder/pgreorder/snapshot"
)

// Run runs one changefeed.Feed, and each session is one of its attempts. The Feed is the loop:
// it connects to the source, waits for a slot that another connection still holds, runs the
// initial copy (through initcopy.Copier) or resumes after the progress row's position (checking
// that the slot is still there and the server the same), hands the started stream to the
// session (Follow), which applies it and acknowledges what the target made durable, and after a
// failure that another attempt can cure waits (retryBackoff) and makes another, within
// StartTimeout until both servers were reached.
//
// The Applier takes part in each attempt through applyFeed, the Feed's changefeed.Restarter:
// Prepare starts a session (the target connection, the fence, the progress row, the source's
// identity: session), whose progress row and copy table the Feed's Store then reads
// (applyFeed.Load); Ended closes the session and tells the Feed how it ended: a session that
// caught up ends Run, one that ended to apply some transactions alone (restartError) is
// followed at once by the next, with those transactions marked serial, and the Applier's own
// measure of progress (a transaction applied, or a minute) decides whether the next delay is
// the shortest again. The session writes the progress row and the copy table itself, in the
// target transactions that apply.

// runSessions runs the sessions, as the attempts of one Feed, until ctx is done or an error that
// retrying cannot cure.
func (a *Applier) runSessions(ctx context.Context) error {
	f := &applyFeed{a: a}
	rcfg := a.cfg.Source
	rcfg.Logger = a.cfg.Logger
	// The Feed's attempts wait as sessions always did; a session that cannot have the slot
	// waits for it up to SlotWait.
	rcfg.Reconnect = replication.ReconnectPolicy{MinDelay: retryBackoff.Min, MaxDelay: retryBackoff.Max, SlotWait: a.cfg.SlotWait}
	fc := changefeed.Config{Replication: rcfg, Logger: a.cfg.Logger, Start: changefeed.StartStream, Follower: f,
		StartTimeout: a.cfg.startTimeout()}
	if a.cfg.hooks != nil {
		fc.PublicationCheck = a.cfg.hooks.publicationCheck
	}
	if a.cfg.Copy { // a session with no progress row copies the target (Prepare finds out)
		// The connection, publications and binary values are the stream's (InitialCopy).
		scfg := snapshot.Config{Workers: a.cfg.CopyWorkers, Logger: a.cfg.Logger}
		if a.cfg.hooks != nil {
			scfg.ChunkSize = a.cfg.hooks.copyChunkSize
		}
		fc.Start, fc.Copier, fc.Copy = changefeed.StartCopy, sessionCopier{f}, scfg
	}
	feed, err := changefeed.New(fc, f, f.handle)
	if err != nil {
		return err
	}
	if prev := a.feed.Load(); prev != nil {
		if err := feed.Continue(prev); err != nil { // the readings go on across Runs too
			return err
		}
	}
	a.feed.Store(feed)
	err = feed.Run(ctx)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if ne, ok := errors.AsType[*changefeed.NotStartedError](err); ok {
		side := "target"
		if ne.Side == changefeed.SideSource {
			side = "source"
		}
		return configerr.WithHint(fmt.Errorf("%w: the %s could not be reached: %w", ErrNotStarted, side, ne.Err), " ",
			"(tried for %s: %s)", ne.Tried.Round(time.Second), field("StartTimeout"))
	}
	return err
}

// attempt is the session of the Feed's attempt in progress, and what its end needs.
type attempt struct {
	s       *session
	ctx     context.Context  // the session's context: session.cancel ends it
	closers []func()         // what Ended closes, the last first
	copier  *initcopy.Copier // the initial copy's side, when the session copies
	begun   bool             // the copy table records a copy of the slot that began and did not finish
	began   time.Time
	applied int64 // Stats.Txns when the session began
}

// close registers f for the end of the attempt.
func (t *attempt) close(f func()) { t.closers = append(t.closers, f) }

// applyFeed is the Applier's side of its Feed: the Restarter that makes each attempt a session,
// the Follower that applies the stream, the Store that reads the progress row and the copy table
// as the session found them (its Copier is sessionCopier). Its methods run on Run's goroutine;
// the copy's workers read cur (sessionCopier.Chunk) while it does not change.
type applyFeed struct {
	a   *Applier
	cur *attempt // the attempt in progress, from Prepare to Ended

	following atomic.Pointer[session] // the session that applies the stream, for PublishedTables
}

// Prepare starts a session: the Feed's attempt loads its position from the progress row the
// session read.
func (f *applyFeed) Prepare(ctx context.Context, src *changefeed.Source, rcfg *replication.Config) error {
	a := f.a
	a.stats.sessions.Add(1)
	t := &attempt{began: time.Now(), applied: a.stats.txns.Load()}
	f.cur = t
	return a.session(ctx, t, src, rcfg)
}

// Follow applies the stream the Feed started, in the session's context.
func (f *applyFeed) Follow(_ context.Context, stream *replication.Stream) error {
	f.following.Store(f.cur.s)
	defer f.following.Store(nil)
	return f.cur.s.Follow(f.cur.ctx, stream)
}

// PublishedTables takes the Feed's listing of the published tables (changefeed.TableWatcher):
// a table added since the session started ends it, and the next session copies it.
func (f *applyFeed) PublishedTables(tables []changefeed.TableRef) {
	if s := f.following.Load(); s != nil {
		s.published(tables)
	}
}

// Ended closes the session and tells the Feed how it ended (see runSessions).
func (f *applyFeed) Ended(ctx context.Context, o *changefeed.Outcome) {
	a, t := f.a, f.cur
	f.cur = nil
	for i := len(t.closers) - 1; i >= 0; i-- {
		t.closers[i]()
	}
	err := o.Err
	if err == nil || ctx.Err() != nil {
		return
	}
	if errors.Is(err, errCaughtUp) {
		o.Err = nil
		return
	}
	if ae, ok := errors.AsType[*initcopy.AddedError](err); ok {
		a.cfg.Logger.Info("table added to the publications: starting the session over to copy it", "table", ae.Table,
			"slot", a.cfg.Source.Slot)
		o.Now, a.added = a.added != ae.Table, ae.Table // not at once again: the source does not list it yet
		return
	}
	if errors.Is(err, engine.ErrSwitchMode) {
		a.cfg.Logger.Info("the stream is past the copies of the tables added to the publications: applying in the configured mode",
			"mode", a.cfg.Mode, "slot", a.cfg.Source.Slot)
		o.Now = true
		return
	}
	if re, ok := errors.AsType[*restartError](err); ok {
		for _, x := range re.xids {
			a.serial[x] = true
			if re.stepwise {
				a.stepwise[x] = true
			}
		}
		a.stats.serialRetries.Add(int64(len(re.xids)))
		a.cfg.Logger.Info("retrying serially", "xids", re.xids, "reason", re.reason)
		o.Now = true
		return
	}
	switch {
	case errors.Is(err, changefeed.ErrForeignSlot):
		o.Err = fmt.Errorf("%w: slot %q (drop it to copy afresh: SELECT pg_drop_replication_slot('%s'))",
			ErrCopySlotExists, a.cfg.Source.Slot, a.cfg.Source.Slot)
	case errors.Is(err, replication.ErrSlotNotFound) && t.s != nil && t.s.resume != 0:
		o.Err = configerr.WithHint(fmt.Errorf("%w: the target's progress row for slot %q is at %s, but the slot does not exist on the source "+
			"(dropped, or a promoted standby it was not synchronized to): the source changes since are lost to the target",
			replication.ErrSlotNotFound, a.cfg.Source.Slot, t.s.resume), "; ",
			"copy the target again: delete the slot's progress row and run with %s (and %s, so that the new slot is kept on a standby across a failover)",
			field("Copy"), field("Source.Failover"))
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		// Not ctx's: a connection that broke while a wait was cut short, retried like the
		// connection.
		o.Err = retry.Mark(err, true)
	}
	if _, ok := errors.AsType[*sourceError](err); ok {
		o.Side = changefeed.SideSource
	}
	o.Reached = a.connected.Load()
	o.Progress = a.stats.txns.Load() > t.applied || time.Since(t.began) >= resetRetryAfter
}

// handle is the Feed's Handler. The Feed hands it the batch that starts an attempt (Reset or
// Resume), which needs nothing of the target: the copy table records an initial copy
// (initcopy.Copier.Begin empties what one cut short left), and the progress row is where the stream
// resumes. The copy's chunks go to initcopy.Copier, and the stream to Follow.
func (f *applyFeed) handle(_ context.Context, b *changefeed.Batch) error {
	switch b.Kind {
	case changefeed.Reset, changefeed.Resume:
		return nil
	}
	return fmt.Errorf("apply: the feed handed out a %s batch, which the session takes elsewhere", b.Kind)
}

// Load returns the progress row's position, or the copy table's record of an unfinished copy,
// as the attempt's session read them.
func (f *applyFeed) Load(_ context.Context, slot string) (changefeed.Position, bool, error) {
	t := f.cur
	switch {
	case t.s.resume != 0:
		return changefeed.Position{Slot: slot, SystemID: t.s.key.System, CopyDone: true, EndLSN: t.s.resume}, true, nil
	case t.begun:
		return changefeed.Position{Slot: slot, SystemID: t.s.key.System}, true, nil
	}
	return changefeed.Position{}, false, nil
}

// Begin returns a unit that writes nothing: what a session applies writes the progress row in the
// same target transaction, and the initial copy records itself (initcopy.Copier).
func (f *applyFeed) Begin(context.Context, int) (changefeed.Unit, error) {
	return progressUnit{}, nil
}

// Close does nothing: the sessions close what they opened.
func (f *applyFeed) Close() error { return nil }

// sessionCopier is the Feed's Copier: the initcopy.Copier of the attempt's session, which copies
// when it found no progress row.
type sessionCopier struct{ f *applyFeed }

func (c sessionCopier) target() (*initcopy.Copier, error) {
	if t := c.f.cur; t != nil && t.copier != nil {
		return t.copier, nil
	}
	return nil, errors.New("apply: the feed copies in a session that found a progress row")
}

func (c sessionCopier) Begin(ctx context.Context, systemID string) error {
	ct, err := c.target()
	if err != nil {
		return err
	}
	return ct.Begin(ctx, systemID)
}

func (c sessionCopier) Plan(ctx context.Context, sess *snapshot.Session) error {
	ct, err := c.target()
	if err != nil {
		return err
	}
	return ct.Plan(ctx, sess)
}

func (c sessionCopier) Chunk(ctx context.Context, ch *snapshot.Chunk) error {
	ct, err := c.target()
	if err != nil {
		return err
	}
	return ct.Chunk(ctx, ch)
}

func (c sessionCopier) Done(ctx context.Context, cp decoding.LSN) error {
	ct, err := c.target()
	if err != nil {
		return err
	}
	return ct.Done(ctx, cp)
}

func (c sessionCopier) Discard(ctx context.Context, noSlot bool) {
	if ct, err := c.target(); err == nil {
		ct.Discard(ctx, noSlot)
	}
}

// progressUnit is the unit of a Reset or Resume batch. The Feed stores a position only where a
// stream with no copy starts (changefeed.StartStream), at the slot's own position (0): the
// progress row is written by the first transaction applied.
type progressUnit struct{}

func (progressUnit) Commit(_ context.Context, pos *changefeed.Position) error {
	if pos != nil && pos.EndLSN != 0 {
		return fmt.Errorf("apply: the feed stored position %s, which only the target's progress row keeps", pos.EndLSN)
	}
	return nil
}

func (progressUnit) Rollback(context.Context) error { return nil }

// Interface checks.
var (
	_ changefeed.Restarter = (*applyFeed)(nil)
	_ changefeed.Store     = (*applyFeed)(nil)
	_ changefeed.Copier    = sessionCopier{}
)
