package pgserver

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
)

// Exec connects with connString, runs each statement on its own (so none runs inside an
// implicit transaction block) and disconnects.
func Exec(ctx context.Context, connString string, statements ...string) error {
	conn, err := pgconn.Connect(ctx, connString)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	for _, st := range statements {
		if _, err := conn.Exec(ctx, st).ReadAll(); err != nil {
			return fmt.Errorf("%w (in %q)", err, st)
		}
	}
	return nil
}
