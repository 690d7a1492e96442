package target

import (
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgreorder/pgreorder/apply/conflict"
	"github.com/pgreorder/pgreorder/apply/internal/detect"
	"github.com/pgreorder/pgreorder/internal/pgsession"
)

// NewTombstones creates the tombstone store through tg, for the conflict configuration cc and
// the configured progress table; the maintainer connects with tg's options.
func NewTombstones(ctx context.Context, tg *Conn, cc *conflict.Config, progressTable string, stats *detect.TombstoneCounters,
	log *slog.Logger) (*detect.Tombstones, error) {
	if cc.TombstoneTable != "" {
		if _, err := ParseQualified(cc.TombstoneTable); err != nil {
			return nil, configError("TombstoneTable: %v", err)
		}
	}
	table, fn, base := TombstoneNames(tg, cc.TombstoneTable, progressTable)
	o := tg.opts
	return detect.NewTombstoneStore(ctx, tg.pg, detect.TombstoneStore{Table: table, Function: fn, KeyIndex: pgsession.QuoteIdent(base + "_key"),
		AtIndex: pgsession.QuoteIdent(base + "_at"), Retention: cc.Retention, Now: o.Now,
		Dial: func(ctx context.Context) (*pgconn.PgConn, error) {
			c, err := Dial(ctx, o, "pgreorder apply "+o.Slot+" tombstones")
			if err != nil {
				return nil, err
			}
			return c.pg, nil
		}}, stats, log)
}

// TombstoneNames returns the quoted, qualified names of the tombstone table and of its trigger
// function, and the table's own name, for the configured tombstone table (conflict.Config's,
// or "") and progress table, and a connection that resolved its names.
func TombstoneNames(tg *Conn, tombstoneTable, progressTable string) (table, fn, base string) {
	var parts []string
	if tombstoneTable != "" {
		parts, _ = ParseQualified(tg.Table(tombstoneTable))
	} else if p, _ := ParseQualified(progressTable); len(p) == 2 {
		parts = []string{p[0], conflict.DefaultTombstoneTable}
	} else {
		parts, _ = ParseQualified(tg.Table(conflict.DefaultTombstoneTable))
	}
	base = parts[len(parts)-1]
	table = pgsession.QuoteQualified(parts...)
	parts[len(parts)-1] = base + "_record"
	return table, pgsession.QuoteQualified(parts...), base
}
