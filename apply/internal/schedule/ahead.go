package schedule

import (
	"fmt"
	"slices"

	"github.com/pgreorder/pgreorder/decoding"
)

// Span is a run of consecutive source transactions committed in one target transaction, named
// by the end LSNs of its first and last (equal for one transaction). The stream hands out
// committed transactions in commit order, and a run takes the transactions it hands out one after
// another: every transaction handed out with an end LSN from First to Last is one of the span's.
type Span struct {
	First, Last decoding.LSN
}

// Ahead is a set of source transactions committed on the target ahead of the committed prefix
// (relaxed commit order), as spans: what a worker records with each of its commits, and what a
// session that starts after a crash must not apply again. The zero value is empty.
type Ahead struct {
	spans []Span // in the order added
}

// Add adds sp.
func (a *Ahead) Add(sp Span) { a.spans = append(a.spans, sp) }

// Prune forgets the spans that end at or before prefix: a prefix that covers them records them.
func (a *Ahead) Prune(prefix decoding.LSN) {
	a.spans = slices.DeleteFunc(a.spans, func(sp Span) bool { return sp.Last <= prefix })
}

// Contains says whether a transaction ending at end is in one of the spans.
func (a *Ahead) Contains(end decoding.LSN) bool {
	for _, sp := range a.spans {
		if sp.First <= end && end <= sp.Last {
			return true
		}
	}
	return false
}

// Spans returns the spans, in the order added. The slice is a's until the next Add or Prune.
func (a *Ahead) Spans() []Span { return a.spans }

// Flat returns the spans as pairs of end LSNs (first, last), one after the other.
func (a *Ahead) Flat() []decoding.LSN {
	out := make([]decoding.LSN, 0, 2*len(a.spans))
	for _, sp := range a.spans {
		out = append(out, sp.First, sp.Last)
	}
	return out
}

// AddFlat adds the spans of pairs, as Flat returns them; an odd last position is an error.
func (a *Ahead) AddFlat(pairs []decoding.LSN) error {
	if len(pairs)%2 != 0 {
		return fmt.Errorf("apply: %d positions, not pairs of a span's first and last", len(pairs))
	}
	for i := 0; i < len(pairs); i += 2 {
		a.Add(Span{First: pairs[i], Last: pairs[i+1]})
	}
	return nil
}

// Len returns the number of spans.
func (a *Ahead) Len() int { return len(a.spans) }
