package retry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/apply"
	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/internal/pgsession"
	"github.com/pgreorder/pgreorder/internal/retry"
	"github.com/pgreorder/pgreorder/kafkasink"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/replication"
	"github.com/pgreorder/pgreorder/snapshot"
	"github.com/pgreorder/pgreorder/spill"
)

// TestDecisions lists every error type and sentinel that replication, snapshot, changefeed,
// apply and kafkasink return (and those of reorderbuffer and spill that reach them), wrapped as
// they are returned, with the decision the one rule makes for it. The unexported types are in
// the packages' own tests (apply's restart and change errors, changefeed's handler errors).
func TestDecisions(t *testing.T) {
	lost := &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	fatal := pgErr("FATAL", "57P01")
	refused := pgErr("ERROR", "23505")
	for _, tt := range []struct {
		name string
		err  error
		want bool
	}{
		// replication
		{"replication.ErrClosed", replication.ErrClosed, false},
		{"replication.ErrServerEndedStream", fmt.Errorf("%w (CopyDone)", replication.ErrServerEndedStream), true},
		{"replication.ErrSlotActive", fmt.Errorf("x: %w: %w", replication.ErrSlotActive, pgErr("ERROR", "55006")), true},
		{"replication.ErrNotConnected", replication.ErrNotConnected, true},
		{"replication.ErrServerConfig", &replication.CheckError{Setting: "wal_level", Err: replication.ErrServerConfig}, false},
		{"replication.ErrPublicationNotFound", &replication.CheckError{Setting: "publication", Err: replication.ErrPublicationNotFound, Cause: pgErr("ERROR", "42704")}, false},
		{"replication.ErrSlotNotFound", &replication.CheckError{Setting: "slot", Err: replication.ErrSlotNotFound}, false},
		{"replication.ErrSlotNotFound, bare", fmt.Errorf("changefeed: slot %q: %w", "s", replication.ErrSlotNotFound), false},
		{"replication.ErrSlotExists", fmt.Errorf("replication: CREATE_REPLICATION_SLOT: %w: %w", replication.ErrSlotExists, pgErr("ERROR", "42710")), false},
		{"replication.ErrSlotMismatch", &replication.CheckError{Setting: "slot", Err: replication.ErrSlotMismatch}, false},
		{"replication.ErrResumeAhead", &replication.CheckError{Setting: "Buffer.SkipThrough", Err: replication.ErrResumeAhead}, false},
		{"replication.ErrSlotAhead", &replication.CheckError{Setting: "Buffer.SkipThrough", Err: replication.ErrSlotAhead}, false},
		{"replication.ErrSystemChanged", &replication.CheckError{Setting: "system", Err: replication.ErrSystemChanged}, false},
		{"replication.CheckError with a transient cause", &replication.CheckError{Setting: "max_wal_senders", Err: replication.ErrServerConfig, Cause: pgErr("FATAL", "53300")}, false},
		{"replication.ErrUnsupported", &replication.OptionError{Option: "streaming", Err: replication.ErrUnsupported}, false},
		{"replication.ErrInvalidConfig", fmt.Errorf("%w: x", replication.ErrInvalidConfig), false},
		{"replication.ProtocolError", &replication.ProtocolError{Msg: "x", Err: io.ErrUnexpectedEOF}, false},
		{"replication.SlotActiveError, not waited for", &replication.SlotActiveError{Slot: "s", Cause: pgErr("ERROR", "55006")}, true},
		{"replication.SlotActiveError, waited for", &replication.SlotActiveError{Slot: "s", Waited: time.Minute, Cause: pgErr("ERROR", "55006")}, false},
		{"replication: waiting for the slot, cancelled", fmt.Errorf("%w (while waiting: %w)", context.Canceled, &replication.SlotActiveError{Slot: "s"}), false},
		{"replication: receive", fmt.Errorf("replication: receive: %w", io.ErrUnexpectedEOF), true},
		{"replication: lost while ctx ended", fmt.Errorf("replication: connection lost: %w", lost), true},
		{"replication: giving up", fmt.Errorf("replication: giving up after %d reconnection attempts: %w", 3, lost), true},
		{"replication: temporary slot lost", fmt.Errorf("replication: the connection to the temporary slot %q was lost, and the slot with it: %w", "s", lost), true},
		{"replication: server error on the stream", fmt.Errorf("replication: %w", pgErr("ERROR", "58P01")), false},
		// reorderbuffer and spill, through the stream
		{"reorderbuffer.InputError: protocol", &reorderbuffer.InputError{Err: fmt.Errorf("%w: x", reorderbuffer.ErrProtocol)}, false},
		{"reorderbuffer.InputError: spill not written", &reorderbuffer.InputError{Err: &fs.PathError{Op: "write", Path: "x", Err: syscall.ENOSPC}}, true},
		{"reorderbuffer.InputError: spill corrupt", &reorderbuffer.InputError{Err: &spill.CorruptError{Log: "x", Err: io.ErrUnexpectedEOF}}, false},
		{"reorderbuffer.MissingError", &reorderbuffer.InputError{Err: &reorderbuffer.MissingError{What: "COMMIT"}}, false},
		{"reorderbuffer.ErrFailed after a protocol error", fmt.Errorf("%w: %w", reorderbuffer.ErrFailed, &reorderbuffer.InputError{Err: reorderbuffer.ErrProtocol}), false},
		{"reorderbuffer.ErrFailed after a full disk", fmt.Errorf("%w: %w", reorderbuffer.ErrFailed, &reorderbuffer.InputError{Err: &fs.PathError{Op: "write", Path: "x", Err: syscall.ENOSPC}}), true},
		{"reorderbuffer.ErrClosed", reorderbuffer.ErrClosed, false},
		{"reorderbuffer.ErrReleased", reorderbuffer.ErrReleased, false},
		{"reorderbuffer.ErrForeignTxn", reorderbuffer.ErrForeignTxn, false},
		{"reorderbuffer.ErrNotCommit", reorderbuffer.ErrNotCommit, false},
		{"spill.ErrCorrupt", fmt.Errorf("%w: x", spill.ErrCorrupt), false},
		{"spill.LogError of a full disk", &spill.LogError{Path: "x", Err: &fs.PathError{Op: "write", Path: "x", Err: syscall.ENOSPC}}, true},
		// connections (pgsession)
		{"pgsession.AttemptError: network", fmt.Errorf("replication: connecting: %w", &pgsession.AttemptError{Err: lost}), true},
		{"pgsession.AttemptError: password", &pgsession.AttemptError{Err: pgErr("FATAL", "28P01")}, false},
		{"pgsession.AttemptError: BeforeConnect", &pgsession.AttemptError{Err: errors.New("BeforeConnect: no token")}, true},
		{"pgsession.ErrNotParsed", pgsession.ErrNotParsed, false},
		// snapshot
		{"snapshot.ErrInvalidConfig", fmt.Errorf("%w: x", snapshot.ErrInvalidConfig), false},
		{"snapshot.ErrUnsupported", fmt.Errorf("%w: PostgreSQL 12", snapshot.ErrUnsupported), false},
		{"snapshot.ErrSnapshotNotExported", fmt.Errorf("%w: snapshot %q: %w", snapshot.ErrSnapshotNotExported, "s", pgErr("ERROR", "22023")), true},
		{"snapshot.ErrPublicationNotFound", fmt.Errorf("%w: p", snapshot.ErrPublicationNotFound), false},
		{"snapshot.ErrPublicationChanged", fmt.Errorf("%w: p", snapshot.ErrPublicationChanged), true},
		{"snapshot.ErrColumnLists", fmt.Errorf("%w: t", snapshot.ErrColumnLists), false},
		{"snapshot.ErrNotConsumed", &snapshot.ChunkError{Table: "t", Err: snapshot.ErrNotConsumed}, false},
		{"snapshot.ErrRunning", snapshot.ErrRunning, false},
		{"snapshot.ErrClosed", snapshot.ErrClosed, false},
		{"snapshot.ChunkError: lost", &snapshot.ChunkError{Table: "t", Err: lost}, true},
		{"snapshot.ChunkError: server", &snapshot.ChunkError{Table: "t", Err: pgErr("ERROR", "42501")}, false},
		{"snapshot.FormatError", &snapshot.ChunkError{Table: "t", Err: &snapshot.FormatError{Row: 1, Problem: "x"}}, true},
		{"snapshot: importing the snapshot", fmt.Errorf("snapshot: importing snapshot %q: %w", "s", fatal), true},
		// changefeed
		{"changefeed.ErrInvalidConfig", fmt.Errorf("%w: x", changefeed.ErrInvalidConfig), false},
		{"changefeed.ErrSystemMismatch", fmt.Errorf("%w: x", changefeed.ErrSystemMismatch), false},
		{"changefeed.ErrForeignSlot", fmt.Errorf("%w: slot", changefeed.ErrForeignSlot), false},
		{"changefeed.ErrStore", fmt.Errorf("%w: %w", changefeed.ErrStore, lost), false},
		{"changefeed.ErrClosed", changefeed.ErrClosed, false},
		{"changefeed: initial copy", fmt.Errorf("changefeed: initial copy: %w", &snapshot.ChunkError{Table: "t", Err: lost}), true},
		{"changefeed: dropping the slot", fmt.Errorf("changefeed: dropping the slot of an unfinished copy: %w", pgErr("ERROR", "55006")), true},
		// apply
		{"apply.ErrInvalidConfig", fmt.Errorf("%w: x", apply.ErrInvalidConfig), false},
		{"apply.ErrSlotAhead", fmt.Errorf("%w: x", apply.ErrSlotAhead), false},
		{"apply.ErrSourceChanged", fmt.Errorf("%w: x", apply.ErrSourceChanged), false},
		{"apply.ErrSlotInUse", &apply.SlotInUseError{Slot: "s", Waited: time.Minute}, false},
		{"apply.ErrRunning", apply.ErrRunning, false},
		{"apply.ErrSkipLSN", fmt.Errorf("%w: x", apply.ErrSkipLSN), false},
		{"apply.ErrMissingSequence", fmt.Errorf("%w: s", apply.ErrMissingSequence), false},
		{"apply.ErrTargetNotEmpty", fmt.Errorf("%w: t", apply.ErrTargetNotEmpty), false},
		{"apply.ErrCopySlotExists", fmt.Errorf("%w: s", apply.ErrCopySlotExists), false},
		{"apply.ApplyError refused", &apply.ApplyError{Kind: apply.ErrConstraint, Op: apply.OpInsert, Err: refused}, false},
		{"apply.ApplyError, the connection went", &apply.ApplyError{Kind: nil, Op: apply.OpInsert, Err: fatal}, true},
		{"apply.ApplyError, network", &apply.ApplyError{Op: apply.OpCommit, Err: fmt.Errorf("x: %w", lost)}, true},
		{"apply.ApplyError, deadlock", &apply.ApplyError{Op: apply.OpUpdate, Err: pgErr("ERROR", "40P01")}, false},
		{"apply.ErrMissingTable", &apply.ApplyError{Kind: apply.ErrMissingTable, Relation: "t"}, false},
		{"apply.ErrSchemaMismatch", &apply.ApplyError{Kind: apply.ErrSchemaMismatch}, false},
		{"apply.ErrNoReplicaIdentity", &apply.ApplyError{Kind: apply.ErrNoReplicaIdentity}, false},
		{"apply.ErrPermission", &apply.ApplyError{Kind: apply.ErrPermission, Err: pgErr("ERROR", "42501")}, false},
		{"apply.ErrData", &apply.ApplyError{Kind: apply.ErrData, Err: pgErr("ERROR", "22P02")}, false},
		{"apply.ErrConflict", &apply.ApplyError{Kind: apply.ErrConflict}, false},
		{"apply: a statement on the target", fmt.Errorf("apply: reading the progress table %s: %w", "p", pgErr("ERROR", "40001")), true},
		{"apply: connecting to the source", fmt.Errorf("apply: connecting to the source: %w", &pgsession.AttemptError{Err: lost}), true},
		// kafkasink
		{"kafkasink.ErrInvalidConfig", fmt.Errorf("%w: x", kafkasink.ErrInvalidConfig), false},
		{"kafkasink.ErrFenced", fmt.Errorf("%w %q: x", kafkasink.ErrFenced, "id"), false},
		{"kafkasink.ErrTopicMissing", fmt.Errorf("%w: t", kafkasink.ErrTopicMissing), false},
		{"kafkasink.ErrRecordTooLarge", fmt.Errorf("%w: t", kafkasink.ErrRecordTooLarge), false},
		{"kafkasink.ErrUnreachable", fmt.Errorf("%w [b]: x", kafkasink.ErrUnreachable), true},
		{"kafkasink.ErrAuthentication", fmt.Errorf("%w (TLS): %w", kafkasink.ErrAuthentication, errors.New("x509")), false},
		{"kafkasink.ErrAuthorization", fmt.Errorf("%w as user: %w", kafkasink.ErrAuthorization, errors.New("denied")), false},
		{"kafkasink.ErrClosed", kafkasink.ErrClosed, false},
		{"kafkasink.TopicCollisionError", &kafkasink.TopicCollisionError{Topic: "a", OtherTopic: "a"}, false},
		{"kafkasink.ErrTopicCollision", fmt.Errorf("%w: x", kafkasink.ErrTopicCollision), false},
	} {
		if got := retry.Retryable(tt.err); got != tt.want {
			t.Errorf("%s: Retryable(%v) = %v, want %v", tt.name, tt.err, got, tt.want)
		}
		if got := replication.Retryable(tt.err); got != tt.want {
			t.Errorf("%s: replication.Retryable disagrees", tt.name)
		}
	}
}
