package target

import (
	"sync/atomic"

	"github.com/pgreorder/pgreorder/apply/internal/detect"
	"github.com/pgreorder/pgreorder/decoding"
)

// Counters are the counters the target connections add to: rows, statements, round
// trips, conflicts and prepared statements.
type Counters struct {
	Inserts, InsertsViaCopy, Updates, Deletes, Truncates atomic.Int64
	InitialCopyRows                                      atomic.Int64
	Statements, RoundTrips                               atomic.Int64
	Conflicts                                            detect.ConflictCounts
	AppliedLSN                                           atomic.Uint64

	// Statements prepared on the target connections: the most one connection held at once,
	// and how many times one was prepared.
	PreparedMost, Prepares atomic.Int64
}

// preparedPeak records n statements prepared on one connection.
func (c *Counters) preparedPeak(n int64) {
	for {
		old := c.PreparedMost.Load()
		if n <= old || c.PreparedMost.CompareAndSwap(old, n) {
			return
		}
	}
}

// rowCounts are the counters of rows and statements applied in one target transaction, added
// to the counters once it commits.
type rowCounts struct{ inserts, insertsViaCopy, updates, deletes, truncates int64 }

func (r *rowCounts) add(o rowCounts) {
	r.inserts += o.inserts
	r.insertsViaCopy += o.insertsViaCopy
	r.updates += o.updates
	r.deletes += o.deletes
	r.truncates += o.truncates
}

// count adds the rows of a target transaction that committed.
func (c *Counters) count(r rowCounts) {
	c.Inserts.Add(r.inserts)
	c.InsertsViaCopy.Add(r.insertsViaCopy)
	c.Updates.Add(r.updates)
	c.Deletes.Add(r.deletes)
	c.Truncates.Add(r.truncates)
}

// Applied records that a transaction ending at end committed on the target.
func (c *Counters) Applied(end decoding.LSN) {
	for {
		old := c.AppliedLSN.Load()
		if uint64(end) <= old || c.AppliedLSN.CompareAndSwap(old, uint64(end)) {
			return
		}
	}
}
