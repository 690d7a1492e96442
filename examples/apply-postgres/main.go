// Command apply-postgres replicates a publication into another PostgreSQL database with pgreorder:
// one target transaction per source transaction, acknowledged to the source only after the target
// commit, resumable after a crash without loss or duplicates.
//
//	apply-postgres -source 'host=... dbname=src' -target 'host=... dbname=dst' -slot app -publication pub -create-slot
//
// The target's tables must exist with the same names and columns. Exactly-once comes from a
// progress table in the target, updated in the same transaction as the rows:
//
//	pgreorder_apply_progress(slot text PRIMARY KEY, end_lsn pg_lsn)
//
// On start (and after every reconnect) the end_lsn stored there is passed to replication.Start as
// Buffer.SkipThrough: the stream resumes after the last applied transaction and drops anything
// the server sends again that ends at or before it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/replication"
)

// config is one replication job.
type config struct {
	source, target string
	slot           string
	publications   []string
	createSlot     bool
	workMem        int64
	statusInterval time.Duration
	log            *slog.Logger

	// hook, when set, runs at each stage of applying a transaction ("begin", "before-commit",
	// "after-commit"); an error returned by it aborts the run as a crash would. Tests use it to
	// inject faults.
	hook func(ctx context.Context, stage string, t *reorderbuffer.Txn) error
}

func main() {
	var c config
	fs := flag.CommandLine
	fs.StringVar(&c.source, "source", "", "source database connection string")
	fs.StringVar(&c.target, "target", "", "target database connection string")
	fs.StringVar(&c.slot, "slot", "", "replication slot on the source")
	pub := fs.String("publication", "", "publication(s) on the source, comma-separated")
	fs.BoolVar(&c.createSlot, "create-slot", false, "create the slot if it does not exist")
	fs.Int64Var(&c.workMem, "work-mem", 64<<20, "reorder buffer memory limit in bytes")
	flag.Parse()
	if c.source == "" || c.target == "" || c.slot == "" || *pub == "" {
		flag.Usage()
		os.Exit(2)
	}
	c.publications = strings.Split(*pub, ",")
	c.log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := runWithRetry(ctx, c); err != nil && ctx.Err() == nil {
		c.log.Error("stopped", "err", err)
		os.Exit(1)
	}
}

// runWithRetry runs the job, starting again after connection failures (a terminated walsender,
// a restarted server) until ctx is done. Errors in applying a change are not retried.
func runWithRetry(ctx context.Context, c config) error {
	for {
		err := run(ctx, c)
		if ctx.Err() != nil || !retryable(err) {
			return err
		}
		c.log.Warn("replication interrupted; resuming", "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		c.createSlot = false
	}
}

// applyError is an error of the target that restarting will not fix.
type applyError struct{ err error }

func (e *applyError) Error() string { return e.err.Error() }
func (e *applyError) Unwrap() error { return e.err }

func retryable(err error) bool {
	var ae *applyError
	return err != nil && !errors.As(err, &ae)
}

// run applies transactions until ctx is done or an error occurs.
func run(ctx context.Context, c config) (err error) {
	target, err := pgx.Connect(ctx, c.target)
	if err != nil {
		return err
	}
	defer target.Close(context.WithoutCancel(ctx))
	if _, err := target.Exec(ctx, `CREATE TABLE IF NOT EXISTS pgreorder_apply_progress (
		slot text PRIMARY KEY, end_lsn pg_lsn NOT NULL)`); err != nil {
		return err
	}
	var resume decoding.LSN
	err = target.QueryRow(ctx, `SELECT end_lsn::text FROM pgreorder_apply_progress WHERE slot = $1`, c.slot).Scan(&resume)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return err
	}
	s, err := replication.Start(ctx, replication.Config{
		ConnString:     c.source,
		Slot:           c.slot,
		Publications:   c.publications,
		CreateSlot:     c.createSlot,
		StatusInterval: c.statusInterval,
		Buffer:         reorderbuffer.Config{WorkMem: c.workMem, SkipThrough: resume},
		Logger:         c.log,
	})
	if err != nil {
		return err
	}
	defer func() {
		cerr := s.Close(context.WithoutCancel(ctx))
		if err == nil {
			err = cerr
		}
	}()
	c.log.Info("applying", "slot", c.slot, "resume_after", resume)
	for {
		t, err := s.Next(ctx)
		if err != nil {
			return err
		}
		if t.NonTransactional {
			s.Ack(t) // nothing to apply
			continue
		}
		if err := applyTxn(ctx, target, c, t); err != nil {
			return err
		}
		// Only now is t durable in the target: the source may forget it.
		if c.hook != nil {
			if err := c.hook(ctx, "after-commit", t); err != nil {
				return err
			}
		}
		s.Ack(t)
	}
}

