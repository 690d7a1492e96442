package pgserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// StandbyOptions configures StartStandby.
type StandbyOptions struct {
	// Slot is the physical replication slot of the primary the standby streams through
	// (primary_slot_name); StartStandby creates it. Required: a-z, 0-9 and '_'.
	Slot string
	// Settings are settings of the standby (GUCs) besides those it copies from the primary,
	// overriding them: {"hot_standby_feedback": "on", "sync_replication_slots": "on"}.
	Settings map[string]string
	// Log, when not nil, receives a line for each change made to the system (see Options.Log).
	Log io.Writer
}

// skipContents are the folders of a data directory whose contents a base backup leaves out
// (the folders themselves are made empty): WAL, which the standby streams from the slot, the
// primary's replication slots, and what the server rebuilds at start.
var skipContents = map[string]bool{
	"pg_wal": true, "pg_replslot": true, "pg_stat_tmp": true, "pg_dynshmem": true, "pg_notify": true,
	"pg_serial": true, "pg_snapshots": true, "pg_subtrans": true,
}

// skipFiles are the files of a data directory a base backup leaves out, wherever they are.
var skipFiles = map[string]bool{
	"postmaster.pid": true, "postmaster.opts": true, "pg_internal.init": true, "backup_label": true,
	"tablespace_map": true, "current_logfiles": true, "standby.signal": true, "recovery.signal": true,
}

// StartStandby makes a physical standby of s, a running server, and starts it: it creates
// opts.Slot on s (reserving WAL at once), copies s's data directory between pg_backup_start and
// pg_backup_stop (PostgreSQL's low-level base backup, so it needs no pg_basebackup program),
// writes the backup label, primary_conninfo (to s's socket, with dbname=postgres) and
// primary_slot_name, and starts the copy in standby mode on a port of its own, as s's user. It
// returns when the standby accepts connections. The standby is a Server like any other: Stop
// stops it and removes its folder; SELECT pg_promote() makes it a primary.
func (s *Server) StartStandby(ctx context.Context, opts StandbyOptions) (_ *Server, err error) {
	if opts.Slot == "" || strings.Trim(opts.Slot, "abcdefghijklmnopqrstuvwxyz0123456789_") != "" {
		return nil, fmt.Errorf("pgserver: standby slot name %q: want a-z, 0-9 and '_'", opts.Slot)
	}
	if err := Exec(ctx, s.ConnString("postgres"),
		"SELECT pg_create_physical_replication_slot('"+opts.Slot+"', true)"); err != nil {
		return nil, fmt.Errorf("pgserver: creating the standby's slot: %w", err)
	}
	dir, err := newFolder(s.install, opts.Log, s.cred)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	data := filepath.Join(dir, "data")
	if err := s.baseBackup(ctx, data); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, fmt.Errorf("pgserver: %w", err)
	}
	settings := map[string]string{
		"port":                    strconv.Itoa(port),
		"listen_addresses":        "127.0.0.1",
		"unix_socket_directories": dir,
		"primary_conninfo": fmt.Sprintf("host=%s port=%d user=%s dbname=postgres application_name=%s",
			s.dir, s.port, SuperUser, opts.Slot),
		"primary_slot_name": opts.Slot,
	}
	for k, v := range opts.Settings {
		settings[k] = v
	}
	// postgresql.auto.conf is read after postgresql.conf, which holds the primary's port and socket.
	err = appendSettings(filepath.Join(data, "postgresql.auto.conf"), "pgserver standby", settings)
	if err == nil {
		err = s.writeOwned(filepath.Join(data, "standby.signal"), nil)
	}
	if err != nil {
		return nil, fmt.Errorf("pgserver: %w", err)
	}
	if s.cred != nil {
		if err := os.Chown(filepath.Join(data, "postgresql.auto.conf"), int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			return nil, fmt.Errorf("pgserver: %w", err)
		}
	}
	standby := &Server{install: s.install, dir: dir, port: port, cred: s.cred}
	if err := standby.run(ctx); err != nil {
		return nil, err
	}
	return standby, nil
}

// baseBackup copies s's data directory to data between pg_backup_start and pg_backup_stop, and
// writes the backup label pg_backup_stop returns.
func (s *Server) baseBackup(ctx context.Context, data string) error {
	conn, err := pgconn.Connect(ctx, s.ConnString("postgres"))
	if err != nil {
		return fmt.Errorf("pgserver: base backup: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "SELECT pg_backup_start('pgserver standby', true)").ReadAll(); err != nil {
		return fmt.Errorf("pgserver: pg_backup_start: %w", err)
	}
	if err := s.copyData(filepath.Join(s.dir, "data"), data); err != nil {
		return err
	}
	res, err := conn.Exec(ctx, "SELECT labelfile, coalesce(spcmapfile, '') FROM pg_backup_stop(false)").ReadAll()
	if err != nil {
		return fmt.Errorf("pgserver: pg_backup_stop: %w", err)
	}
	if len(res) != 1 || len(res[0].Rows) != 1 {
		return errors.New("pgserver: pg_backup_stop returned no row")
	}
	row := res[0].Rows[0]
	if err := s.writeOwned(filepath.Join(data, "backup_label"), row[0]); err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	if len(row[1]) > 0 {
		if err := s.writeOwned(filepath.Join(data, "tablespace_map"), row[1]); err != nil {
			return fmt.Errorf("pgserver: %w", err)
		}
	}
	return nil
}

// copyData copies the data directory src to dst as a base backup does (see skipContents and
// skipFiles), keeping modes, owned by the server's user. Files that disappear meanwhile (the
// server runs) are skipped: WAL replay from the backup's start makes the copy consistent.
func (s *Server) copyData(src, dst string) error {
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		info, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			if err := os.Mkdir(to, info.Mode().Perm()); err != nil {
				return err
			}
			if err := s.chown(to); err != nil {
				return err
			}
			if skipContents[rel] {
				if rel == "pg_wal" {
					if err := os.Mkdir(filepath.Join(to, "archive_status"), 0o700); err != nil {
						return err
					}
					if err := s.chown(filepath.Join(to, "archive_status")); err != nil {
						return err
					}
				}
				return filepath.SkipDir
			}
			return nil
		case !info.Mode().IsRegular() || skipFiles[d.Name()]:
			return nil
		}
		b, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := os.WriteFile(to, b, info.Mode().Perm()); err != nil {
			return err
		}
		return s.chown(to)
	})
	if err != nil {
		return fmt.Errorf("pgserver: copying the data directory: %w", err)
	}
	return nil
}

// writeOwned writes a file of mode 0600 owned by the server's user.
func (s *Server) writeOwned(path string, b []byte) error {
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return err
	}
	return s.chown(path)
}

func (s *Server) chown(path string) error {
	if s.cred == nil {
		return nil
	}
	return os.Chown(path, int(s.cred.Uid), int(s.cred.Gid))
}

// Promote promotes a standby to a primary (SELECT pg_promote(), which waits until it is done) and
// waits until it accepts writes.
func (s *Server) Promote(ctx context.Context) error {
	if err := Exec(ctx, s.ConnString("postgres"), "SELECT pg_promote(true, 60)"); err != nil {
		return fmt.Errorf("pgserver: promoting: %w", err)
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		conn, err := pgconn.Connect(ctx, s.ConnString("postgres")+" target_session_attrs=read-write")
		if err == nil {
			return conn.Close(ctx)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgserver: waiting for the promoted server to accept writes: %w (last error: %v)", ctx.Err(), err)
		case <-tick.C:
		}
	}
}
