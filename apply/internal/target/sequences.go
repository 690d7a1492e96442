package target

import (
	"context"
	"fmt"

	"github.com/pgreorder/pgreorder/internal/pgsession"
)

// MissingSequenceError is SyncSequences's error for a sequence of the source that the target
// lacks.
type MissingSequenceError struct {
	Sequence string // schema-qualified, quoted
}

func (e *MissingSequenceError) Error() string {
	return "sequence " + e.Sequence + " (owned by a published table's column on the source) does not exist on the target"
}

// SyncSequences moves the target's sequences forward to the source's values, seqs being the rows
// of OwnedSequencesQuery read from the source: a sequence the source never used (no value) is
// left out. after is called with each sequence handled (quoted), its value, and whether it
// moved. It returns how many moved, and stops at the first error: a *MissingSequenceError for a
// sequence the target lacks, or after's.
func (t *Conn) SyncSequences(ctx context.Context, seqs [][][]byte, after func(seq, value string, moved bool) error) (moved int, err error) {
	for _, s := range seqs {
		if s[2] == nil {
			continue // never used on the source
		}
		ns, name, value := string(s[0]), string(s[1]), string(s[2])
		seq := pgsession.QuoteQualified(ns, name)
		found, set, err := t.SetSequence(ctx, ns, name, value)
		switch {
		case err != nil && !found: // looking the sequence up
			return moved, err
		case err != nil:
			return moved, fmt.Errorf("sequence %s: %w", seq, err)
		case !found:
			return moved, &MissingSequenceError{Sequence: seq}
		}
		if set {
			moved++
		}
		if err := after(seq, value, set); err != nil {
			return moved, err
		}
	}
	return moved, nil
}

// SetSequence moves the target's sequence of schema ns and name forward to value, the source's
// last value (as text): only forward, so that the target's next value is not below the source's
// next one. found says whether the target has such a sequence (an error with found false is of
// the lookup, with found true of the setval), set whether it moved.
func (t *Conn) SetSequence(ctx context.Context, ns, name, value string) (found, set bool, err error) {
	rows, err := Query(ctx, t.pg, `SELECT c.oid::text FROM pg_catalog.pg_class c
			JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind = 'S'`, ns, name)
	if err != nil || len(rows) == 0 {
		return false, false, err
	}
	oid := string(rows[0][0])
	rows, err = Query(ctx, t.pg, `SELECT pg_catalog.setval($1::oid::pg_catalog.regclass, $2::bigint, true)
			FROM `+pgsession.QuoteQualified(ns, name)+` cur, pg_catalog.pg_sequence ps WHERE ps.seqrelid = $1::oid AND CASE WHEN ps.seqincrement > 0
			THEN cur.last_value < $2::bigint OR (NOT cur.is_called AND cur.last_value = $2::bigint)
			ELSE cur.last_value > $2::bigint OR (NOT cur.is_called AND cur.last_value = $2::bigint) END`, oid, value)
	if err != nil {
		return true, false, err
	}
	return true, len(rows) == 1, nil
}

// OwnedSequencesQuery lists the sequences owned by columns of the tables of the publications
// ($1), serial and identity columns alike, with their last value (NULL before the first
// nextval).
const OwnedSequencesQuery = `SELECT DISTINCT sn.nspname, s.relname, pg_catalog.pg_sequence_last_value(s.oid)::text
FROM pg_catalog.pg_publication_tables pt
	JOIN pg_catalog.pg_namespace tn ON tn.nspname = pt.schemaname
	JOIN pg_catalog.pg_class tc ON tc.relnamespace = tn.oid AND tc.relname = pt.tablename
	JOIN pg_catalog.pg_depend d ON d.refclassid = 'pg_catalog.pg_class'::pg_catalog.regclass AND d.refobjid = tc.oid
		AND d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND d.deptype IN ('a', 'i')
	JOIN pg_catalog.pg_class s ON s.oid = d.objid AND s.relkind = 'S'
	JOIN pg_catalog.pg_namespace sn ON sn.oid = s.relnamespace
WHERE pt.pubname = ANY ($1::text[])
ORDER BY 1, 2`
