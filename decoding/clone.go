package decoding

import (
	"bytes"
	"slices"
)

// Clone returns a deep copy of t that shares no memory with t or with the data t was decoded
// from. Nil and empty column data stay nil and empty.
func (t Tuple) Clone() Tuple {
	if t == nil {
		return nil
	}
	n := 0
	for _, c := range t {
		n += len(c.Data)
	}
	out := make(Tuple, len(t))
	data := make([]byte, 0, n) // one allocation for every value
	for i, c := range t {
		out[i].Kind = c.Kind
		if c.Data != nil {
			start := len(data)
			data = append(data, c.Data...)
			out[i].Data = data[start:len(data):len(data)]
		}
	}
	return out
}

// shallow returns a copy of *m, or nil for a nil m: the Clone of a message whose fields are all
// values or strings.
func shallow[T any](m *T) *T {
	if m == nil {
		return nil
	}
	c := *m
	return &c
}

// deep returns a copy of *m in which copyRefs has replaced the slices by copies (nil for a nil m).
func deep[T any](m *T, copyRefs func(*T)) *T {
	c := shallow(m)
	if c != nil {
		copyRefs(c)
	}
	return c
}

// Clone returns an independent copy of m (nil for a nil m); see the package doc.
func (m *Begin) Clone() *Begin { return shallow(m) }

// Clone returns an independent copy of m (nil for a nil m); see the package doc.
func (m *Commit) Clone() *Commit { return shallow(m) }

// Clone returns an independent copy of m (nil for a nil m); see the package doc.
func (m *Origin) Clone() *Origin { return shallow(m) }

// Clone returns an independent copy of m (nil for a nil m), with its own Columns; see the
// package doc.
func (m *Relation) Clone() *Relation {
	return deep(m, func(c *Relation) { c.Columns = slices.Clone(c.Columns) })
}

// Clone returns an independent copy of m (nil for a nil m); see the package doc.
func (m *DataType) Clone() *DataType { return shallow(m) }

// Clone returns an independent copy of m (nil for a nil m), with its own tuple and column data; see the
// package doc.
func (m *Insert) Clone() *Insert {
	return deep(m, func(c *Insert) { c.New = c.New.Clone() })
}

// Clone returns an independent copy of m (nil for a nil m), with its own tuples and column data; see the
// package doc.
func (m *Update) Clone() *Update {
	return deep(m, func(c *Update) { c.Old, c.New = c.Old.Clone(), c.New.Clone() })
}

// Clone returns an independent copy of m (nil for a nil m), with its own tuple and column data; see the
// package doc.
func (m *Delete) Clone() *Delete {
	return deep(m, func(c *Delete) { c.Old = c.Old.Clone() })
}

// Clone returns an independent copy of m (nil for a nil m), with its own RelationIDs; see the
// package doc.
func (m *Truncate) Clone() *Truncate {
	return deep(m, func(c *Truncate) { c.RelationIDs = slices.Clone(c.RelationIDs) })
}

// Clone returns an independent copy of m (nil for a nil m), with its own Content; see the
// package doc.
func (m *LogicalMessage) Clone() *LogicalMessage {
	return deep(m, func(c *LogicalMessage) { c.Content = bytes.Clone(c.Content) })
}

// Clone returns an independent copy of m (nil for a nil m); see the package doc.
func (m *StreamStart) Clone() *StreamStart { return shallow(m) }

// Clone returns an independent copy of m (nil for a nil m); see the package doc.
func (m *StreamStop) Clone() *StreamStop { return shallow(m) }

// Clone returns an independent copy of m (nil for a nil m); see the package doc.
func (m *StreamCommit) Clone() *StreamCommit { return shallow(m) }

// Clone returns an independent copy of m (nil for a nil m); see the package doc.
func (m *StreamAbort) Clone() *StreamAbort { return shallow(m) }

// Clone returns an independent copy of m (nil for a nil m); see the package doc.
func (m *BeginPrepare) Clone() *BeginPrepare { return shallow(m) }

// Clone returns an independent copy of m (nil for a nil m); see the package doc.
func (m *Prepare) Clone() *Prepare { return shallow(m) }

// Clone returns an independent copy of m (nil for a nil m); see the package doc.
func (m *CommitPrepared) Clone() *CommitPrepared { return shallow(m) }

// Clone returns an independent copy of m (nil for a nil m); see the package doc.
func (m *RollbackPrepared) Clone() *RollbackPrepared { return shallow(m) }

// Clone returns an independent copy of m (nil for a nil m); see the package doc.
func (m *StreamPrepare) Clone() *StreamPrepare { return shallow(m) }

// CloneMessage returns m.Clone() for a message of this package: a copy of the same type that
// shares no memory with m or with the data m was decoded from, and so stays valid after the
// input buffer is reused or a Parser overwrites m. It returns nil for nil and for message types
// of other packages.
func CloneMessage(m Message) Message {
	if c, ok := m.(interface{ clone() Message }); ok && !isNil(m) {
		return c.clone()
	}
	return nil
}

func (m *Begin) clone() Message            { return m.Clone() }
func (m *Commit) clone() Message           { return m.Clone() }
func (m *Origin) clone() Message           { return m.Clone() }
func (m *Relation) clone() Message         { return m.Clone() }
func (m *DataType) clone() Message         { return m.Clone() }
func (m *Insert) clone() Message           { return m.Clone() }
func (m *Update) clone() Message           { return m.Clone() }
func (m *Delete) clone() Message           { return m.Clone() }
func (m *Truncate) clone() Message         { return m.Clone() }
func (m *LogicalMessage) clone() Message   { return m.Clone() }
func (m *StreamStart) clone() Message      { return m.Clone() }
func (m *StreamStop) clone() Message       { return m.Clone() }
func (m *StreamCommit) clone() Message     { return m.Clone() }
func (m *StreamAbort) clone() Message      { return m.Clone() }
func (m *BeginPrepare) clone() Message     { return m.Clone() }
func (m *Prepare) clone() Message          { return m.Clone() }
func (m *CommitPrepared) clone() Message   { return m.Clone() }
func (m *RollbackPrepared) clone() Message { return m.Clone() }
func (m *StreamPrepare) clone() Message    { return m.Clone() }
