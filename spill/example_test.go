package spill_test

import (
	"fmt"
	"io"
	"os"

	"github.com/pgreorder/pgreorder/spill"
)

// A transaction's changes are spilled, a subtransaction rolls back, and the rest is read at commit.
func Example() {
	dir, err := os.MkdirTemp("", "spill-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)

	store, err := spill.Open(spill.Options{Dir: dir})
	if err != nil {
		panic(err)
	}
	defer store.Close()

	txn, err := store.Create()
	if err != nil {
		panic(err)
	}
	txn.Append([]byte("insert 1"))
	savepoint := txn.Size() // subtransaction starts here
	txn.Append([]byte("insert 2 (in the subtransaction)"))
	if err := txn.Truncate(savepoint); err != nil { // ROLLBACK TO SAVEPOINT
		panic(err)
	}
	txn.Append([]byte("insert 3"))

	r := txn.NewReader()
	defer r.Close()
	for {
		rec, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			panic(err) // a *spill.CorruptError or the log's sticky I/O error
		}
		fmt.Printf("%s\n", rec)
	}
	// Output:
	// insert 1
	// insert 3
}
