package schedule

import (
	"bytes"
	"encoding/binary"
	"hash/maphash"
	"sync/atomic"

	"github.com/pgreorder/pgreorder/decoding"
)

// Job is what the tracker knows of a transaction: its sequence number in the commit order (0
// until its commit is known), whether it is serial, and the keys registered for it.
type Job struct {
	Seq    atomic.Uint64
	Serial bool // must not run alongside earlier transactions

	keys []uint64 // keys registered for it
	wide bool     // too many keys to track: later transactions wait for all of it
}

// maxJobKeys is how many row keys the tracker remembers for one transaction; a transaction that
// touches more becomes a barrier instead: every later one waits for its commit. It bounds the
// tracker's memory (about 50 bytes a key) whatever the transactions' sizes.
const maxJobKeys = 16384

// Tracker finds what a transaction applied in Parallel must wait for, as the proposed parallel
// apply of PostgreSQL does: it remembers, for each row key (relation and replica identity key
// values, hashed) the last transaction in flight that touched it. A change to a key an earlier
// transaction still in flight touched waits for that transaction's commit. A REPLICA IDENTITY
// FULL relation is keyed by the columns of a target unique index that identify its rows for
// sure, when the caller names one (ChangeDeps' key). A change without a usable key (UPDATE or
// DELETE of a keyless relation or of a FULL one without such an index), a TRUNCATE, or a
// Change to a table whose triggers (foreign keys included) fire on the target makes its
// transaction serial: it waits for every earlier transaction, and every later one waits for it.
//
// Two changes touch the same row when the target's unique index finds their keys equal, which
// is not always when their values were sent the same: numeric 1.0 equals 1.00, float -0 equals
// 0, character(n) ignores trailing spaces, a nondeterministic collation may ignore case. Each
// key column's KeyForm says how its values are compared; the tracker hashes a canonical form of
// each value (see KeyForm), and a change whose key has a column of KeyOpaque makes its
// transaction serial, an insert too.
//
// Hash collisions only add waits. The tracker is the leader's: not safe for concurrent use.
type Tracker struct {
	seed    maphash.Seed
	owners  map[uint64]*Job
	barrier uint64 // sequence number every later transaction waits for
	buf     []byte
}

// NewTracker returns a tracker that knows of no transaction.
func NewTracker() *Tracker {
	return &Tracker{seed: maphash.MakeSeed(), owners: map[uint64]*Job{}}
}

// KeyForm is how the target compares the values of one key column, and so what the tracker
// hashes of them: a value sent as text is made canonical for its form first. Values sent in
// binary are hashed as sent for KeyExact only; for the other forms they make the change opaque.
type KeyForm uint8

const (
	// KeyExact: equal values are sent the same, in text and in binary (integers, uuid, text
	// with a deterministic collation, timestamps...). The zero value.
	KeyExact KeyForm = iota
	// KeyNumeric: numeric, whose trailing zeros after the decimal point do not change the
	// value (1.0 = 1.00 = 1): they are dropped, and the point with them.
	KeyNumeric
	// KeyFloat: real and double precision, whose -0 equals 0.
	KeyFloat
	// KeyPadded: character(n), whose trailing spaces do not count: they are dropped.
	KeyPadded
	// KeyOpaque: an equality the tracker cannot reproduce from the values (a nondeterministic
	// collation, interval, jsonb, arrays and ranges of the forms above, types of extensions):
	// the change makes its transaction serial.
	KeyOpaque
)

