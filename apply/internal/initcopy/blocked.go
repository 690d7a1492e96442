package initcopy

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"
)

// ErrBlocked is wrapped by a *BlockedError.
var ErrBlocked = errors.New("apply: the copy of the tables added to the publications is blocked")

// BlockedError stops the copy of added tables whose snapshot cannot be taken: its temporary slot
// waits for the transactions running on the source to end, and some of them wait at their
// COMMIT for a synchronous standby (synchronous_standby_names) of which none is streaming. When
// the applier is that standby, they wait for it while it waits for them: the copy would never
// start, and the source's commits would never return.
type BlockedError struct {
	Tables   string // the added tables, as the log names them
	Waiting  int64  // the source's backends waiting for a synchronous standby
	Standbys string // the source's synchronous_standby_names
}

func (e *BlockedError) Error() string {
	return fmt.Sprintf("%v: the copy of %s waits for transactions on the source (the snapshot waits for those running, and "+
		"the publication change that added the table becomes visible once it commits), and %d of them wait at their COMMIT "+
		"for a synchronous standby (synchronous_standby_names = %s) of which none is streaming. When apply is that standby, "+
		"they wait for apply while apply waits for them: take apply out of synchronous_standby_names until it has copied the "+
		"tables (its next start copies them), then put it back. Otherwise, start apply again once a synchronous standby "+
		"streams", ErrBlocked, e.Tables, e.Waiting, strconv.Quote(e.Standbys))
}

// Blocked returns the *BlockedError of tables when the source's commits wait for a synchronous
// standby none of which streams (one look), and nil otherwise or when the source cannot say.
func Blocked(ctx context.Context, tables string, query func(ctx context.Context, sql string) ([][][]byte, error)) *BlockedError {
	e, err := blocked(ctx, query)
	if err != nil || e == nil {
		return nil
	}
	e.Tables = tables
	return e
}

// Unwrap returns ErrBlocked.
func (e *BlockedError) Unwrap() error { return ErrBlocked }

// Retryable reports false: another session would wait for the same transactions.
func (e *BlockedError) Retryable() bool { return false }

// blockedSQL tells, on the source, how many backends wait at their COMMIT for a synchronous
// standby, how many standbys stream as synchronous ones (sync or quorum), and
// synchronous_standby_names.
const blockedSQL = `SELECT (SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'),
	(SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND sync_state IN ('sync', 'quorum')),
	current_setting('synchronous_standby_names')`

// BlockedCheck is how often watchBlocked looks, and BlockedChecks how many looks in a row must
// find the copy blocked before it stops it: a standby that reconnects, or a commit about to be
// released, is not taken for a blocked copy.
const (
	BlockedCheck  = 2 * time.Second
	BlockedChecks = 3
)

// watchBlocked looks at the source every BlockedCheck while the copy's snapshot is being taken
// (until stop is called) and, when BlockedChecks looks in a row find it blocked (see
// BlockedError), cancels ctx with the *BlockedError as the cause. query runs a statement on an
// ordinary connection to the source; errors of its are ignored (the next look tries again).
func watchBlocked(ctx context.Context, cancel context.CancelCauseFunc, tables string,
	query func(ctx context.Context, sql string) ([][][]byte, error)) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(BlockedCheck)
		defer t.Stop()
		found := 0
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			e, err := blocked(ctx, query)
			if err != nil || e == nil {
				found = 0
				continue
			}
			if found++; found >= BlockedChecks {
				e.Tables = tables
				cancel(e)
				return
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}

// blocked returns the BlockedError of a source whose commits wait for a synchronous standby none
// of which streams, and nil otherwise.
func blocked(ctx context.Context, query func(ctx context.Context, sql string) ([][][]byte, error)) (*BlockedError, error) {
	rows, err := query(ctx, blockedSQL)
	if err != nil {
		return nil, err
	}
	if len(rows) != 1 || len(rows[0]) != 3 {
		return nil, fmt.Errorf("apply: %d rows from the synchronous standby check", len(rows))
	}
	waiting, err := strconv.ParseInt(string(rows[0][0]), 10, 64)
	if err != nil {
		return nil, err
	}
	streaming, err := strconv.ParseInt(string(rows[0][1]), 10, 64)
	if err != nil {
		return nil, err
	}
	if waiting == 0 || streaming > 0 {
		return nil, nil
	}
	return &BlockedError{Waiting: waiting, Standbys: string(rows[0][2])}, nil
}
