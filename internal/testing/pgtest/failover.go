package pgtest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/internal/pgsession"
	"github.com/pgreorder/pgreorder/internal/tools/pgserver"
)

// FailoverMinMajor is the first PostgreSQL major version that keeps logical slots on standbys.
const FailoverMinMajor = 17

// standbySlot is the physical slot a Pair's standby streams through.
const standbySlot = "pgtest_standby"

// Pair is a primary and a physical standby streaming from it, for one test: the standby keeps
// copies of the primary's failover slots (PostgreSQL 17+).
type Pair struct {
	// Major is the PostgreSQL major version of both.
	Major            int
	Primary, Standby *Server
	// DB is the database both hold, made on the primary before the tests' tables.
	DB string
}

// EachPair runs f in a subtest ("pgNN") with a Pair of each installed major that keeps failover
// slots (FailoverMinMajor and later); with none installed, t is Unavailable.
func EachPair(t *testing.T, f func(t *testing.T, pair *Pair)) {
	ran := false
	for _, major := range Majors(t) {
		if major < FailoverMinMajor {
			continue
		}
		ran = true
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) { f(t, NewPair(t, major)) })
	}
	if !ran {
		Unavailable(t, fmt.Sprintf("no PostgreSQL %d or later installed", FailoverMinMajor))
	}
}

// NewPair starts a primary of the given major and a physical standby of it, both for t alone
// and stopped when it ends, set up the way a logical slot created with failover survives the
// promotion of the standby: the standby streams through a physical slot of the primary that the
// primary's synchronized_standby_slots lists, with hot_standby_feedback and
// sync_replication_slots on and dbname in primary_conninfo. It creates the database DB on the
// primary. A major before 17, or one not installed, is Unavailable.
func NewPair(t testing.TB, major int) *Pair {
	t.Helper()
	if major < FailoverMinMajor {
		Unavailable(t, fmt.Sprintf("PostgreSQL %d keeps no logical slot on a standby (failover slots need %d+)", major, FailoverMinMajor))
	}
	var in Install
	for _, i := range cachedInstalls() {
		if i.Major == major {
			in = i
		}
	}
	if in.Major == 0 {
		Unavailable(t, fmt.Sprintf("PostgreSQL %d is not installed", major))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	primary, err := Start(ctx, in, Options{Settings: map[string]string{"synchronized_standby_slots": standbySlot}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { primary.Stop() })
	standby, err := primary.StartStandby(ctx, pgserver.StandbyOptions{Slot: standbySlot, Settings: map[string]string{
		"hot_standby_feedback":   "on",
		"sync_replication_slots": "on",
		// Copied from the primary otherwise: once promoted, the standby's logical walsenders
		// would wait for a standby of its own that does not exist.
		"synchronized_standby_slots": "",
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { standby.Stop() })
	p := &Pair{Major: major, Primary: primary, Standby: standby, DB: "pgt_pair"}
	if err := Exec(ctx, primary.ConnString("postgres"), "CREATE DATABASE "+p.DB); err != nil {
		t.Fatal(err)
	}
	return p
}

// ConnString is a connection string that names both servers over TCP, the primary first, with
// target_session_attrs=read-write: it reaches whichever of them is the primary.
func (p *Pair) ConnString() string {
	return fmt.Sprintf("host=127.0.0.1,127.0.0.1 port=%d,%d user=%s dbname=%s sslmode=disable target_session_attrs=read-write",
		p.Primary.Port(), p.Standby.Port(), SuperUser, p.DB)
}

// WaitSynced waits, up to a minute, until the standby has replayed everything the primary wrote
// so far and holds a synchronized copy of the logical slot (synced, not temporary) confirmed at
// least as far as the primary's slot is now. It asks the standby to synchronize
// (pg_sync_replication_slots) while it waits, when the standby lets it.
func (p *Pair) WaitSynced(t testing.TB, slot string) {
	t.Helper()
	lit := pgsession.QuoteLiteral(slot)
	// confirmed_flush_lsn is NULL while the slot is being created.
	var want string
	Eventually(t, time.Minute, "slot "+slot+" to exist on the primary", func() bool {
		want = QueryText(t, p.Primary.ConnString("postgres"), "SELECT confirmed_flush_lsn::text || ' ' || pg_current_wal_flush_lsn()::text "+
			"FROM pg_replication_slots WHERE slot_name = "+lit)
		return want != ""
	})
	confirmed, wal, _ := strings.Cut(want, " ")
	standby := p.Standby.ConnString("postgres") // the tests' database may not be replayed yet
	var state string
	var syncErr error
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ok := Until(ctx, func() bool {
		qctx, qcancel := context.WithTimeout(ctx, 10*time.Second)
		defer qcancel()
		// A running-transactions record lets the slot's restart_lsn move once the consumer
		// confirms past it: the standby keeps its copy temporary until that position passes
		// the one it could reserve itself.
		syncErr = Exec(qctx, p.Primary.ConnString("postgres"), "SELECT pg_log_standby_snapshot()")
		state = QueryText(t, standby, "SELECT pg_last_wal_replay_lsn()::text || ' ' || coalesce((SELECT synced::text || ' ' || "+
			"temporary::text || ' ' || coalesce(confirmed_flush_lsn::text, '') FROM pg_replication_slots WHERE slot_name = "+lit+"), 'missing')")
		return QueryText(t, standby, "SELECT (synced AND NOT temporary AND confirmed_flush_lsn >= '"+confirmed+"' "+
			"AND pg_last_wal_replay_lsn() >= '"+wal+"')::text FROM pg_replication_slots WHERE slot_name = "+lit) == "true"
	})
	if !ok {
		t.Fatalf("pgtest: the standby's copy of slot %s did not reach %s (primary WAL %s) within a minute: "+
			"replayed, synced, temporary, confirmed = %s; pg_log_standby_snapshot: %v", slot, confirmed, wal, state, syncErr)
	}
}

// Failover promotes the standby and then stops the primary at once (immediate shutdown, as
// pg_ctl stop -m immediate): the consumers connected to it lose their connections. The
// primary's folder stays until the test ends.
func (p *Pair) Failover(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := p.Standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	p.Primary.Crash()
}
