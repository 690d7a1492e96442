package spill

// The format sizes, for the tests of package spill_test that compute file offsets.
const (
	HeaderSize      = headerSize
	BlockHeaderSize = blockHeaderSize
)

// FrameSize returns the logical bytes a record of n bytes takes: its uvarint length and itself.
func FrameSize(n int) int { return frameSize(n) }

// MaxOpenFiles returns the store's descriptor budget.
func MaxOpenFiles(s *Store) int { return s.maxOpen }
