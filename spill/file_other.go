//go:build !unix

package spill

import (
	"io/fs"
	"os"
)

func openFile(name string, flag int, perm fs.FileMode) (File, error) {
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return f, nil
}
