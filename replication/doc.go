// Package replication runs a logical replication connection (pgoutput) and feeds the reorder
// buffer. It is the only package of pgreorder that talks to the network.
package replication
