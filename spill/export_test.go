package spill

// The format sizes, for the tests of package spill_test that compute file offsets.
const (
	HeaderSize      = headerSize
	FrameHeaderSize = frameHeaderSize
)

// MaxOpenFiles returns the store's descriptor budget.
func MaxOpenFiles(s *Store) int { return s.maxOpen }
