package capture

// NewReaderSize is NewReader with a read buffer of the given size, for tests that cut lines into
// many reads.
var NewReaderSize = newReaderSize

// MaxHeader exposes maxHeader to the tests.
const MaxHeader = maxHeader
