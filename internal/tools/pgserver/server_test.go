package pgserver_test

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/internal/tools/pgserver"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestStartAnnounces: Start says where it creates the server's folder before it does, and the
// folder is gone after Stop. The server keeps the production defaults DefaultSettings leaves
// alone.
func TestStartAnnounces(t *testing.T) {
	pgtest.Majors(t) // skips (or fails with PGREORDER_REQUIRE_PG=1) without servers
	in := pgserver.FindInstalls()[0]
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var log bytes.Buffer
	s, err := pgserver.Start(ctx, in, pgserver.Options{CreateUser: true, Log: &log})
	require.NoError(t, err)
	defer s.Stop()
	require.Contains(t, log.String(), "creating folder "+s.SocketDir()+" ")
	if os.Geteuid() == 0 {
		require.Contains(t, log.String(), "owned by user "+pgserver.ServerUser)
	}
	require.True(t, strings.HasSuffix(log.String(), "\n"))

	conn := pgtest.Connect(t, s.ConnString("postgres"))
	for name, want := range map[string]string{
		"wal_sender_timeout":   "1min", // the disconnect a slow consumer meets
		"wal_receiver_timeout": "1min",
		"synchronous_commit":   "on",
		"wal_level":            "logical",
	} {
		res := pgtest.MustExec(t, conn, "SHOW "+name)
		require.Equal(t, want, string(res[0].Rows[0][0]), name)
	}
	require.NoError(t, s.Stop())
	require.NoDirExists(t, s.SocketDir())
}

// TestStartBadInstall: an install without binaries is refused before anything is changed on
// the system (no folder, no user).
func TestStartBadInstall(t *testing.T) {
	dir := t.TempDir()
	in := pgserver.Install{Major: 18, Version: "18.0", BinDir: dir}
	var log bytes.Buffer
	_, err := pgserver.Start(context.Background(), in, pgserver.Options{CreateUser: true, Log: &log})
	var se *pgserver.StartError
	require.ErrorAs(t, err, &se)
	require.ErrorIs(t, err, pgserver.ErrNotInstalled)
	require.Equal(t, in, se.Install)
	require.Empty(t, log.String())
}
