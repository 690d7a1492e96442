//go:build !unix

package spill

import "io/fs"

// infoOf reports no owner: a Store then never takes a directory for one of its stale stores.
func infoOf(fi fs.FileInfo) Info { return Info{Mode: fi.Mode(), UID: -1, Nlink: 1} }
