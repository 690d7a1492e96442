package changefeed

import (
	"context"
	"fmt"
	"time"

	"github.com/pgreorder/pgreorder/replication"
	"github.com/pgreorder/pgreorder/snapshot"
)

// Copier is the consumer's side of InitialCopy: where the copied rows go, and how the consumer
// records, durably, that a copy began and that it is complete.
type Copier interface {
	// Begin discards what an earlier, unfinished copy of the slot delivered and records durably
	// that a copy begins, on the server with the given system identifier. InitialCopy calls it
	// before it creates the slot, so that a slot found on a later start with that record is
	// known to be a copy's that was cut short.
	Begin(ctx context.Context, systemID string) error
	// Plan is called once the snapshot is open on every copy connection and the stream has
	// started, before the first chunk. sess.Tables are the tables to copy, sess.Workers the
	// number of workers that call Chunk at once.
	Plan(ctx context.Context, sess *snapshot.Session) error
	// Chunk delivers the rows of one chunk for good. It is called from the copy's worker
	// goroutines at once (Chunk.Worker tells which) and must read every row.
	Chunk(ctx context.Context, c *snapshot.Chunk) error
	// Done records durably that the copy is complete and that the stream resumes after
	// consistentPoint. It is called once, after every Chunk returned nil.
	Done(ctx context.Context, consistentPoint LSN) error
	// Discard is called when the copy failed after Begin returned nil; noSlot says that the
	// slot does not exist any more (it was dropped again, or never created). It undoes what it
	// can; what it leaves (it is best effort), the next copy's Begin discards.
	Discard(ctx context.Context, noSlot bool)
}

// CopyConfig describes an initial copy.
type CopyConfig struct {
	// Replication is the stream's configuration. CreateSlot is ignored: the slot is created by
	// InitialCopy, with an exported snapshot, and must not exist unless Begun.
	Replication replication.Config
	// Snapshot configures the copy. Its connection (ConnString, ConnConfig, BeforeConnect),
	// Publications, Binary and Logger default to Replication's when unset.
	Snapshot snapshot.Config
	// Begun says that the consumer's records show a copy of the slot that began (Copier.Begin
	// returned) and did not finish: its slot, if it exists, is dropped and the copy starts over.
	// Without it, an existing slot is ErrForeignSlot.
	Begun bool
	// SystemID, if set, is the system identifier of the server the begun copy was made on; a
	// server with another one is ErrSystemMismatch.
	SystemID string
}

// slotStageTimeout bounds the wait for the walsender of a consumer that died to release the
// slot of its unfinished copy, and the clean-up after a failed copy.
const slotStageTimeout = 30 * time.Second

