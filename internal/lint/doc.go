// Package lint holds tests that keep the architecture honest: imports point down only, only
// package replication talks to pgconn, the core has no goroutines and no clock, and spill reaches
// files below its directory only through directory handles.
package lint
