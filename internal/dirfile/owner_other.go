//go:build !unix

package dirfile

import "io/fs"

func ownerOf(fs.FileInfo) (uid int, nlink uint64, ok bool) { return 0, 0, false }
