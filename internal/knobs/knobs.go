// Package knobs holds switches that benchmarks flip to measure what a mechanism costs. They are
// not part of any API: production code never sets them.
package knobs

// NoAccounting turns off the reorder buffer's memory accounting and eviction heap: no limit is
// enforced and nothing is spilled. BenchmarkBulkInsert sets it to measure what accounting costs.
// Set it only while no Buffer is in use.
var NoAccounting bool
