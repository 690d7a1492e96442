package apply

import (
	"strings"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// TestFailover: an applier on a slot it creates with Source.Failover, whose Source names a primary and
// its standby (target_session_attrs=read-write), keeps applying once the standby is promoted
// and the primary stopped, the mixed workload (a large transaction streamed and applied eagerly,
// savepoints rolled back) running on each side of the failover; restarted, it resumes on the
// promoted standby from its progress row, written on the earlier timeline of the same system.
// The target ends equal to the source.
func TestFailover(t *testing.T) {
	pgtest.EachPair(t, func(t *testing.T, pair *pgtest.Pair) {
		ctx := pgtest.Context(t, 2*time.Minute)
		tgt := pgtest.Shared(t, pair.Major)
		dstDB := pgtest.NewDatabase(t, tgt)
		e := &env{srv: pair.Primary, src: pair.Primary.ConnString(pair.DB), dst: tgt.ConnString(dstDB),
			repl: pair.ConnString(), slot: "apply"}
		must(t, pgtest.Exec(ctx, e.src, append(append([]string{}, schema...), `CREATE PUBLICATION pub FOR ALL TABLES`)...))
		must(t, pgtest.Exec(ctx, e.dst, schema...))
		cfg := e.config(t, Eager)
		cfg.Source.CreateSlot, cfg.Source.Failover = true, true
		r := start(t, cfg)
		pgtest.Eventually(t, time.Minute, "the slot", func() bool {
			return pgtest.QueryText(t, e.src, "SELECT failover::text FROM pg_replication_slots WHERE slot_name = 'apply'") == "true"
		})
		pair.WaitSynced(t, "apply") // before any transaction is open: see pgtest.Pair.WaitSynced

		rng := seeded(t)
		must(t, workload(ctx, e.src, rng, 1, nil))
		e.waitMarker(t, r, 1)
		pair.WaitSynced(t, "apply")
		pair.Failover(t)

		e.src = pair.Standby.ConnString(pair.DB)
		must(t, workload(ctx, e.src, rng, 2, nil))
		e.waitMarker(t, r, 2)
		e.waitSame(t)
		e.compare(t)
		r.halt(t)

		// Restarted, it meets its progress row of timeline 1 on timeline 2 of the same system.
		r = start(t, cfg)
		must(t, workload(ctx, e.src, rng, 3, nil))
		e.waitMarker(t, r, 3)
		e.waitSame(t)
		e.compare(t)
		r.halt(t)
		row := pgtest.QueryText(t, e.dst, "SELECT system_id || ' ' || timeline FROM pgreorder_apply_progress WHERE slot = 'apply'")
		sys := pgtest.QueryText(t, e.src, "SELECT system_identifier::text FROM pg_control_system()")
		if row != sys+" 2" || strings.Count(row, " ") != 1 {
			t.Fatalf("progress row system and timeline %q; want %q", row, sys+" 2")
		}
	})
}
