package apply

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/apply/internal/engine"
	"github.com/pgreorder/pgreorder/apply/internal/initcopy"
	"github.com/pgreorder/pgreorder/apply/internal/target"
)

// TestRetryableInternal: the decisions of apply's own unexported errors and of the target
// side's, as the session returns them (internal/retry's TestDecisions has the exported ones).
func TestRetryableInternal(t *testing.T) {
	fatal := &pgconn.PgError{Severity: "FATAL", Code: "57P01"}
	refused := &pgconn.PgError{Severity: "ERROR", Code: "23505"}
	for _, tt := range []struct {
		name string
		err  error
		want bool
	}{
		{"restart", &restartError{xids: []uint32{1}, reason: refused}, true},
		{"restart around a stop", &restartError{xids: []uint32{1}, reason: ErrInvalidConfig}, true},
		{"stream lost", engine.ErrStreamLost, true},
		{"table added", &initcopy.AddedError{Table: "public.t"}, true},
		{"added copy blocked", fmt.Errorf("apply: %w", &initcopy.BlockedError{Tables: "public.t", Waiting: 1}), false},
		{"switch mode", engine.ErrSwitchMode, true},
		{"change refused", changeError{&target.ChangeError{Kind: target.KindConstraint, Err: refused}}, false},
		{"change, connection went", changeError{&target.ChangeError{Kind: target.KindNone, Err: fatal}}, true},
		{"target change refused", fmt.Errorf("x: %w", &target.ChangeError{Err: refused}), false},
		{"target change, eof", &target.ChangeError{Err: io.ErrUnexpectedEOF}, true},
		{"target config", configErr(&target.ConfigError{Err: errors.New("no table")}), false},
		{"target config, bare", &target.ConfigError{Err: errors.New("no table")}, false},
		{"target out of order", target.ErrOutOfOrder, false},
		{"canceled", context.Canceled, false},
	} {
		if got := retryable(tt.err); got != tt.want {
			t.Errorf("%s: retryable(%v) = %v, want %v", tt.name, tt.err, got, tt.want)
		}
	}
}
