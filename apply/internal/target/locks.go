package target

import (
	"context"
	"strconv"
	"strings"
)

// LockWaits returns, of the backends pids, those waiting for a lock, each with the backends that
// hold it or wait before it (pg_blocking_pids).
func (t *Conn) LockWaits(ctx context.Context, pids []uint32) (map[uint32][]uint32, error) {
	list := make([]string, 0, len(pids))
	for _, pid := range pids {
		list = append(list, strconv.FormatUint(uint64(pid), 10))
	}
	rows, err := Query(ctx, t.pg, `SELECT pid, pg_catalog.pg_blocking_pids(pid)::text FROM pg_catalog.pg_stat_activity
		WHERE pid = ANY ($1::int[]) AND wait_event_type = 'Lock'`, "{"+strings.Join(list, ",")+"}")
	if err != nil {
		return nil, err
	}
	waits := map[uint32][]uint32{}
	for _, r := range rows {
		p, _ := strconv.ParseUint(string(r[0]), 10, 32)
		for b := range strings.SplitSeq(strings.Trim(string(r[1]), "{}"), ",") {
			if q, err := strconv.ParseUint(b, 10, 32); err == nil {
				waits[uint32(p)] = append(waits[uint32(p)], uint32(q))
			}
		}
	}
	return waits, nil
}
