package pgtest_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// testMajors are the installed majors plus 15 to 18, which CI must have: with
// PGREORDER_REQUIRE_PG=1 a missing one fails instead of skipping.
func testMajors(t *testing.T) []int {
	majors := []int{15, 16, 17, 18}
	for _, in := range pgtest.FindInstalls() {
		if !slices.Contains(majors, in.Major) {
			majors = append(majors, in.Major)
		}
	}
	slices.Sort(majors)
	return majors
}

func showSetting(t *testing.T, connString, name string) string {
	t.Helper()
	conn := pgtest.Connect(t, connString)
	res := pgtest.MustExec(t, conn, "SHOW "+name)
	require.Len(t, res, 1)
	require.Len(t, res[0].Rows, 1)
	return string(res[0].Rows[0][0])
}

func TestSharedServers(t *testing.T) {
	for _, major := range testMajors(t) {
		t.Run(strconv.Itoa(major), func(t *testing.T) {
			s := pgtest.Shared(t, major)
			require.Equal(t, major, s.Major())
			require.Same(t, s, pgtest.Shared(t, major), "one server per major")
			db := pgtest.NewDatabase(t, s)
			t.Logf("PostgreSQL %s at %s", s.Install().Version, s.ConnString(db))

			num, err := strconv.Atoi(showSetting(t, s.ConnString(db), "server_version_num"))
			require.NoError(t, err)
			require.Equal(t, major, num/10000)
			for name, want := range map[string]string{
				"wal_level":                 "logical",
				"max_replication_slots":     "32",
				"max_wal_senders":           "32",
				"max_prepared_transactions": "10",
				"logical_decoding_work_mem": "64kB",
				"fsync":                     "off",
				"listen_addresses":          "127.0.0.1",
				"wal_sender_timeout":        "1min", // the production default: slow consumers get disconnected
				"synchronous_commit":        "on",
			} {
				require.Equal(t, want, showSetting(t, s.ConnString(db), name), name)
			}
			require.Equal(t, strconv.Itoa(s.Port()), showSetting(t, s.TCPConnString(db), "port"), "TCP connection")

			// A walsender connection, and a slot that NewDatabase's cleanup must drop.
			repl := pgtest.Connect(t, s.ReplicationConnString(db))
			res := pgtest.MustExec(t, repl, "IDENTIFY_SYSTEM")
			require.Len(t, res[0].Rows, 1)
			res = pgtest.MustExec(t, repl, "CREATE_REPLICATION_SLOT pgt_slot LOGICAL pgoutput")
			require.Equal(t, "pgt_slot", string(res[0].Rows[0][0]))
		})
	}
}

// TestDatabaseCleanup checks that a database made by NewDatabase, with a slot still in use, is
// gone after its test.
func TestDatabaseCleanup(t *testing.T) {
	majors := pgtest.Majors(t)
	s := pgtest.Shared(t, majors[0])
	var db string
	t.Run("inner", func(t *testing.T) {
		db = pgtest.NewDatabase(t, s)
		repl := pgtest.Connect(t, s.ReplicationConnString(db))
		pgtest.MustExec(t, repl, "CREATE_REPLICATION_SLOT pgt_cleanup LOGICAL pgoutput")
	})
	conn := pgtest.Connect(t, s.ConnString("postgres"))
	res := pgtest.MustExec(t, conn, fmt.Sprintf(
		"SELECT (SELECT count(*) FROM pg_database WHERE datname = '%s'), (SELECT count(*) FROM pg_replication_slots WHERE database = '%[1]s')", db))
	require.Equal(t, "0", string(res[0].Rows[0][0]), "database dropped")
	require.Equal(t, "0", string(res[0].Rows[0][1]), "slots dropped")
}

func TestStartStop(t *testing.T) {
	pgtest.Majors(t) // skip without servers
	installs := pgtest.FindInstalls()
	in := installs[len(installs)-1]
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := pgtest.Start(ctx, in, pgtest.Options{Settings: map[string]string{"logical_decoding_work_mem": "1MB"}})
	require.NoError(t, err)
	defer s.Stop()
	require.Equal(t, "1MB", showSetting(t, s.ConnString("postgres"), "logical_decoding_work_mem"))
	fi, err := os.Stat(s.SocketDir())
	require.NoError(t, err)
	require.True(t, fi.IsDir())

	require.NoError(t, s.Stop())
	require.NoError(t, s.Stop(), "Stop twice")
	_, err = os.Stat(s.SocketDir())
	require.ErrorIs(t, err, os.ErrNotExist, "folder removed")
	require.Error(t, pgtest.Exec(ctx, s.ConnString("postgres"), "SELECT 1"), "server stopped")
}

