// Package bench reproduces PostgreSQL's published reorder-buffer workloads as deterministic
// pgoutput streams, and benchmarks pgreorder on them beside a naive baseline (every message
// parsed with pglogrepl and kept in a map from xid to slice, with no memory limit: what most Go
// CDC tools do today).
//
// The generators (ManySubxacts, BulkInsert, RollbackToSavepoint, SmallTxns, SmallTxnsStreamed)
// are seeded and lazy: a Workload yields the same bytes every time, one message at a time in a
// reused buffer, so that a 10M-row stream costs no memory and the heap measured during a
// benchmark is the consumer's. A yielded message is valid only until the next iteration step.
// Streamed workloads are cut into stream blocks as the server cuts them: a block each time the
// transaction's changes reach the server's logical_decoding_work_mem (ServerChangeBytes per
// change).
//
// The benchmarks are in the package's tests; BENCHMARKS.md at the repository root gives the
// current results with the commands that reproduce them, and the dated runs under bench/results
// (history-*.md) the method, every earlier result and the SVG charts (drawn by bench/charts from
// the first runs' output):
//
//	go test -run '^$' -bench . -benchtime 1x -short ./bench/...      # reduced sizes, minutes
//	PGREORDER_BENCH_FULL=1 go test -run '^$' -bench . -benchtime 1x -timeout 60m ./bench/  # PostgreSQL's sizes
//
// Every benchmark reports ns/change, allocs/change, B/change, spilled-bytes and
// peak-heap-bytes (the highest /memory/classes/heap/objects:bytes sampled every 4096 messages,
// minus the value after a GC before the run: it includes garbage not yet collected) and
// peak-live-bytes (the same for /gc/heap/live:bytes, the heap the last GC found live).
//
// The live apply benchmarks, BenchmarkApplySync and BenchmarkApplyCatchup, replicate from a
// publisher server into a subscriber server (throwaway servers from internal/testing/pgtest, the oldest
// and the newest PostgreSQL installed), with PostgreSQL's own subscriber and with
// `pgreorder apply` (built from ./cmd/pgreorder into a temporary folder once per run, or PGREORDER_BENCH_BIN's), one at a
// time on the same pair, every run from reset tables and a new slot. They take minutes and run
// only with PGREORDER_BENCH_APPLY=1:
//
//	PGREORDER_BENCH_APPLY=1 go test -run '^$' -bench Apply -benchtime 1x -timeout 60m ./bench/
//
// Both servers keep PostgreSQL's durability settings (fsync, full_page_writes) unless
// PGREORDER_BENCH_APPLY_FSYNC=0. ApplySync times the publisher's transaction under synchronous
// logical replication (metric sql-ms, the median of alternating rounds, beside the CPU time each
// process spent meanwhile: the publisher's backend and walsender, the subscriber server and the
// applier); ApplyCatchup times a
// subscriber catching up with a backlog made while it was stopped (catchup-s), for four
// workloads (pgbench, simple-update, spread, identity-full), beside a limit (pg_recvlogical reading the backlog
// and applying nothing: x-limit) and PostgreSQL's worker (x-native), and the CPU time the
// subscriber server and the applier used per transaction (cpu-ms/txn). A subscriber is a small
// interface (contender) and each benchmark has a list of them. A run checks what the subscriber applied and fails when it is wrong, or when
// the subscriber stops on its own (its output is quoted).
//
// Where there is no go command (a benchmark machine with cores to spare and nothing else), the
// apply benchmarks run from prebuilt binaries: PGREORDER_BENCH_BIN names a pgreorder binary to
// start instead of building one, a test binary made with go test -c runs the benchmarks, and
// PGREORDER_BENCH_APPLY_WORKERS (4 by default; 4,8 runs both) sets the worker counts of the
// catch-up's parallel subscribers. bench/offline builds both binaries and runs the catch-up and
// synchronous-replication targets from them in one script (bench/offline/README.md).
//
// BenchmarkKafkaSink (PGREORDER_BENCH_KAFKA_SINK=1) measures package kafkasink delivering a
// backlog to a Kafka broker of its own, in events/s and MB/s; BenchmarkKafkaDebezium
// (PGREORDER_BENCH_KAFKA=1) compares `pgreorder kafka` with Debezium's connector.
package bench
