package detect

// Table is what detection knows of a target table and of the source relation written to it.
type Table struct {
	Name    string   // quoted, qualified
	OID     uint32   // the target table's
	Columns []Column // per source column
	Key     []int    // source columns of the replica identity key
	// Full: rows are found by the whole old row. The source relation is REPLICA IDENTITY FULL
	// and the target table has no primary key or replica identity index made of source columns
	// (with one, Key holds its columns and Full is false).
	Full bool
}

// Column is a source column and the target column it is written to.
type Column struct {
	Source  string // the source column's name
	Name    string // the target column's, quoted
	TypeOID uint32 // the target column's type
}