func TestStartBadSetting(t *testing.T) {
	pgtest.Majors(t)
	in := pgtest.FindInstalls()[0]
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := pgtest.Start(ctx, in, pgtest.Options{Settings: map[string]string{"wal_level": "no_such_level"}})
	var se *pgtest.StartError
	require.ErrorAs(t, err, &se)
	require.Contains(t, se.Log, "wal_level", "the error carries the server log")
}

const recordWorkload = `
-- setup
CREATE TABLE t (id int PRIMARY KEY, pad text);
-- workload
-- a transaction far over 64kB, with a rolled-back subtransaction that was already streamed
BEGIN;
INSERT INTO t SELECT g, repeat('x', 100) FROM generate_series(1, 2000) g;
SAVEPOINT s1;
INSERT INTO t SELECT g, repeat('y', 100) FROM generate_series(2001, 4000) g;
ROLLBACK TO SAVEPOINT s1;
INSERT INTO t VALUES (5000, 'after');
SELECT pg_logical_emit_message(true, 'pgt', 'transactional');
COMMIT;
-- a small transaction, and two interleaved ones
INSERT INTO t VALUES (6000, 'small');
-- session a
BEGIN;
INSERT INTO t SELECT g, repeat('a', 100) FROM generate_series(10001, 11000) g;
-- session b
BEGIN;
INSERT INTO t SELECT g, repeat('b', 100) FROM generate_series(20001, 21000) g;
COMMIT;
-- session a
COMMIT;
-- a big prepared transaction
BEGIN;
INSERT INTO t SELECT g, repeat('p', 100) FROM generate_series(30001, 31000) g;
PREPARE TRANSACTION 'pgt_gid';
COMMIT PREPARED 'pgt_gid';
`

func countTypes(c pgtest.Capture) map[byte]int {
	n := map[byte]int{}
	for _, r := range c.Records {
		n[r.Data[0]]++
	}
	return n
}

func TestRecord(t *testing.T) {
	w, err := pgtest.ParseWorkload(recordWorkload)
	require.NoError(t, err)
	for _, major := range testMajors(t) {
		t.Run(strconv.Itoa(major), func(t *testing.T) {
			s := pgtest.Shared(t, major)
			db := pgtest.NewDatabase(t, s)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			caps, err := pgtest.Record(ctx, s.ConnString(db), w, pgtest.RecordOptions{})
			require.NoError(t, err)
			checkCaptures(t, major, caps)
		})
	}
}

func checkCaptures(t *testing.T, major int, caps []pgtest.Capture) {
	t.Helper()
	byName := map[string]map[byte]int{}
	for _, c := range caps {
		byName[c.Variant.Name] = countTypes(c)
		require.Contains(t, c.Header, "PostgreSQL "+strconv.Itoa(major))
		require.Contains(t, c.Header, "CREATE TABLE t")
		t.Logf("%s: %d messages %v", c.Variant.Name, len(c.Records), byName[c.Variant.Name])
	}
	want := []string{"plain", "stream-v2", "stream-v3-2pc"}
	if major >= 16 {
		want = append(want, "stream-v4-parallel")
	}
	require.Len(t, caps, len(want))
	plain := byName["plain"]
	require.Zero(t, plain['S'], "plain: no Stream Start")
	require.Zero(t, plain['P']+plain['K']+plain['b'], "plain: no two-phase messages")
	require.Equal(t, 5, plain['C'], "plain: five committed transactions")
	require.Equal(t, 1, plain['M'], "plain: the logical message")
	require.Equal(t, 2000+1+1+1000+1000+1000, plain['I'], "plain: committed inserts only")
	for _, name := range want[1:] {
		got := byName[name]
		require.NotZero(t, got['S'], "%s: Stream Start", name)
		require.Equal(t, got['S'], got['E'], "%s: as many Stream Stop as Stream Start", name)
		require.NotZero(t, got['A'], "%s: the streamed subtransaction's Stream Abort", name)
		require.Equal(t, 1, got['M'], "%s: the logical message", name)
		if name == "stream-v3-2pc" {
			require.Equal(t, 1, got['p']+got['P'], "%s: the prepare", name)
			require.Equal(t, 1, got['K'], "%s: Commit Prepared", name)
			require.Equal(t, plain['C'], got['C']+got['c']+got['K'], "%s: every transaction ends", name)
		} else {
			require.Zero(t, got['p']+got['P']+got['K'], "%s: no two-phase messages", name)
			require.Equal(t, plain['C'], got['C']+got['c'], "%s: every transaction ends", name)
		}
	}
}

