package bench

import (
	"context"
	"fmt"
	"os"
	"runtime/pprof"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/testing/cputime"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/replication"
)

// BenchmarkLive measures, against a real server at its default logical_decoding_work_mem
// (64MB), the time from the COMMIT of a 1M-row transaction (INSERT ... SELECT
// generate_series, as the server returns from it) to its last change reaching the consumer:
//
//   - readonly-off: a client that only reads the stream (pglogrepl receive loop), streaming off:
//     the server reorders and spills the transaction, and sends it after the commit;
//   - readonly-on: the same client with streaming on: its last change is the Stream Commit;
//   - pgreorder-on: package replication with streaming on: the last change is the last one
//     Txn.Changes yields, after the buffer reassembled the transaction.
//
// Each mode gets its own slot and its own insert; the modes run one after the other, in a
// rotating order, rounds times; the reported time of each mode is its median. Beside it: the
// publisher's spill_bytes and stream_bytes for the mode's slot (pg_stat_replication_slots) and
// the client process's CPU time (user+system, getrusage) from the insert to the last change.
//
// It runs on the oldest and the newest PostgreSQL installed (every one with PGREORDER_BENCH_FULL=1) and is
// skipped when none is.
func BenchmarkLive(b *testing.B) {
	installs := pgtest.FindInstalls()
	if len(installs) == 0 {
		b.Skip("no PostgreSQL server installed; " + pgtest.HowToInstall)
	}
	if !*full && len(installs) > 2 {
		installs = []pgtest.Install{installs[0], installs[len(installs)-1]}
	}
	rows := int64(1_000_000)
	rounds := 3
	if testing.Short() {
		rounds = 1
	}
	for _, in := range installs {
		b.Run(fmt.Sprintf("pg=%d/rows=%s", in.Major, rowsName(rows)), func(b *testing.B) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
			defer cancel()
			srv, err := pgtest.Start(ctx, in, pgtest.Options{Settings: map[string]string{
				"logical_decoding_work_mem": "64MB", // the server's default
				"shared_buffers":            "128MB",
				"max_wal_size":              "2GB",
			}})
			if err != nil {
				b.Fatal(err)
			}
			defer srv.Stop()
			b.Logf("%v", in)
			if err := pgtest.Exec(ctx, srv.ConnString("postgres"), "CREATE DATABASE bench"); err != nil {
				b.Fatal(err)
			}
			if err := pgtest.Exec(ctx, srv.ConnString("bench"),
				"CREATE TABLE test (c int)", "CREATE PUBLICATION pub FOR TABLE test"); err != nil {
				b.Fatal(err)
			}
			modes := []string{"readonly-off", "readonly-on", "pgreorder-on"}
			if m := os.Getenv("PGREORDER_BENCH_LIVE_MODES"); m != "" {
				modes = strings.Split(m, ",") // e.g. readonly-on,pgreorder-on
			}
			res := map[string][]liveResult{}
			for range b.N {
				for r := range rounds {
					for i := range modes {
						mode := modes[(i+r)%len(modes)]
						lr, err := liveRun(ctx, b, srv, mode, rows)
						if err != nil {
							b.Fatalf("%s: %v", mode, err)
						}
						b.Logf("round %d %s: commit→last %v, cpu %v, spill %d B, stream %d B", r, mode, lr.lag, lr.cpu, lr.spill, lr.stream)
						res[mode] = append(res[mode], lr)
					}
				}
			}
			med := func(mode string) liveResult {
				rs := slices.Clone(res[mode])
				slices.SortFunc(rs, func(a, b liveResult) int { return int(a.lag - b.lag) })
				return rs[len(rs)/2]
			}
			if len(modes) != 3 {
				for _, mode := range modes {
					r := med(mode)
					b.ReportMetric(float64(r.lag.Microseconds())/1000, mode+"-commit-to-last-ms")
					b.ReportMetric(float64(r.cpu.Microseconds())/1000, mode+"-cpu-ms")
				}
				if len(res["readonly-on"]) > 0 && len(res["pgreorder-on"]) > 0 {
					on, pr := med("readonly-on"), med("pgreorder-on")
					b.ReportMetric(100*(float64(pr.lag)/float64(on.lag)-1), "pgreorder-vs-readonly-on-%")
					b.ReportMetric(float64(pr.cpu)/float64(on.cpu), "pgreorder/readonly-on-cpu-x")
				}
				return
			}
			off, on, pr := med("readonly-off"), med("readonly-on"), med("pgreorder-on")
			for _, x := range []struct {
				mode string
				r    liveResult
			}{{"readonly-off", off}, {"readonly-on", on}, {"pgreorder-on", pr}} {
				b.ReportMetric(float64(x.r.lag.Microseconds())/1000, x.mode+"-commit-to-last-ms")
				b.ReportMetric(float64(x.r.cpu.Microseconds())/1000, x.mode+"-cpu-ms")
				b.ReportMetric(float64(x.r.spill), x.mode+"-spill-bytes")
				b.ReportMetric(float64(x.r.stream), x.mode+"-stream-bytes")
			}
			b.ReportMetric(float64(off.lag)/float64(on.lag), "readonly-off/on-x")
			b.ReportMetric(100*(float64(pr.lag)/float64(on.lag)-1), "pgreorder-vs-readonly-on-%")
			b.ReportMetric(float64(pr.cpu)/float64(on.cpu), "pgreorder/readonly-on-cpu-x")
		})
	}
}

