package vfs_test

import (
	"fmt"
	"os"

	"github.com/pgreorder/pgreorder/vfs"
)

// A small file replaced atomically and durably in a directory opened once: a reader finds the old
// content or the new one, never a mix, and never a file of another user's or a symbolic link
// planted under the name.
func Example() {
	path, err := os.MkdirTemp("", "vfs-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(path)

	dir, err := vfs.OS().OpenDir(path)
	if err != nil {
		panic(err)
	}
	defer dir.Close()
	for _, pos := range []string{"0/16B3780", "0/16B3800"} {
		if err := vfs.WriteFile(dir, "position", []byte(pos+"\n"), 0o600); err != nil {
			panic(err)
		}
	}
	b, err := vfs.ReadFile(dir, "position", 4<<10)
	if err != nil {
		panic(err)
	}
	info, err := dir.Lstat("position")
	if err != nil {
		panic(err)
	}
	fmt.Printf("%s%v\n", b, info.Mode)
	// Output:
	// 0/16B3800
	// -rw-------
}
