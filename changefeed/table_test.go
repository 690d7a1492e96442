package changefeed_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// TestTableStore: the handler's writes in Tx and the position commit together; a unit whose
// connection dies before its commit (the backend terminated) leaves neither, and the next unit
// connects again; a second store for the same slot waits in Load until the first is closed.
func TestTableStore(t *testing.T) {
	eachMajor(t, func(t *testing.T, srv *pgtest.Server) {
		ctx := pgtest.Context(t, time.Minute)
		dsn := srv.ConnString(pgtest.NewDatabase(t, srv))
		pgtest.ExecAll(t, dsn, `CREATE TABLE out (id int PRIMARY KEY)`)
		s, err := changefeed.OpenTableStore(ctx, changefeed.TableConfig{ConnString: dsn, Schema: "public", Table: "Pos Ition"})
		require.NoError(t, err)
		defer s.Close()
		_, ok, err := s.Load(ctx, "s")
		require.NoError(t, err)
		require.False(t, ok)

		count := func() (rows int, pos changefeed.Position, ok bool) {
			t.Helper()
			conn, err := pgx.Connect(ctx, dsn)
			require.NoError(t, err)
			defer conn.Close(ctx)
			require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM out").Scan(&rows))
			var end string
			err = conn.QueryRow(ctx, `SELECT system_id, copy_done, end_lsn::text, state FROM "Pos Ition" WHERE slot = 's'`).
				Scan(&pos.SystemID, &pos.CopyDone, &end, &pos.State)
			if err == pgx.ErrNoRows {
				return rows, pos, false
			}
			require.NoError(t, err)
			require.NoError(t, pos.EndLSN.UnmarshalText([]byte(end)))
			pos.Slot = "s"
			return rows, pos, true
		}
		write := func(id int) (changefeed.Unit, pgx.Tx) {
			t.Helper()
			u, err := s.Begin(ctx, changefeed.StreamWorker)
			require.NoError(t, err)
			tx := changefeed.Tx(&changefeed.Batch{Unit: u})
			require.NotNil(t, tx)
			_, err = tx.Exec(ctx, "INSERT INTO out VALUES ($1)", id)
			require.NoError(t, err)
			return u, tx
		}

		u, _ := write(1)
		require.NoError(t, u.Commit(ctx, &samplePos))
		n, pos, ok := count()
		require.True(t, ok)
		require.Equal(t, 1, n)
		require.Equal(t, samplePos, pos)

		u, tx := write(2)
		var pid int
		require.NoError(t, tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
		pgtest.ExecAll(t, dsn, "SELECT pg_terminate_backend("+strconv.Itoa(pid)+", 10000)")
		next := samplePos
		next.EndLSN++
		require.Error(t, u.Commit(ctx, &next))
		u.Rollback(ctx)
		n, pos, _ = count()
		require.Equal(t, 1, n, "the handler's write is gone with its unit")
		require.Equal(t, samplePos, pos, "and so is the position")

		u, _ = write(3) // a new connection
		require.NoError(t, u.Commit(ctx, &next))
		n, pos, _ = count()
		require.Equal(t, 2, n)
		require.Equal(t, next, pos)

		// A second store for the slot waits for the first.
		s2, err := changefeed.OpenTableStore(ctx, changefeed.TableConfig{ConnString: dsn, Table: "Pos Ition"})
		require.NoError(t, err)
		defer s2.Close()
		short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		_, _, err = s2.Load(short, "s")
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.NoError(t, s.Close())
		s3, err := changefeed.OpenTableStore(ctx, changefeed.TableConfig{ConnString: dsn, Table: "Pos Ition"})
		require.NoError(t, err)
		defer s3.Close()
		got, ok, err := s3.Load(ctx, "s")
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, next, got)
	})
}

// TestTableStoreSession: the store's connections pin their session settings whatever the
// database says. A database that ends idle sessions after a second does not end the stream's
// connection (which holds the slot's lock), and one whose lock_timeout is 10ms does not stop a
// second store from waiting in Load; values read as the stream's; the handler's search_path is
// the database's own. A connection string that does not parse is an error without its password,
// and a configuration pgx.ParseConfig did not make is an error, not a panic.
func TestTableStoreSession(t *testing.T) {
	ctx := context.Background()
	_, err := changefeed.OpenTableStore(ctx, changefeed.TableConfig{ConnString: "host=/tmp password=Secret9x port=abc"})
	require.ErrorIs(t, err, changefeed.ErrInvalidConfig)
	require.NotContains(t, err.Error(), "Secret9x")
	_, err = changefeed.OpenTableStore(ctx, changefeed.TableConfig{ConnConfig: &pgx.ConnConfig{}})
	require.ErrorIs(t, err, changefeed.ErrInvalidConfig)

	eachMajor(t, func(t *testing.T, srv *pgtest.Server) {
		ctx := pgtest.Context(t, time.Minute)
		db := pgtest.NewDatabase(t, srv)
		dsn := srv.ConnString(db)
		pgtest.ExecAll(t, dsn, `CREATE SCHEMA app`, `CREATE TABLE app.out (id int PRIMARY KEY)`,
			`ALTER DATABASE `+db+` SET search_path = app, public`, `ALTER DATABASE `+db+` SET idle_session_timeout = '1s'`,
			`ALTER DATABASE `+db+` SET lock_timeout = '10ms'`, `ALTER DATABASE `+db+` SET DateStyle = 'SQL, DMY'`)
		s, err := changefeed.OpenTableStore(ctx, changefeed.TableConfig{ConnString: dsn})
		require.NoError(t, err)
		defer s.Close()
		_, _, err = s.Load(ctx, "s")
		require.NoError(t, err)
		// Idle for longer than idle_session_timeout: a session opened after the store's last
		// statement, with the database's settings, has been ended by the timeout.
		idle, err := pgx.Connect(ctx, dsn)
		require.NoError(t, err)
		defer idle.Close(context.Background())
		idlePID := idle.PgConn().PID()
		pgtest.Eventually(t, 30*time.Second, "idle_session_timeout to end an idle session", func() bool {
			return pgtest.Count(t, srv.ConnString("postgres"), `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, idlePID) == 0
		})
		u, err := s.Begin(ctx, changefeed.StreamWorker)
		require.NoError(t, err)
		tx := changefeed.Tx(&changefeed.Batch{Unit: u})
		_, err = tx.Exec(ctx, "INSERT INTO out VALUES (1)") // app.out, in the database's search_path
		require.NoError(t, err)
		var date, path, app string
		require.NoError(t, tx.QueryRow(ctx, "SELECT '2024-03-04'::date::text, current_setting('search_path'), "+
			"current_setting('application_name')").Scan(&date, &path, &app))
		require.Equal(t, []string{"2024-03-04", "app, public", "pgreorder-changefeed"}, []string{date, path, app})
		require.NoError(t, u.Commit(ctx, &samplePos))

		s2, err := changefeed.OpenTableStore(ctx, changefeed.TableConfig{ConnString: dsn})
		require.NoError(t, err)
		defer s2.Close()
		short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		_, _, err = s2.Load(short, "s")
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded, "waits for the first store, past lock_timeout")
	})
}
