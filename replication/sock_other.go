//go:build !linux

package replication

import "net"

// newSock returns c as a sock: in Go's network poller, as every connection outside Linux.
func newSock(c net.Conn) sock { return netSock{c} }