// InitialCopy runs an initial copy and returns the stream that follows it, from the slot's
// consistent point, and that point. The stream is read only once the copy is complete.
//
// It drops the slot of a copy cut short (cfg.Begun), calls c.Begin, creates the slot with an
// exported snapshot, opens the copy on every worker connection, starts streaming (so that the
// walsender is not left idle for the whole copy), calls c.Plan, copies every chunk through
// c.Chunk, and calls c.Done. If anything fails after c.Begin, it drops the slot again and calls
// c.Discard before returning the error; a crash instead leaves the slot and the consumer's record
// of the copy, and the next InitialCopy with Begun starts over.
func InitialCopy(ctx context.Context, cfg CopyConfig, c Copier) (_ *replication.Stream, _ replication.LSN, err error) {
	rcfg := cfg.Replication
	rcfg.CreateSlot = false
	rcfg.TemporarySlot = false
	rcfg.Buffer.SkipThrough = 0
	log := rcfg.Logger
	if log == nil {
		log = discardLogger
	}
	conn, err := replication.Connect(ctx, rcfg)
	if err != nil {
		return nil, 0, err
	}
	defer func() {
		if conn != nil {
			conn.Close(context.WithoutCancel(ctx))
		}
	}()
	if cfg.SystemID != "" && conn.SystemID() != cfg.SystemID {
		return nil, 0, fmt.Errorf("%w: an unfinished copy of slot %q was made on the server with system identifier %s, this one is %s",
			ErrSystemMismatch, rcfg.Slot, cfg.SystemID, conn.SystemID())
	}
	if _, ok := conn.Slot(); ok {
		if !cfg.Begun {
			return nil, 0, fmt.Errorf("%w: slot %q (drop it to copy afresh: SELECT pg_drop_replication_slot('%s'))",
				ErrForeignSlot, rcfg.Slot, rcfg.Slot)
		}
		log.Warn("an earlier initial copy did not finish: dropping its slot and starting over", "slot", rcfg.Slot)
		dctx, cancel := context.WithTimeout(ctx, slotStageTimeout)
		err := conn.DropSlot(dctx)
		cancel()
		if err != nil {
			return nil, 0, fmt.Errorf("changefeed: dropping the slot of an unfinished copy: %w", err)
		}
	}
	if err := c.Begin(ctx, conn.SystemID()); err != nil {
		return nil, 0, err
	}
	snap, err := conn.CreateSlot(ctx, replication.ExportSnapshot)
	if err != nil {
		c.Discard(ctx, true)
		return nil, 0, err
	}

	var (
		sess   *snapshot.Session
		stream *replication.Stream
	)
	defer func() {
		if err == nil {
			return
		}
		bg := context.WithoutCancel(ctx)
		if sess != nil {
			sess.Close(bg)
		}
		if stream != nil {
			stream.Close(bg)
		}
		if conn != nil {
			conn.Close(bg)
			conn = nil
		}
		dropped := dropSlot(bg, rcfg) == nil
		if !dropped {
			log.Warn("dropping the slot of the failed initial copy; the next run will", "slot", rcfg.Slot)
		}
		c.Discard(bg, dropped)
	}()
	scfg := cfg.Snapshot
	if scfg.ConnString == "" && scfg.ConnConfig == nil {
		scfg.ConnString, scfg.ConnConfig = rcfg.ConnString, rcfg.ConnConfig
		if scfg.BeforeConnect == nil {
			scfg.BeforeConnect = rcfg.BeforeConnect
		}
	}
	if len(scfg.Publications) == 0 {
		scfg.Publications = rcfg.Publications
	}
	if rcfg.Binary {
		scfg.Binary = true
	}
	if scfg.Logger == nil {
		scfg.Logger = rcfg.Logger
	}
	sess, err = snapshot.Open(ctx, scfg, snap)
	if err != nil {
		return nil, 0, fmt.Errorf("changefeed: initial copy: %w", err)
	}
	stream, err = conn.StartStreaming(ctx)
	conn = nil // the stream owns it, or it is closed
	if err != nil {
		return nil, 0, err
	}
	if err := c.Plan(ctx, sess); err != nil {
		return nil, 0, err
	}
	if _, err := sess.Run(ctx, c.Chunk); err != nil {
		return nil, 0, fmt.Errorf("changefeed: initial copy: %w", err)
	}
	if err := sess.Close(ctx); err != nil {
		log.Warn("closing the copy's connections", "err", err)
	}
	sess = nil
	if err := c.Done(ctx, snap.ConsistentPoint); err != nil {
		return nil, 0, err
	}
	log.Info("initial copy complete; streaming from its consistent point", "slot", rcfg.Slot, "consistent_point", snap.ConsistentPoint)
	return stream, snap.ConsistentPoint, nil
}

// dropSlot drops the slot of a failed copy on a replication connection of its own, waiting
// for the walsender of the copy's stream to let go of it.
func dropSlot(ctx context.Context, rcfg replication.Config) error {
	ctx, cancel := context.WithTimeout(ctx, slotStageTimeout)
	defer cancel()
	conn, err := replication.Connect(ctx, rcfg)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.DropSlot(ctx)
}
