package snapshot

import (
	"fmt"

	"github.com/pgreorder/pgreorder/internal/retry"
)

var (
	// ErrInvalidConfig is wrapped by every error about a Config (or a Snapshot) that no server
	// would accept.
	ErrInvalidConfig = retry.Stop("snapshot: invalid configuration")

	// ErrUnsupported is wrapped by the error returned for a server older than PostgreSQL 13.
	ErrUnsupported = retry.Stop("snapshot: server version not supported")

	// ErrSnapshotNotExported is wrapped by the error Open returns when the server no longer
	// exports the snapshot: the replication connection that created it started streaming, ran
	// another command or was closed before every worker had imported it. Drop the slot and start
	// again with a new one.
	ErrSnapshotNotExported = retry.Retry("snapshot: the snapshot is not exported (any more)")

	// ErrPublicationNotFound is wrapped by the error Open returns when a publication of
	// Config.Publications did not exist when the snapshot was taken.
	ErrPublicationNotFound = retry.Stop("snapshot: publication does not exist")

	// ErrPublicationChanged is wrapped by the error Open returns when a publication was created,
	// altered or dropped after the snapshot was taken: the tables it would copy are not those the
	// stream publishes from the snapshot's consistent point. Drop the slot and start again.
	ErrPublicationChanged = retry.Retry("snapshot: the publications changed after the snapshot was taken")

	// ErrColumnLists is wrapped by the error Open returns for a table published with different
	// column lists by two of the publications; PostgreSQL refuses to stream it too.
	ErrColumnLists = retry.Stop("snapshot: table published with different column lists")

	// ErrNotConsumed is wrapped by the *ChunkError Run returns when the handler returned without
	// error before it had read every row of its chunk (it did not iterate Changes, or broke out of
	// the loop).
	ErrNotConsumed = retry.Stop("snapshot: handler did not read every row of its chunk")

	// ErrRunning is returned by Run when it is called a second time on the same Session.
	ErrRunning = retry.Stop("snapshot: Run was already called")

	// ErrClosed is returned by Run after Close, and yielded by Chunk.Changes when its Session was
	// closed.
	ErrClosed = retry.Stop("snapshot: closed")
)

// ChunkError reports what failed while copying one chunk of a table: the server (a
// *pgconn.PgError), the connection, the data (a *FormatError), the handler (its own error, as
// returned), or the context.
type ChunkError struct {
	Table string // the table, schema-qualified and quoted as in SQL
	Chunk int    // the chunk's index in the table, from 0
	Err   error
}

func (e *ChunkError) Error() string {
	return fmt.Sprintf("snapshot: copying %s (chunk %d): %v", e.Table, e.Chunk, e.Err)
}

func (e *ChunkError) Unwrap() error { return e.Err }

// FormatError reports COPY data that does not parse: a server bug or a connection that mixes up
// its messages, never the contents of a table.
type FormatError struct {
	Row     int64 // the row, from 1
	Problem string
}

// Retryable reports true: the data of a table always parses, so another attempt, on another
// connection, reads it again.
func (e *FormatError) Retryable() bool { return true }

func (e *FormatError) Error() string {
	return fmt.Sprintf("snapshot: malformed COPY data at row %d: %s", e.Row, e.Problem)
}
