package spill

import "github.com/pgreorder/pgreorder/vfs"

// The file system a Store works through is package vfs's: [Options].FS is a [vfs.FS], [vfs.OS] by
// default, and package [github.com/pgreorder/pgreorder/vfs/faultfs] wraps it to inject errors in
// tests. These names are kept for the code that used them when they were spill's own.
type (
	// Deprecated: use vfs.FS.
	FS = vfs.FS
	// Deprecated: use vfs.Dir.
	Dir = vfs.Dir
	// Deprecated: use vfs.File.
	File = vfs.File
	// Deprecated: use vfs.LockFile.
	LockFile = vfs.LockFile
	// Deprecated: use vfs.Info.
	Info = vfs.Info
)

// OSFS returns vfs.OS().
//
// Deprecated: use vfs.OS.
func OSFS() vfs.FS { return vfs.OS() }
