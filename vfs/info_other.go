//go:build !unix

package vfs

import "io/fs"

// infoOf reports no owner: such a file is never taken for another user's, nor for one's own where
// ownership decides (a spill store's stale directories).
func infoOf(fi fs.FileInfo) Info { return Info{Mode: fi.Mode(), UID: -1, Nlink: 1, Size: fi.Size()} }
