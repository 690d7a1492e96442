package changefeed_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

var syncPos = changefeed.Position{Slot: "s", SystemID: "7", CopyDone: true, EndLSN: 0x5000, State: []byte("12"),
	Tables: []uint32{16384, 16402}, Sync: &changefeed.TableSync{Table: changefeed.TableRef{OID: 16410, Schema: "my schema", Name: "T\nlate"}, From: 0x5000}}

// TestFileStoreTables: the position file keeps the known tables and the table whose copy began
// (version 2 of the file), and a position with neither is written as version 1, which loads
// with neither.
func TestFileStoreTables(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "pos")
	for _, want := range []changefeed.Position{syncPos, {Slot: "s", SystemID: "7", CopyDone: true, EndLSN: 0x6000, Tables: []uint32{}},
		{Slot: "s", SystemID: "7", CopyDone: true, EndLSN: 0x7000}} {
		s := mustOpen(t, path)
		u, err := s.Begin(ctx, changefeed.StreamWorker)
		require.NoError(t, err)
		require.NoError(t, u.Commit(ctx, &want))
		require.NoError(t, s.Close())
		got, ok, err := mustOpen(t, path).Load(ctx, "s")
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, want, got)
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		version := "v2"
		if want.Tables == nil && want.Sync == nil {
			version = "v1"
		}
		require.True(t, strings.HasPrefix(string(b), "pgreorder changefeed position "+version+"\n"), string(b))
	}
}

// TestTableStoreTables: a position table made by an earlier release (without the tables and
// sync columns) gets them, its row loads with neither, and the new fields round-trip.
func TestTableStoreTables(t *testing.T) {
	srv := pgtest.Shared(t, 18)
	ctx := pgtest.Context(t, time.Minute)
	dsn := srv.ConnString(pgtest.NewDatabase(t, srv))
	pgtest.ExecAll(t, dsn, `CREATE TABLE pgreorder_changefeed_position (slot text PRIMARY KEY, system_id text NOT NULL, copy_done boolean NOT NULL, end_lsn pg_lsn NOT NULL, state bytea)`,
		`INSERT INTO pgreorder_changefeed_position VALUES ('s', '7', true, '0/4000', '\x3132')`)
	open := func() *changefeed.TableStore {
		s, err := changefeed.OpenTableStore(ctx, changefeed.TableConfig{ConnString: dsn})
		require.NoError(t, err)
		return s
	}
	s := open()
	got, ok, err := s.Load(ctx, "s")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, changefeed.Position{Slot: "s", SystemID: "7", CopyDone: true, EndLSN: 0x4000, State: []byte("12")}, got)
	require.NoError(t, s.Close())
	for _, want := range []changefeed.Position{syncPos, {Slot: "s", SystemID: "7", CopyDone: true, EndLSN: 0x6000, Tables: []uint32{}}} {
		s := open()
		_, _, err := s.Load(ctx, "s")
		require.NoError(t, err)
		u, err := s.Begin(ctx, changefeed.StreamWorker)
		require.NoError(t, err)
		require.NoError(t, u.Commit(ctx, &want))
		require.NoError(t, s.Close())
		s = open()
		got, ok, err := s.Load(ctx, "s")
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, want, got)
		require.NoError(t, s.Close())
	}
}
