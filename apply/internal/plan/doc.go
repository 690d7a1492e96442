// Package plan holds the decisions of apply's eager and parallel modes as plain state: which
// commits may be acknowledged (the committed prefix, durable and asynchronous commits, the
// progress row on disk), when a commit must wait for the target's WAL flush, when a group of
// whole transactions or a run is full, whether a run may be sealed, and whether the leader
// applies whole transactions itself or hands them to the workers (chained runs).
//
// Contract: plan starts no goroutine, reads no clock, opens no connection and takes no
// context. Events come in as method calls (a commit made, a flush done, a run opened or
// sealed, the time as a time.Time argument); decisions come out as return values. The same
// calls give the same results, which is what its script tests (testdata/*.txt) check. The
// caller owns the locking: no type here is safe for concurrent use.
package plan
