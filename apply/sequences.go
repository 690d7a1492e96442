package apply

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgreorder/pgreorder/apply/internal/target"
	"github.com/pgreorder/pgreorder/internal/configerr"
	"github.com/pgreorder/pgreorder/internal/pgsession"
	"github.com/pgreorder/pgreorder/internal/retry"
)

// DefaultSyncSequencesInterval is Config.SyncSequencesInterval's default.
const DefaultSyncSequencesInterval = 10 * time.Second

// ErrMissingSequence is wrapped by the error of a sequence synchronization (Config.SyncSequences,
// Applier.SyncSequences) when a sequence of the source has no sequence of the same schema and
// name on the target.
var ErrMissingSequence = retry.Stop("apply: a sequence of the source does not exist on the target")

// SyncSequences copies, once, the values of the source's sequences owned by the published tables'
// columns to the target's sequences of the same schema and name, which only move forward: a target
// sequence already at or past the source's value is left as it is. A sequence the source never used
// is left out. The values it set are durable on the target (flushed to its WAL) when it returns: a
// crash of the target after it does not take them back. It returns the number of target sequences
// moved. It opens connections of its own and may be called while Run runs (Config.SyncSequences
// makes Run call it).
//
// Sequences that only an ALL SEQUENCES publication (PostgreSQL 19) names, not owned by a
// published table's column, are not synchronized.
func (a *Applier) SyncSequences(ctx context.Context) (moved int, err error) {
	if a == nil || a.serial == nil {
		return 0, fmt.Errorf("%w: an Applier is made by New", ErrInvalidConfig)
	}
	o, err := a.cfg.sourceSQL("pgreorder apply " + a.cfg.Source.Slot + " sequences")
	if err != nil {
		return 0, err
	}
	src, err := pgsession.Connect(ctx, o)
	if err != nil {
		return 0, fmt.Errorf("apply: synchronizing sequences: connecting to the source: %w", err)
	}
	defer src.Close(context.WithoutCancel(ctx))
	seqs, err := target.Query(ctx, src, target.OwnedSequencesQuery, pgsession.QuoteTextArray(a.cfg.Source.Publications))
	if err != nil {
		return 0, fmt.Errorf("apply: synchronizing sequences: reading the source's sequences: %w", err)
	}
	var c target.Counters
	tg, err := connectTarget(ctx, a.cfg.targetOptions(), "pgreorder apply "+a.cfg.Source.Slot+" sequences", &c)
	if err != nil {
		return 0, err
	}
	defer tg.Close(context.WithoutCancel(ctx))
	// setval is not transactional, but its WAL is flushed only as its transaction's commit asks:
	// a value set must survive a crash of the target once SyncSequences returned.
	if !a.cfg.SynchronousCommit {
		if err := tg.PG().Exec(ctx, "SET synchronous_commit = on").Close(); err != nil {
			return 0, fmt.Errorf("apply: synchronizing sequences: %w", err)
		}
	}
	moved, err = tg.SyncSequences(ctx, seqs, func(seq, value string, set bool) error {
		if set {
			a.cfg.Logger.Debug("sequence synchronized", "sequence", seq, "value", value)
		}
		return a.cfg.hook(ctx, "sequence-set", txnRef{})
	})
	if missing, ok := errors.AsType[*target.MissingSequenceError](err); ok {
		return moved, configerr.WithHint(ErrMissingSequence, ": ", "%v: create it there, or stop synchronizing sequences (%s)", missing, field("SyncSequences"))
	}
	if err != nil {
		return moved, fmt.Errorf("apply: synchronizing sequences: %w", err)
	}
	a.stats.sequenceSyncs.Add(1)
	a.cfg.Logger.Info("sequences synchronized", "sequences", len(seqs), "moved", moved)
	return moved, nil
}

// syncSequencesLoop synchronizes the sequences (Config.SyncSequences) once the first session
// streams (after an initial copy), every SyncSequencesInterval after that, until ctx ends. A
// missing target sequence ends Run, through stop; other failures are logged and retried at the
// next interval.
func (a *Applier) syncSequencesLoop(ctx context.Context, stop context.CancelCauseFunc) {
	every := a.cfg.SyncSequencesInterval
	if every == 0 {
		every = DefaultSyncSequencesInterval
	}
	select {
	case <-ctx.Done():
		return
	case <-a.streamed:
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if _, err := a.SyncSequences(ctx); err != nil {
			if errors.Is(err, ErrMissingSequence) || errors.Is(err, ErrInvalidConfig) {
				stop(err)
				return
			}
			if ctx.Err() != nil {
				return
			}
			a.cfg.Logger.Warn("synchronizing sequences failed: trying again", "err", err, "after", every)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// streaming says whether a session has started streaming.
func (a *Applier) streaming() bool {
	select {
	case <-a.streamed:
		return true
	default:
		return false
	}
}

// markStreaming records that a session streams.
func (a *Applier) markStreaming() {
	a.streamedOnce.Do(func() { close(a.streamed) })
}

// runWith runs the sessions (runSessions) with what goes around them: the sequence
// synchronization of Config.SyncSequences, during the run and once more after a clean stop (ctx
// done, or caught up with Config.UntilCaughtUp).
func (a *Applier) runWith(parent context.Context) error {
	ctx, stop := context.WithCancelCause(parent)
	defer stop(nil)
	var loop chan struct{}
	if a.cfg.SyncSequences {
		loop = make(chan struct{})
		go func() {
			defer close(loop)
			a.syncSequencesLoop(ctx, stop)
		}()
	}
	err := a.runSessions(ctx)
	if cause := context.Cause(ctx); parent.Err() == nil && cause != nil && !errors.Is(cause, context.Canceled) {
		err = cause // the sequence synchronization stopped the run
	}
	stop(nil)
	if loop != nil {
		<-loop
	}
	clean := err == nil || (parent.Err() != nil && errors.Is(err, parent.Err()))
	if a.cfg.SyncSequences && clean && a.streaming() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(parent), time.Minute)
		defer cancel()
		if _, serr := a.SyncSequences(sctx); serr != nil {
			a.cfg.Logger.Warn("synchronizing sequences at the stop failed", "err", serr)
			if err == nil {
				err = serr
			}
		}
	}
	return err
}
