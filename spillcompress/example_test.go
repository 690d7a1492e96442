package spillcompress_test

import (
	"fmt"
	"io"
	"os"

	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/spill"
	"github.com/pgreorder/pgreorder/spillcompress"
)

// A spill store that compresses its blocks with S2: the records read back are the ones
// appended, and fewer bytes reach the file than the records hold.
func Example() {
	dir, err := os.MkdirTemp("", "spillcompress-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)

	store, err := spill.Open(spill.Options{Dir: dir, Compressor: spillcompress.S2()})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	txn, err := store.Create()
	if err != nil {
		panic(err)
	}
	raw := 0
	for i := range 1000 {
		rec := fmt.Appendf(nil, `{"id":%d,"status":"shipped","note":"the same words in every row"}`, i)
		raw += len(rec)
		if err := txn.Append(rec); err != nil {
			panic(err)
		}
	}

	r := txn.NewReader() // flushes the last block
	defer r.Close()
	read := 0
	for {
		_, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			panic(err)
		}
		read++
	}
	fmt.Println("records read back:", read)
	fmt.Println("file bytes under a third of the records':", store.WrittenBytes()*3 < int64(raw))
	// Output:
	// records read back: 1000
	// file bytes under a third of the records': true
}

// A reorder buffer takes the codec in its Config (a replication stream in
// replication.Config.Buffer); Stats.SpillWrittenBytes against Stats.SpillBytes gives the ratio.
func Example_reorderBuffer() {
	buf, err := reorderbuffer.New(reorderbuffer.Config{WorkMem: 4 << 20, SpillCompressor: spillcompress.S2()})
	if err != nil {
		panic(err)
	}
	defer buf.Close()
	st := buf.Stats()
	fmt.Println(st.SpillBytes, st.SpillWrittenBytes) // nothing spilled yet
	// Output: 0 0
}
