// Package bench holds the benchmarks that reproduce PostgreSQL's published reorder-buffer workloads.
package bench