type liveResult struct {
	lag           time.Duration // COMMIT returned → last change out
	cpu           time.Duration // this process's CPU from the insert to the last change
	spill, stream int64         // publisher's slot statistics
}

var slotCounter int

// liveRun creates a slot, starts the mode's reader on it, runs the insert, waits for the reader
// to hand out the last change, and reads the slot's statistics.
func liveRun(ctx context.Context, b *testing.B, srv *pgtest.Server, mode string, rows int64) (liveResult, error) {
	var lr liveResult
	slotCounter++
	slot := fmt.Sprintf("bench_%d", slotCounter)
	conn := srv.ConnString("bench")
	if err := pgtest.Exec(ctx, conn, "TRUNCATE test", "CHECKPOINT",
		fmt.Sprintf("SELECT pg_create_logical_replication_slot('%s', 'pgoutput')", slot)); err != nil {
		return lr, err
	}
	defer pgtest.Exec(context.WithoutCancel(ctx), conn, fmt.Sprintf(
		"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '%s' AND NOT active", slot))

	rctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan time.Time, 1)
	errc := make(chan error, 1)
	// The reader runs under the pprof label mode=<mode>, which its goroutines inherit: a CPU
	// profile of the benchmark (-cpuprofile) separates the modes with -tagfocus.
	go pprof.Do(rctx, pprof.Labels("mode", mode), func(rctx context.Context) {
		switch mode {
		case "readonly-off", "readonly-on":
			errc <- readOnly(rctx, srv, slot, mode == "readonly-on", rows, done)
		case "pgreorder-on":
			errc <- pgreorderReader(rctx, b, srv, slot, rows, done)
		default:
			errc <- fmt.Errorf("unknown mode %q (modes: readonly-off, readonly-on, pgreorder-on)", mode)
		}
	})
	// Wait until the walsender holds the slot, so that the insert is decoded live.
	for {
		active, err := querySingle(ctx, conn, fmt.Sprintf("SELECT active FROM pg_replication_slots WHERE slot_name = '%s'", slot))
		if err != nil {
			return lr, err
		}
		if active == "t" {
			break
		}
		select {
		case err := <-errc:
			return lr, fmt.Errorf("reader: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	cpu0 := cputime.Process()
	if err := pgtest.Exec(ctx, conn, fmt.Sprintf("INSERT INTO test SELECT generate_series(1, %d)", rows)); err != nil {
		return lr, err
	}
	committed := time.Now()
	select {
	case last := <-done:
		lr.lag = last.Sub(committed)
		lr.cpu = cputime.Process() - cpu0
	case err := <-errc:
		return lr, fmt.Errorf("reader: %v", err)
	case <-ctx.Done():
		return lr, ctx.Err()
	}
	stop()
	<-errc
	// The walsender reports the slot's statistics after each decoded transaction; wait for them.
	wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var qerr error
	pgtest.Until(wctx, func() bool {
		var v string
		if v, qerr = querySingle(ctx, conn, fmt.Sprintf(
			"SELECT spill_bytes || ',' || stream_bytes || ',' || total_txns FROM pg_stat_replication_slots WHERE slot_name = '%s'", slot)); qerr != nil {
			return true
		}
		var total int64
		fmt.Sscanf(v, "%d,%d,%d", &lr.spill, &lr.stream, &total)
		return total > 0 || lr.stream > 0
	})
	return lr, qerr
}

// readOnly is a client that only reads: it receives the stream with pglogrepl, answers the
// server's reply requests, and looks at nothing but each message's type. It signals done when
// the transaction's commit arrives after all its rows.
func readOnly(ctx context.Context, srv *pgtest.Server, slot string, streaming bool, rows int64, done chan<- time.Time) error {
	conn, err := pgconn.Connect(ctx, srv.ReplicationConnString("bench"))
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	stream := "off"
	if streaming {
		stream = "on"
	}
	err = pglogrepl.StartReplication(ctx, conn, slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '2'", "publication_names 'pub'", "streaming '" + stream + "'"},
	})
	if err != nil {
		return err
	}
	var changes int64
	var walEnd decoding.LSN
	for {
		msg, err := conn.ReceiveMessage(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		cd, ok := msg.(*pgproto3.CopyData)
		if !ok {
			if e, ok := msg.(*pgproto3.ErrorResponse); ok {
				return pgconn.ErrorResponseToPgError(e)
			}
			continue
		}
		switch cd.Data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			k, err := pglogrepl.ParsePrimaryKeepaliveMessage(cd.Data[1:])
			if err != nil {
				return err
			}
			walEnd = max(walEnd, decoding.LSN(k.ServerWALEnd))
			if k.ReplyRequested {
				if err := pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: pglogrepl.LSN(walEnd)}); err != nil {
					return err
				}
			}
		case pglogrepl.XLogDataByteID:
			x, err := pglogrepl.ParseXLogData(cd.Data[1:])
			if err != nil {
				return err
			}
			walEnd = max(walEnd, decoding.LSN(x.WALStart))
			switch decoding.MessageType(x.WALData[0]) {
			case decoding.MsgInsert:
				changes++
			case decoding.MsgCommit, decoding.MsgStreamCommit:
				if changes >= rows {
					done <- time.Now()
					changes = 0
				}
			}
		}
	}
}

