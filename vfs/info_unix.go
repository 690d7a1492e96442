//go:build unix && (!linux || vfs_osroot)

package vfs

import (
	"io/fs"
	"syscall"
)

func infoOf(fi fs.FileInfo) Info {
	info := Info{Mode: fi.Mode(), UID: -1, Nlink: 1, Size: fi.Size()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		info.UID = int(st.Uid)
		info.Nlink = uint64(st.Nlink)
		info.Dev = uint64(st.Dev)
		info.Ino = uint64(st.Ino)
	}
	return info
}