// TestRecordSessionWorkMem checks that the session SET of logical_decoding_work_mem reaches the
// SQL decoding functions: with the server's setting at 64MB nothing would be streamed.
func TestRecordSessionWorkMem(t *testing.T) {
	pgtest.Majors(t)
	in := pgtest.FindInstalls()[0]
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s, err := pgtest.Start(ctx, in, pgtest.Options{Settings: map[string]string{"logical_decoding_work_mem": "64MB"}})
	require.NoError(t, err)
	defer s.Stop()
	w, err := pgtest.ParseWorkload(recordWorkload)
	require.NoError(t, err)
	caps, err := pgtest.Record(ctx, s.ConnString("postgres"), w, pgtest.RecordOptions{})
	require.NoError(t, err)
	checkCaptures(t, in.Major, caps)

	// Same server, no setup: a workload under 64MB is not streamed at 64MB.
	w2, err := pgtest.ParseWorkload("INSERT INTO t SELECT g, 'z' FROM generate_series(100001, 101000) g;")
	require.NoError(t, err)
	large, err := pgtest.Record(ctx, s.ConnString("postgres"), w2, pgtest.RecordOptions{WorkMem: "64MB", Variants: pgtest.Variants[1:2]})
	require.NoError(t, err)
	require.Zero(t, countTypes(large[0])['S'])
	require.Contains(t, large[0].Header, "logical_decoding_work_mem = 64MB")
}

func TestRecordOpenTransaction(t *testing.T) {
	s := pgtest.Shared(t, pgtest.Majors(t)[0])
	db := pgtest.NewDatabase(t, s)
	w, err := pgtest.ParseWorkload("CREATE TABLE u (id int);\nBEGIN;\nINSERT INTO u VALUES (1);\n")
	require.NoError(t, err)
	_, err = pgtest.Record(context.Background(), s.ConnString(db), w, pgtest.RecordOptions{})
	require.ErrorIs(t, err, pgtest.ErrWorkload)
}

func TestRecordUnsupported(t *testing.T) {
	s := pgtest.Shared(t, 15)
	db := pgtest.NewDatabase(t, s)
	w, err := pgtest.ParseWorkload("SELECT 1;")
	require.NoError(t, err)
	_, err = pgtest.Record(context.Background(), s.ConnString(db), w, pgtest.RecordOptions{Variants: pgtest.Variants[3:]})
	require.ErrorIs(t, err, pgtest.ErrUnsupported)
	_, err = pgtest.Record(context.Background(), s.ConnString(db), w, pgtest.RecordOptions{Immediate: true})
	require.ErrorIs(t, err, pgtest.ErrUnsupported)
}

func TestMapDiff(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want map[int]string
		limit     int
		diff      []string
	}{
		{name: "equal", got: map[int]string{1: "a"}, want: map[int]string{1: "a"}},
		{name: "both empty"},
		{name: "each kind", got: map[int]string{1: "a", 2: "x", 4: "d"}, want: map[int]string{1: "a", 2: "b", 3: "c"},
			diff: []string{"2: got x, want b", "extra 4 (got d)", "missing 3 (want c)"}},
		{name: "cut at the limit", got: map[int]string{}, want: map[int]string{1: "a", 2: "b", 3: "c"}, limit: 2,
			diff: []string{"missing 1 (want a)", "missing 2 (want b)", "... and 1 more"}},
		{name: "under the limit", got: map[int]string{1: "a"}, want: map[int]string{}, limit: 2,
			diff: []string{"extra 1 (got a)"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.diff, pgtest.MapDiff(c.got, c.want, c.limit))
		})
	}
}