// pgreorderReader reads the slot with package replication (streaming on) and signals done when
// the transaction's last change leaves Txn.Changes.
func pgreorderReader(ctx context.Context, b *testing.B, srv *pgtest.Server, slot string, rows int64, done chan<- time.Time) error {
	st, err := replication.Start(ctx, replication.Config{
		ConnString:   srv.ReplicationConnString("bench"),
		Slot:         slot,
		Publications: []string{"pub"},
		ProtoVersion: 2,
		Streaming:    replication.StreamingOn,
		Buffer:       reorderbuffer.Config{Dir: b.TempDir()}, // work mem: the 64MB default, as the server's
	})
	if err != nil {
		return err
	}
	defer st.Close(context.Background())
	var changes int64
	for {
		t, err := st.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		for c, err := range t.Changes() {
			if err != nil {
				return err
			}
			if _, ok := c.Msg.(*decoding.Insert); ok {
				changes++
			}
		}
		if changes >= rows {
			done <- time.Now()
			changes = 0
		}
		st.Ack(t)
	}
}

// querySingle returns the single value of a one-row, one-column query as text.
func querySingle(ctx context.Context, connString, sql string) (string, error) {
	conn, err := pgconn.Connect(ctx, connString)
	if err != nil {
		return "", err
	}
	defer conn.Close(context.Background())
	rs, err := conn.Exec(ctx, sql).ReadAll()
	if err != nil {
		return "", err
	}
	if len(rs) != 1 || len(rs[0].Rows) != 1 || len(rs[0].Rows[0]) != 1 {
		return "", fmt.Errorf("%q: want one value", sql)
	}
	return string(rs[0].Rows[0][0]), nil
}
