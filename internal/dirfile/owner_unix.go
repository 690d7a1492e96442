//go:build unix && !linux

package dirfile

import (
	"io/fs"
	"syscall"
)

func ownerOf(fi fs.FileInfo) (uid int, nlink uint64, ok bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, 0, false
	}
	return int(st.Uid), uint64(st.Nlink), true
}
