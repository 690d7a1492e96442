// Package jsonl is what remains of the JSON-lines writer before it became the public package
// format: a thin wrapper over format's txn format, kept for code that still imports it, and
// Comparable, which the oracle tests use. New code uses package format.
package jsonl

import (
	"io"
	"time"

	"github.com/pgreorder/pgreorder/format"
	"github.com/pgreorder/pgreorder/reorderbuffer"
)

// TimeFormat is the layout of commit_time.
const TimeFormat = format.TimeFormat

// ErrUnknownRelation is returned for a change whose relation was never described by the stream.
var ErrUnknownRelation = format.ErrUnknownRelation

// Writer writes transactions in the txn format of package format, one JSON object per line,
// each transaction whole or not at all.
type Writer struct {
	w *format.Writer
	// Changes counts the changes written (Relation and Type messages excluded).
	Changes int64
}

// NewWriter returns a Writer to w. Each transaction is written with one Write call when it is
// at most format.DefaultStageBytes long (larger ones are staged in a temporary file and written
// in pieces).
func NewWriter(w io.Writer) *Writer { return &Writer{w: format.NewWriter(w, format.Config{})} }

// WriteTxn reads x's changes and writes x as one line.
func (w *Writer) WriteTxn(x *reorderbuffer.Txn) error {
	err := w.w.WriteTxn(x)
	w.Changes = w.w.Changes()
	return err
}

// FormatTime formats a commit time as the format prints it.
func FormatTime(t time.Time) string { return t.UTC().Format(TimeFormat) }
