package changefeed

import (
	"context"
	"time"

	"github.com/pgreorder/pgreorder/catalog"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/retry"
)

// Position is what a Store keeps for a slot: enough to resume without a gap or an overlap.
type Position struct {
	// Slot is the replication slot the position is of.
	Slot string
	// SystemID is the source server's system identifier (replication.Conn.SystemID): a position
	// is never used with another server, such as a source rebuilt under the same name.
	SystemID string
	// CopyDone is false from the moment an initial copy begins (before its slot exists) until it
	// is complete, and true from then on.
	CopyDone bool
	// EndLSN is, once CopyDone, the end of the last transaction handled for good: the copy's
	// consistent point at first, then the EndLSN of each streamed transaction the handler
	// returned from. The stream resumes after it (replication.Config.Buffer.SkipThrough).
	EndLSN decoding.LSN
	// State is the handler's own resume state (Batch.SetState), stored with the position, at
	// most MaxState bytes: for instance the length of an output file, which a handler cuts back
	// to when it resumes.
	State []byte
	// Tables are the OIDs of the published tables the consumer knows (Batch.Table's OID),
	// sorted: those of the initial copy, and the tables added to the publications since, copied
	// or streamed (Config.NewTables). A Run hands the handler the rows of a published table that
	// is not among them before its changes. Nil means unknown (a position stored by an earlier
	// release): Run takes the publications' tables when it loads it.
	Tables []uint32
	// Sync is the table added to the publications whose copy began, at Sync.From, and did not
	// finish; nil when none. The next Run hands the handler a TableReset for it and copies it
	// again.
	Sync *TableSync
}

// TableRef names a table of the publications: its OID, the RelationID of its changes in the
// stream, and its name when it was added.
type TableRef struct {
	OID    uint32 `json:"oid"`
	Schema string `json:"schema"`
	Name   string `json:"name"`
}

func (t TableRef) String() string {
	return catalog.TableName{Schema: t.Schema, Name: t.Name}.String()
}

// TableSync is a table added to the publications whose copy began (Position.Sync).
type TableSync struct {
	Table TableRef `json:"table"`
	// From is the position stored when the copy began: the stream delivers the table's changes
	// of the transactions that end after it, the copy those before.
	From decoding.LSN `json:"from"`
}

// MaxState is the largest Position.State a Store must keep.
const MaxState = 4096

// StreamWorker is the worker number Store.Begin is given for everything but copied chunks.
const StreamWorker = -1

// Store keeps a Position durably. Run calls Load first in each of its attempts (again after a
// failure it retries), then Begin for every unit of work (from the copy's worker goroutines at once, each with
// its own worker number, and for the stream with StreamWorker), and Close when it returns. A Store
// is used by one Run at a time.
//
// FileStore keeps the position in a file, TableStore in a table of a PostgreSQL database, where
// the handler's writes commit in the same transaction. Other stores (a Kafka offsets topic, for
// one) implement the same three methods. A store whose commits are costly may also implement
// Grouper, to commit several streamed transactions in one unit.
type Store interface {
	// Load returns the position stored for slot, and false if there is none.
	Load(ctx context.Context, slot string) (Position, bool, error)
	// Begin starts a unit of work for one batch, on behalf of a copy worker (0, 1, ...) or of
	// the stream (StreamWorker). The handler writes through it (Batch.Unit) where the store
	// offers a way to; Run then commits it, with the new position or without one.
	Begin(ctx context.Context, worker int) (Unit, error)
	// Close releases the store's resources.
	Close() error
}

// Unit is one unit of work of a Store: what the handler wrote through it and, when Commit is
// given one, the new position become durable together, or neither does.
type Unit interface {
	// Commit makes the unit durable, with pos stored for its slot if pos is not nil. When it
	// returns nil, a crash no longer undoes it.
	Commit(ctx context.Context, pos *Position) error
	// Rollback abandons the unit. It is called after a failed handler or Commit, and may fail
	// itself (the store's connection is gone): Run only logs that.
	Rollback(ctx context.Context) error
}

