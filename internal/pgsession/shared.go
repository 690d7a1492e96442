package pgsession

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Shared is an ordinary connection opened when first needed and shared by the goroutines that
// query through it, one at a time; a query that lost it closes it, and the next one opens
// another. The zero value is ready to use; Close closes the connection, if open.
type Shared struct {
	mu   sync.Mutex
	conn *pgconn.PgConn
}

// Query runs sql with text parameters, first opening the connection with open if there is none
// (or it was closed). When lost says that the query's error lost the connection, it is closed.
func (s *Shared) Query(ctx context.Context, open func(context.Context) (*pgconn.PgConn, error), lost func(error) bool,
	sql string, args ...string) ([][][]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == nil || s.conn.IsClosed() {
		conn, err := open(ctx)
		if err != nil {
			return nil, err
		}
		s.conn = conn
	}
	params := make([][]byte, len(args))
	for i, a := range args {
		params[i] = []byte(a)
	}
	res := s.conn.ExecParams(ctx, sql, params, nil, nil, nil).Read()
	if res.Err != nil && lost(res.Err) {
		s.conn.Close(context.WithoutCancel(ctx))
		s.conn = nil
	}
	return res.Rows, res.Err
}

// Abandon asks the server to cancel what the connection runs (best effort: a backend waiting
// for a lock never reads the close), within timeout, and closes it: the next query opens
// another.
func (s *Shared) Abandon(ctx context.Context, timeout time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == nil {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	s.conn.CancelRequest(cctx)
	s.conn.Close(cctx)
	s.conn = nil
}

// Close closes the connection, if open.
func (s *Shared) Close(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn != nil {
		s.conn.Close(ctx)
		s.conn = nil
	}
}
