package target

import (
	"context"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	"github.com/pgreorder/pgreorder/internal/pgsession"
)

// The fence of a slot's sessions on the target: two advisory locks per slot of a source
// system. A session's leader holds the first for the whole session; its workers' (and its
// initial copy's) connections hold the second in shared mode. A new session takes the first,
// then the second exclusively for a moment, before it reads the progress row: no connection of
// an earlier session then works on the target any more.

// FenceKeys returns the advisory lock keys of the sessions of slot of the source system
// (advisory locks are per database): the leader's, and the workers'.
func FenceKeys(system, slot string) (lead, workers int64) {
	id := system + "\x00" + slot
	h := fnv.New64a()
	h.Write([]byte("pgreorder apply leader\x00" + id))
	lead = int64(h.Sum64())
	h.Reset()
	h.Write([]byte("pgreorder apply workers\x00" + id))
	return lead, int64(h.Sum64())
}

// TryLock takes the advisory lock key exclusively on t's session if no other session holds
// it, and says whether it did.
func (t *Conn) TryLock(ctx context.Context, key int64) (bool, error) {
	rows, err := Query(ctx, t.pg, "SELECT pg_catalog.pg_try_advisory_lock($1::bigint)", strconv.FormatInt(key, 10))
	if err != nil {
		return false, fmt.Errorf("locking the slot's progress on the target: %w", err)
	}
	return len(rows) == 1 && string(rows[0][0]) == "t", nil
}

// Unlock lets go of the advisory lock key, taken exclusively.
func (t *Conn) Unlock(ctx context.Context, key int64) error {
	if _, err := Query(ctx, t.pg, "SELECT pg_catalog.pg_advisory_unlock($1::bigint)", strconv.FormatInt(key, 10)); err != nil {
		return fmt.Errorf("locking the slot's progress on the target: %w", err)
	}
	return nil
}

// LockShared takes the advisory lock key in shared mode, waiting for an exclusive holder.
func (t *Conn) LockShared(ctx context.Context, key int64) error {
	if _, err := Query(ctx, t.pg, "SELECT pg_catalog.pg_advisory_lock_shared($1::bigint)", strconv.FormatInt(key, 10)); err != nil {
		return fmt.Errorf("locking the slot's progress on the target: %w", err)
	}
	return nil
}

// LockHolders returns the other sessions that hold the advisory lock key in this database.
func (t *Conn) LockHolders(ctx context.Context, key int64) ([]pgsession.Backend, error) {
	cols := strings.Replace(pgsession.BackendColumns, "a.pid::text", "l.pid::text", 1)
	rows, err := Query(ctx, t.pg, "SELECT "+cols+" FROM pg_catalog.pg_locks l "+
		"LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid "+
		"WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND l.classid = $1::oid AND l.objid = $2::oid "+
		"AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database()) "+
		"AND l.pid <> pg_catalog.pg_backend_pid() ORDER BY l.pid",
		strconv.FormatUint(uint64(key)>>32, 10), strconv.FormatUint(uint64(key)&0xffffffff, 10))
	if err != nil {
		return nil, err
	}
	var out []pgsession.Backend
	for _, r := range rows {
		row := make([]string, len(r))
		for i, v := range r {
			row[i] = string(v)
		}
		if b, ok := pgsession.ScanBackend(row); ok {
			out = append(out, b)
		}
	}
	return out, nil
}

// WaitLock takes the advisory lock key exclusively, trying again while other sessions hold it,
// after 20ms, then twice as long each time up to a second (and never past wait, when it is not
// negative). Before each wait it calls held with the holders and how long it has waited so far;
// the error held returns ends the wait, and WaitLock returns it. It returns how long it waited.
func (t *Conn) WaitLock(ctx context.Context, key int64, wait time.Duration,
	held func(holders []pgsession.Backend, waited time.Duration) error) (time.Duration, error) {
	var since time.Time
	delay := 20 * time.Millisecond
	for {
		locked, err := t.TryLock(ctx, key)
		if err != nil {
			return 0, err
		}
		if locked {
			if since.IsZero() {
				return 0, nil
			}
			return time.Since(since), nil
		}
		if since.IsZero() {
			since = time.Now()
		}
		holders, err := t.LockHolders(ctx, key)
		if err != nil {
			return 0, fmt.Errorf("looking for the holder of the slot's progress lock on the target: %w", err)
		}
		waited := time.Since(since)
		if err := held(holders, waited); err != nil {
			return waited, err
		}
		d := delay
		if wait >= 0 {
			d = min(d, wait-waited)
		}
		tm := time.NewTimer(d)
		select {
		case <-ctx.Done():
			tm.Stop()
			return waited, ctx.Err()
		case <-tm.C:
		}
		delay = min(2*delay, time.Second)
	}
}