// Grouping bounds a unit of work that covers several consecutive streamed transactions. The
// zero value groups nothing: one transaction per unit.
type Grouping struct {
	// MaxTransactions is the most transactions one unit covers; 0 or 1 is one.
	MaxTransactions int
	// MaxBytes bounds the WAL a unit's transactions span, from the end of the one before the
	// first to the end of the last; 0 is no bound. A transaction is never split: one larger than
	// MaxBytes is a unit of its own.
	MaxBytes int64
	// MaxDelay bounds how long a unit stays open for more transactions after its first one was
	// handled; 0 is no bound. (A unit never waits for a transaction that is not there yet: see
	// Grouper.)
	MaxDelay time.Duration
	// CommitMultiple, when positive, bounds that time further, to CommitMultiple times how long
	// the store's commits take (a moving average of the last ones, which Run measures), but never
	// below MinDelay. A unit whose next transaction is always there (a steady load, a backlog)
	// then stays open about that many commits' time, not up to MaxDelay: its first transaction
	// waits about as long as a few commits, and commits take about 1/(CommitMultiple+1) of the
	// time. Slower commits make longer units, up to MaxDelay.
	CommitMultiple float64
	// MinDelay is the least of that bound, and the bound of the units that come before a commit
	// was measured.
	MinDelay time.Duration
}

// Grouper is implemented by a Store whose units may cover several consecutive streamed
// transactions (a Kafka transaction costs the same for one source transaction as for hundreds).
// Run keeps the stream's unit open, handing the next transaction to the handler in the same unit,
// while the stream already holds that transaction complete (replication.Stream.Ready) and the
// Grouping's bounds allow; it commits the unit, with the end of its last transaction as the
// position, as soon as the next transaction is not there yet: a transaction alone commits at once.
// The group's transactions are acknowledged to the server only after the unit committed.
type Grouper interface {
	// Grouping returns the bounds of a group; Run asks once, before it streams.
	Grouping() Grouping
}

// TableChecker is implemented by a Store that must vet the tables a changefeed publishes before
// it handles anything of them: the Kafka sink checks that their topic names do not collide. Run
// calls CheckTables after Load, with the tables the publications hold (pg_publication_tables),
// before it creates a slot and before it resumes a stream; an error stops Run with nothing done.
// A table added to a publication later goes to CheckTables alone when a Feed that copies it
// (NewTablesCopy) sees it, before anything of the transaction that shows it is handled, and an
// error stops Run; otherwise (NewTablesStream, a Follower) such tables are the store's to check
// when their changes arrive.
type TableChecker interface {
	CheckTables(ctx context.Context, tables []catalog.TableName) error
}

var (
	// ErrInvalidConfig is wrapped by the errors of a Config that cannot work.
	ErrInvalidConfig = retry.Stop("changefeed: invalid configuration")
	// ErrSystemMismatch: the store holds a position for the slot taken on another server (its
	// system identifier differs), such as a source rebuilt, or restored from a logical dump,
	// under the same name. Using it would skip or repeat changes: remove the position (and the
	// consumer's output) to start afresh with a copy.
	ErrSystemMismatch = retry.Stop("changefeed: the stored position is of another server")
	// ErrForeignSlot: the slot exists, but the store has no position for it: it was not made by
	// an initial copy of this store, and what the source committed before it would be missing.
	// Drop the slot to start with a copy, or store a position for it.
	ErrForeignSlot = retry.Stop("changefeed: the slot exists, but the store has no position for it")
	// ErrStore is wrapped by the errors of a store's own content: a file that is not a
	// position file, a torn or corrupt one, a position of another slot.
	ErrStore = retry.Stop("changefeed: position store")
	// ErrClosed is returned by a Store after Close.
	ErrClosed = retry.Stop("changefeed: closed")
)

// SlotStore is a Store that keeps nothing: the slot's confirmed position is the only position.
// A run with it streams (Config.Start must be StartStream) from where the server says, after
// Replication.Buffer.SkipThrough when that is set, and a transaction the handler had handled but
// that was not yet acknowledged when the consumer stopped is handed out again by the next run:
// delivery is at least once. It suits an output that cannot be cut back (a pipe, a terminal) and
// a temporary slot. Its units commit nothing, at once.
type SlotStore struct{}

// Load reports no position.
func (SlotStore) Load(context.Context, string) (Position, bool, error) { return Position{}, false, nil }

// Begin returns a unit that commits nothing.
func (SlotStore) Begin(context.Context, int) (Unit, error) { return slotUnit{}, nil }

// Close does nothing.
func (SlotStore) Close() error { return nil }

type slotUnit struct{}

func (slotUnit) Commit(context.Context, *Position) error { return nil }
func (slotUnit) Rollback(context.Context) error          { return nil }

// isSlotStore reports whether s keeps no position.
func isSlotStore(s Store) bool {
	switch s.(type) {
	case SlotStore, *SlotStore:
		return true
	}
	return false
}
