package faultfs_test

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"github.com/pgreorder/pgreorder/spill"
	"github.com/pgreorder/pgreorder/spill/faultfs"
)

// A disk that fills up while a log is written: the Append that writes the record gets the error,
// and the log keeps it.
func Example() {
	dir, err := os.MkdirTemp("", "faultfs-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)

	ffs := faultfs.New(spill.OSFS())
	store, err := spill.Open(spill.Options{Dir: dir, FS: ffs, BufferSize: 64})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	log, err := store.Create()
	if err != nil {
		panic(err)
	}

	ffs.Add(faultfs.Rule{Op: faultfs.OpWrite, Err: syscall.ENOSPC, Partial: true})
	err = log.Append(make([]byte, 100)) // larger than the buffer: written at once
	fmt.Println(errors.Is(err, syscall.ENOSPC), log.Err() == err, ffs.Fired())
	// Output: true true 1
}
