package target

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestConcurrent(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&pgconn.PgError{Code: "40P01"}, true},
		{&pgconn.PgError{Code: "40001"}, true},
		{fmt.Errorf("apply: %w", &pgconn.PgError{Code: "55P03"}), true},
		{&pgconn.PgError{Code: "23505"}, false},
		{&pgconn.PgError{Code: "57P01"}, false},
		{errors.New("deadlock detected"), false},
		{nil, false},
	} {
		if got := Concurrent(tc.err); got != tc.want {
			t.Errorf("Concurrent(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
