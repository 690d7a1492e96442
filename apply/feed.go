package apply

import (
	"context"
	"fmt"

	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/replication"
)

// A session runs on a changefeed.Feed: the Feed connects to the source, waits for a slot that
// another connection still holds, runs the initial copy (through copyTarget) or resumes after
// the progress row's position (checking that the slot is still there and the server the same),
// and hands the started stream to the session (Follow), which applies it and acknowledges what
// the target made durable. The Feed's Store is the target's progress row and copy table as the
// session read them before the Feed runs (progressStore); the session writes them itself, in
// the target transactions that apply.

// feed returns the Feed of the session over the stream rcfg describes: with Config.Copy and no
// progress row, it starts with the initial copy.
func (s *session) feed(ctx context.Context, rcfg replication.Config) (*changefeed.Feed, error) {
	fc := changefeed.Config{Replication: rcfg, Logger: s.log, Start: changefeed.StartStream, Follower: s}
	store := &progressStore{s: s}
	if s.cfg.Copy && s.resume == 0 { // no progress row: the target has yet to be copied
		c, begun, scfg, err := s.copyConfig(ctx)
		if err != nil {
			return nil, err
		}
		fc.Start, fc.Copier, fc.Copy, store.begun = changefeed.StartCopy, c, scfg, begun
	}
	return changefeed.New(fc, store, s.handle)
}

// handle is the session's changefeed.Handler. The Feed hands it the batch that starts a run
// (Reset or Resume), which needs nothing of the target: the copy table records an initial copy
// (copyTarget.Begin empties what one cut short left), and the progress row is where the stream
// resumes. The copy's chunks go to copyTarget, and the stream to Follow.
func (s *session) handle(_ context.Context, b *changefeed.Batch) error {
	switch b.Kind {
	case changefeed.Reset, changefeed.Resume:
		return nil
	}
	return fmt.Errorf("apply: the feed handed out a %s batch, which the session takes elsewhere", b.Kind)
}

// progressStore is the changefeed.Store of a session: the progress row's position and the copy
// table's record of an unfinished copy, as the session read them when it started. Units write
// nothing: what a session applies writes the progress row in the same target transaction, and the
// initial copy records itself (copyTarget).
type progressStore struct {
	s     *session
	begun bool // the copy table records a copy of the slot that began and did not finish
}

func (p *progressStore) Load(_ context.Context, slot string) (changefeed.Position, bool, error) {
	s := p.s
	switch {
	case s.resume != 0:
		return changefeed.Position{Slot: slot, SystemID: s.key.System, CopyDone: true, EndLSN: s.resume}, true, nil
	case p.begun:
		return changefeed.Position{Slot: slot, SystemID: s.key.System}, true, nil
	}
	return changefeed.Position{}, false, nil
}

func (p *progressStore) Begin(context.Context, int) (changefeed.Unit, error) {
	return progressUnit{}, nil
}

func (p *progressStore) Close() error { return nil }

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