// KeyFormOf returns the form of a target column of type oid (through domains: the base type's
// OID) whose collation is deterministic unless nondeterministic is set. Built-in types whose
// equal values have one text form are KeyExact; numeric, real, double precision and character(n)
// have their forms; every other type, and a text type with a nondeterministic collation, is
// KeyOpaque.
func KeyFormOf(oid uint32, nondeterministic bool) KeyForm {
	switch oid {
	case 25, 1043, 19, 1009, 1015, 1003: // text, varchar, name and their arrays
		if nondeterministic {
			return KeyOpaque
		}
		return KeyExact
	case 1042: // character(n)
		if nondeterministic {
			return KeyOpaque
		}
		return KeyPadded
	case 1700:
		return KeyNumeric
	case 700, 701:
		return KeyFloat
	case 16, 17, 18, 20, 21, 23, 26, // bool, bytea, "char", bigint, smallint, integer, oid
		2950, 1082, 1083, 1114, 1184, 1266, // uuid, date, time, timestamp, timestamptz, timetz
		869, 650, 829, 774, 1560, 1562, 790, // inet, cidr, macaddr, macaddr8, bit, varbit, money
		1000, 1001, 1005, 1007, 1016, 1028, 2951, 1182, 1115, 1185: // arrays of bool, bytea, smallint, integer, bigint, oid, uuid, date, timestamp, timestamptz
		return KeyExact
	}
	return KeyOpaque
}

// canonical appends to b the canonical form of v, a key value of form f sent as text.
func canonical(b []byte, f KeyForm, v []byte) []byte {
	switch f {
	case KeyNumeric:
		if bytes.IndexByte(v, '.') >= 0 {
			v = bytes.TrimRight(v, "0")
			v = bytes.TrimSuffix(v, []byte("."))
		}
		if string(v) == "-0" {
			v = v[1:]
		}
	case KeyFloat:
		if string(v) == "-0" {
			v = v[1:]
		}
	case KeyPadded:
		v = bytes.TrimRight(v, " ")
	}
	return append(b, v...)
}

// Change registers that j (whose sequence number is known) makes change m to the relation rel,
// whose target table has triggers that fire if triggers is set. It returns the sequence number j
// must wait for before applying m (0 for none), and whether j just became serial: in source commit
// order, waiting for every number up to the highest of ChangeDeps' covers them all.
func (tr *Tracker) Change(j *Job, rel *decoding.Relation, m decoding.Message, triggers bool) (wait uint64, serial bool) {
	d, serial := tr.ChangeDeps(j, rel, nil, nil, m, triggers)
	return d.Max(), serial
}

// Deps is what a change must wait for before it is applied: every transaction up to Prefix (0 for
// none; a serial transaction waits for all those before it), and each transaction of Seqs[:N],
// on its own (those in flight that touched the change's keys, and the last barrier). Each of
// those waited, before its own changes, for what it depended on, so waiting for them is enough
// even when transactions commit out of order.
type Deps struct {
	Prefix uint64
	Seqs   [3]uint64
	N      int
}

// Max returns the highest sequence number of d, 0 for none.
func (d Deps) Max() uint64 {
	m := d.Prefix
	for _, s := range d.Seqs[:d.N] {
		m = max(m, s)
	}
	return m
}

func (d *Deps) add(seq uint64) {
	for _, s := range d.Seqs[:d.N] {
		if s == seq {
			return
		}
	}
	d.Seqs[d.N] = seq
	d.N++
}

