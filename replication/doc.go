// Package replication runs a logical replication connection (pgoutput) and feeds the reorder
// buffer. It is the only package of pgreorder that talks to the network.
//
// Start connects with replication=database, runs IDENTIFY_SYSTEM, creates the slot when asked
// (temporary or permanent, with two-phase), and sends START_REPLICATION with the highest pgoutput
// protocol the server speaks (1 below PostgreSQL 14, 2 on 14, 3 on 15, 4 on 16+) and the best
// streaming mode it supports ("parallel" on 16+, "on" on 14 and 15), unless Config says otherwise.
// Config.Negotiate shows exactly what will be sent.
//
// # Acknowledgements
//
// Next hands out committed transactions in commit order. The consumer handles each one (writes,
// fsyncs, commits downstream...) and then calls Ack. The standby status updates sent to the server
// carry
//
//   - write = the highest position received,
//   - flush = apply = the highest EndLSN such that it and every transaction before it were acked;
//     when nothing received is pending, the walEnd of the last keepalive, so an idle slot's
//     confirmed_flush_lsn keeps advancing and the slot does not pin WAL.
//
// They are sent at least every Config.StatusInterval (10s by default), at once when the server asks
// for a reply, on SendStatus, and on Close. The flush position never passes a transaction the
// consumer has not acknowledged: the server skips every transaction whose commit is before the
// confirmed position, so that would lose it. (pglogrepl.SendStandbyStatusUpdate replaces a zero
// flush position by the write position; this package encodes its own status messages and never
// relies on that default.)
//
// # Resuming
//
// After an error (connection dropped, walsender terminated, server restarted) Close the stream and
// Start a new one with Config.Buffer.SkipThrough set to the EndLSN of the last transaction the
// consumer made durable (Position().Acked if every acked transaction is durable). START_REPLICATION
// then starts there, and the buffer drops any transaction ending at or before it that the server
// sends again because its confirmed position was behind. Together: nothing the consumer acknowledged
// is repeated, and nothing after it is lost (the slot's confirmed_flush_lsn never passed it).
// Partially received transactions are simply sent again by the server, from their first segment.
//
// # Concurrency and buffers
//
// A Stream is used from one goroutine. A transaction returned by Next, and the messages its Changes
// iterator yields, are valid until the next call to Next or Close; copy what must outlive that.
package replication
