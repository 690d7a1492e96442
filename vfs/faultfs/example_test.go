package faultfs_test

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"github.com/pgreorder/pgreorder/spill"
	"github.com/pgreorder/pgreorder/vfs"
	"github.com/pgreorder/pgreorder/vfs/faultfs"
)

// A disk that fails the fsync of a file being replaced: WriteFile reports it, and the file holds
// its old content, which is what a reader finds.
func Example() {
	path, err := os.MkdirTemp("", "faultfs-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(path)

	ffs := faultfs.New(vfs.OS())
	dir, err := ffs.OpenDir(path)
	if err != nil {
		panic(err)
	}
	defer dir.Close()
	if err := vfs.WriteFile(dir, "position", []byte("0/16B3780\n"), 0o600); err != nil {
		panic(err)
	}

	ffs.Add(faultfs.Rule{Op: faultfs.OpSync, Err: syscall.EIO})
	err = vfs.WriteFile(dir, "position", []byte("0/16B3800\n"), 0o600)
	fmt.Println(errors.Is(err, syscall.EIO), ffs.Fired())
	b, err := vfs.ReadFile(dir, "position", 100)
	if err != nil {
		panic(err)
	}
	fmt.Printf("%s", b)
	// Output:
	// true 1
	// 0/16B3780
}

// A disk that fills up while a spill log is written: the Append that writes the record gets the
// error, and the log keeps it.
func Example_spill() {
	dir, err := os.MkdirTemp("", "faultfs-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)

	ffs := faultfs.New(vfs.OS())
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