// ChangeDeps is Change, returning each transaction the change depends on. key names the columns
// (indexes into rel.Columns) that identify a row of a REPLICA IDENTITY FULL relation for sure,
// those of a unique index of the target table whose columns are all NOT NULL (nil: none, and
// the relation's updates and deletes make their transaction serial); it is ignored for other
// relations, which are keyed by their replica identity key. forms are the KeyForms of rel's
// columns, by index (nil, or shorter than rel.Columns: KeyExact). A relation is keyed the same
// way by every call.
func (tr *Tracker) ChangeDeps(j *Job, rel *decoding.Relation, key []int, forms []KeyForm, m decoding.Message, triggers bool) (d Deps, serial bool) {
	seq := j.Seq.Load()
	if j.Serial {
		return d, false // already waits for everything before it
	}
	serialize := func() (Deps, bool) { return Deps{Prefix: tr.serialize(j)}, true }
	if b := tr.barrier; b != 0 && b < seq {
		d.add(b)
	}
	if triggers {
		return serialize()
	}
	var (
		keys [2]uint64
		n    int
		ok   bool
	)
	full := rel.ReplicaIdentity == 'f'
	if !full {
		key = nil
	}
	switch m := m.(type) {
	case *decoding.Insert:
		var opaque bool
		if keys[0], ok, opaque = tr.key(rel, key, forms, m.New); ok {
			n = 1
		} else if opaque {
			return serialize()
		} // else a table without a key: inserts conflict with nothing
	case *decoding.Update:
		if full && key == nil {
			return serialize()
		}
		if m.OldKind == 'K' || m.OldKind == 'O' {
			if keys[0], ok, _ = tr.key(rel, key, forms, m.Old); !ok {
				return serialize()
			}
			n = 1
		}
		if keys[n], ok, _ = tr.key(rel, key, forms, m.New); !ok {
			return serialize()
		}
		n++
	case *decoding.Delete:
		if full && key == nil {
			return serialize()
		}
		if keys[0], ok, _ = tr.key(rel, key, forms, m.Old); !ok {
			return serialize()
		}
		n = 1
	default:
		return serialize()
	}
	for _, k := range keys[:n] {
		if o := tr.owners[k]; o != nil && o != j {
			if s := o.Seq.Load(); s < seq {
				d.add(s)
			}
		}
		if j.wide {
			continue
		}
		if len(j.keys) >= maxJobKeys {
			// Too many keys to remember: later transactions wait for all of j instead.
			j.wide = true
			tr.barrier = max(tr.barrier, seq)
			tr.Release(j)
			continue
		}
		if tr.owners[k] != j {
			tr.owners[k] = j
			j.keys = append(j.keys, k)
		}
	}
	return d, false
}

// serialize makes j serial: it waits for every earlier transaction, every later one for it.
func (tr *Tracker) serialize(j *Job) uint64 {
	j.Serial = true
	seq := j.Seq.Load()
	tr.barrier = max(tr.barrier, seq)
	tr.Release(j)
	return seq - 1
}

// After makes every transaction after seq wait for it (a streamed transaction, whose keys are
// not tracked, or one applied by the leader).
func (tr *Tracker) After(seq uint64) { tr.barrier = max(tr.barrier, seq) }

// Release forgets j's keys: it committed (or stopped tracking them).
func (tr *Tracker) Release(j *Job) {
	for _, k := range j.keys {
		if tr.owners[k] == j {
			delete(tr.owners, k)
		}
	}
	j.keys = nil
}

// key hashes the relation and its key columns in tup (cols, else the replica identity key's),
// each value in its canonical form (forms). ok is false when the relation has no key, is
// REPLICA IDENTITY FULL (every column is flagged) without cols, or a key value was not sent (an
// unchanged TOASTed value); opaque says that a key column's equality cannot be reproduced.
func (tr *Tracker) key(rel *decoding.Relation, cols []int, forms []KeyForm, tup decoding.Tuple) (k uint64, ok, opaque bool) {
	if rel.ReplicaIdentity == 'f' && cols == nil {
		return 0, false, false
	}
	b := binary.BigEndian.AppendUint32(tr.buf[:0], rel.RelationID)
	keyed := false
	add := func(i int) bool {
		if i >= len(tup) || tup[i].Kind == decoding.ColumnUnchanged {
			return false
		}
		f := KeyExact
		if i < len(forms) {
			f = forms[i]
		}
		c := tup[i]
		if f == KeyOpaque || f != KeyExact && c.Kind == decoding.ColumnBinary {
			opaque = true
			return false
		}
		keyed = true
		b = append(b, c.Kind)
		at := len(b)
		b = append(b, 0, 0, 0, 0)
		if c.Kind == decoding.ColumnText {
			b = canonical(b, f, c.Data)
		} else {
			b = append(b, c.Data...)
		}
		binary.BigEndian.PutUint32(b[at:], uint32(len(b)-at-4))
		return true
	}
	if cols != nil {
		for _, i := range cols {
			if !add(i) {
				return 0, false, opaque
			}
		}
	} else {
		for i, c := range rel.Columns {
			if c.IsKey() && !add(i) {
				return 0, false, opaque
			}
		}
	}
	tr.buf = b
	if !keyed {
		return 0, false, false
	}
	return maphash.Bytes(tr.seed, b), true, false
}