// applyTxn applies t in one target transaction, together with the progress row.
func applyTxn(ctx context.Context, target *pgx.Conn, c config, t *reorderbuffer.Txn) error {
	if c.hook != nil {
		if err := c.hook(ctx, "begin", t); err != nil {
			return err
		}
	}
	tx, err := target.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	for m, err := range t.Changes() {
		if err != nil {
			return err
		}
		if err := applyChange(ctx, tx, t, m); err != nil {
			return &applyError{fmt.Errorf("transaction %d (commit %s): %w", t.Xid, t.CommitLSN, err)}
		}
	}
	if _, err := tx.Exec(ctx, `INSERT INTO pgreorder_apply_progress (slot, end_lsn) VALUES ($1, $2::text::pg_lsn)
		ON CONFLICT (slot) DO UPDATE SET end_lsn = excluded.end_lsn`, c.slot, t.EndLSN.String()); err != nil {
		return err
	}
	if c.hook != nil {
		if err := c.hook(ctx, "before-commit", t); err != nil {
			return err
		}
	}
	return tx.Commit(ctx)
}

// applyChange applies one change. Values travel in text format with unspecified parameter types,
// so the server converts them exactly as it would the publisher's output.
func applyChange(ctx context.Context, tx pgx.Tx, t *reorderbuffer.Txn, m decoding.Message) error {
	var (
		sql  strings.Builder
		args [][]byte
		want int64 = 1
	)
	param := func(v []byte) string {
		args = append(args, v)
		return fmt.Sprintf("$%d", len(args))
	}
	rel := func(id uint32) (*decoding.Relation, error) {
		r, ok := t.Relation(id)
		if !ok {
			return nil, fmt.Errorf("change for unknown relation %d", id)
		}
		return r, nil
	}
	// where appends the row-identifying condition from a key or old tuple.
	where := func(r *decoding.Relation, tup decoding.Tuple, full bool) error {
		sql.WriteString(" WHERE ")
		n := 0
		for i, col := range r.Columns {
			if i >= len(tup) || (!full && !col.IsKey()) || tup[i].Kind == decoding.ColumnUnchanged {
				continue
			}
			if n > 0 {
				sql.WriteString(" AND ")
			}
			n++
			if tup[i].Kind == decoding.ColumnNull {
				sql.WriteString(ident(col.Name) + " IS NULL")
			} else {
				sql.WriteString(ident(col.Name) + " = " + param(tup[i].Data))
			}
		}
		if n == 0 {
			return fmt.Errorf("%s has no replica identity", qualified(r))
		}
		return nil
	}
	switch m := m.(type) {
	case *decoding.Insert:
		r, err := rel(m.RelationID)
		if err != nil {
			return err
		}
		var cols, vals []string
		for i, c := range m.New {
			cols = append(cols, ident(r.Columns[i].Name))
			vals = append(vals, param(value(c)))
		}
		fmt.Fprintf(&sql, "INSERT INTO %s (%s) VALUES (%s)", qualified(r), strings.Join(cols, ", "), strings.Join(vals, ", "))
	case *decoding.Update:
		r, err := rel(m.RelationID)
		if err != nil {
			return err
		}
		var sets []string
		for i, c := range m.New {
			if c.Kind != decoding.ColumnUnchanged {
				sets = append(sets, ident(r.Columns[i].Name)+" = "+param(value(c)))
			}
		}
		fmt.Fprintf(&sql, "UPDATE %s SET %s", qualified(r), strings.Join(sets, ", "))
		key := m.New
		if m.OldKind != 0 {
			key = m.Old
		}
		if err := where(r, key, m.OldKind == 'O'); err != nil {
			return err
		}
	case *decoding.Delete:
		r, err := rel(m.RelationID)
		if err != nil {
			return err
		}
		fmt.Fprintf(&sql, "DELETE FROM %s", qualified(r))
		if err := where(r, m.Old, m.OldKind == 'O'); err != nil {
			return err
		}
	case *decoding.Truncate:
		var names []string
		for _, id := range m.RelationIDs {
			r, err := rel(id)
			if err != nil {
				return err
			}
			names = append(names, qualified(r))
		}
		sql.WriteString("TRUNCATE " + strings.Join(names, ", "))
		if m.Options&decoding.TruncateRestartIdentity != 0 {
			sql.WriteString(" RESTART IDENTITY")
		}
		if m.Options&decoding.TruncateCascade != 0 {
			sql.WriteString(" CASCADE")
		}
		want = -1
	default:
		return nil // schema and logical messages: nothing to apply
	}
	tag, err := tx.Conn().PgConn().ExecParams(ctx, sql.String(), args, nil, nil, nil).Close()
	if err != nil {
		return fmt.Errorf("%s: %w", sql.String(), err)
	}
	if want >= 0 && tag.RowsAffected() != want {
		return fmt.Errorf("%s: %d rows affected, want %d: the target has diverged", sql.String(), tag.RowsAffected(), want)
	}
	return nil
}

func value(c decoding.Column) []byte {
	if c.Kind == decoding.ColumnNull {
		return nil
	}
	if c.Data == nil {
		return []byte{} // an empty text value, not NULL
	}
	return c.Data
}

func ident(s string) string { return pgx.Identifier{s}.Sanitize() }

func qualified(r *decoding.Relation) string {
	ns := r.Namespace
	if ns == "" {
		ns = "pg_catalog"
	}
	return pgx.Identifier{ns, r.Name}.Sanitize()
}
