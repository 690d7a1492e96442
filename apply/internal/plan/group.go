package plan

import "time"

// The limits of a group of whole transactions applied in one target transaction (Buffered,
// Eager's groups, Parallel's runs and the leader's groups).
const (
	GroupMaxTxns    = 1024
	GroupMaxChanges = 16384
	GroupMaxAge     = 50 * time.Millisecond
)

// Group counts what an open group took: its transactions, its changes, and when it opened.
type Group struct {
	Txns    int
	Changes int
	Opened  time.Time // when the first transaction joined
}

// Open says whether the group has a transaction.
func (g *Group) Open() bool { return g.Txns > 0 }

// Add notes a transaction joining the group at now.
func (g *Group) Add(now time.Time) {
	if g.Txns == 0 {
		g.Opened = now
	}
	g.Txns++
}

// Full says whether the group must commit before it takes another transaction, at now.
func (g *Group) Full(now time.Time) bool {
	return g.Txns >= GroupMaxTxns || g.Changes >= GroupMaxChanges || now.Sub(g.Opened) >= GroupMaxAge
}

// Reset empties the group.
func (g *Group) Reset() { *g = Group{} }
