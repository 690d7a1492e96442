package changefeed

import (
	"errors"
	"fmt"
	"io"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/internal/retry"
	"github.com/pgreorder/pgreorder/snapshot"
)

// TestCopyRetryable: a handler's error stops the attempt (a copy or a stream) unless its connection was lost, whatever
// it wraps; the rest is the errors' own decision (internal/retry's TestDecisions).
func TestCopyRetryable(t *testing.T) {
	for _, tt := range []struct {
		name string
		err  error
		want bool
	}{
		{"handler's own", &stopError{errors.New("boom")}, false},
		{"handler's transient server error", &stopError{&pgconn.PgError{Severity: "ERROR", Code: "40P01"}}, false},
		{"handler's retry sentinel", &stopError{retry.Retry("again")}, false},
		{"handler's full disk", &stopError{fmt.Errorf("w: %w", syscall.ENOSPC)}, false},
		{"handler's lost connection", &stopError{&pgconn.PgError{Severity: "FATAL", Code: "57P01"}}, true},
		{"handler reading rows, eof", &snapshot.ChunkError{Table: "t", Err: &stopError{io.ErrUnexpectedEOF}}, true},
		{"handler's connection class 08", &stopError{&pgconn.PgError{Severity: "ERROR", Code: "08006"}}, true},
		{"in a chunk", fmt.Errorf("changefeed: initial copy: %w", &snapshot.ChunkError{Table: "t", Err: &stopError{errors.New("boom")}}), false},
		{"store", fmt.Errorf("%w: x", ErrStore), false},
		{"foreign slot", fmt.Errorf("%w: x", ErrForeignSlot), false},
		{"snapshot gone", fmt.Errorf("changefeed: initial copy: %w", fmt.Errorf("%w: x", snapshot.ErrSnapshotNotExported)), true},
	} {
		if got := again(tt.err); got != tt.want {
			t.Errorf("%s: again(%v) = %v, want %v", tt.name, tt.err, got, tt.want)
		}
	}
}
