// Package lint holds tests that keep the architecture honest: imports point down only, only
// package replication talks to pgconn, and the core has no goroutines and no clock.
package lint
