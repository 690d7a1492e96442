package bench

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestOfflineSummary runs bench/offline/summary on raw benchmark output and checks its table: the
// subscribers in the order they ran, their figures, and the ratios to native and buffered (a
// subscriber name's GOMAXPROCS suffix removed, a worker count kept).
func TestOfflineSummary(t *testing.T) {
	if _, err := exec.LookPath("awk"); err != nil {
		t.Skip("no awk")
	}
	raw := `BenchmarkApplyCatchup/pg=18/load=simple-update-s100/clients=32/txns=6250/sub=native-16         	       1	         0 applier-cpu-ms/txn	      8000 apply-txn/s	        20.00 catchup-s	         0.02000 cpu-ms/txn
BenchmarkApplyCatchup/pg=18/load=simple-update-s100/clients=32/txns=6250/sub=pgreorder-buffered-16         	       1	         0.01000 applier-cpu-ms/txn	     16000 apply-txn/s	        10.00 catchup-s	         0.01600 cpu-ms/txn	         0.01200 walsender-cpu-ms/txn
BenchmarkApplyCatchup/pg=18/load=simple-update-s100/clients=32/txns=6250/sub=pgreorder-parallel-8-16         	       1	         0.01000 applier-cpu-ms/txn	     40000 apply-txn/s	         5.000 catchup-s	         0.01800 cpu-ms/txn
BenchmarkApplySync/pg=18/rows=1M/workmem=64kB/rollback=0%/sub=native-parallel-16	       1	      4000 sql-ms	      3000 sub-cpu-ms	      2500 walsender-cpu-ms
BenchmarkApplySync/pg=18/rows=1M/workmem=64kB/rollback=0%/sub=pgreorder-eager-16	       1	      2000 sql-ms	         0.5000 eager/native-parallel	      1500 sub-cpu-ms	      2400 walsender-cpu-ms
BenchmarkApplySync/pg=18/rows=1M/workmem=64kB/rollback=0%/sub=pgreorder-eager-synccommit-16	       1	      2100 sql-ms
`
	in := filepath.Join(t.TempDir(), "raw.txt")
	if err := os.WriteFile(in, []byte(raw), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("bash", filepath.Join("offline", "summary"), in).CombinedOutput()
	if err != nil {
		t.Fatalf("summary: %v\n%s", err, out)
	}
	got := strings.Fields(string(out))
	want := strings.Fields(`catch-up pg=18/load=simple-update-s100/clients=32/txns=6250
  subscriber catchup-s x native x buffered cpu-ms/txn cpu x nat walsender-ms/txn
  native 20.00 1.00 2.00 0.02000 1.00 -
  pgreorder-buffered 10.00 0.50 1.00 0.01600 0.80 0.01200
  pgreorder-parallel-8 5.000 0.25 0.50 0.01800 0.90 -
synchronous replication pg=18/rows=1M/workmem=64kB/rollback=0%
  subscriber sql-ms x native-parallel x eager-synccommit sub-cpu-ms cpu x np walsender-ms
  native-parallel 4000 1.00 1.90 3000 1.00 2500
  pgreorder-eager 2000 0.50 0.95 1500 0.50 2400
  pgreorder-eager-synccommit 2100 0.53 1.00 - - -`)
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("summary printed\n%s\nwant (spacing aside)\n%s", out, strings.Join(want, " "))
	}

	// Two files with the same case: each case is named with its file.
	in2 := filepath.Join(t.TempDir(), "other.txt")
	if err := os.WriteFile(in2, []byte(raw), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err = exec.Command("bash", filepath.Join("offline", "summary"), in, in2).CombinedOutput()
	if err != nil {
		t.Fatalf("summary of two files: %v\n%s", err, out)
	}
	for _, want := range []string{"catch-up raw.txt: pg=18/", "catch-up other.txt: pg=18/", "synchronous replication other.txt: pg=18/"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("summary of two files lacks %q:\n%s", want, out)
		}
	}

	// Output without a result line is an error, not an empty table.
	empty := filepath.Join(t.TempDir(), "empty.txt")
	if err := os.WriteFile(empty, []byte("PASS\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("bash", filepath.Join("offline", "summary"), empty).CombinedOutput(); err == nil {
		t.Errorf("summary of output without results: no error\n%s", out)
	}
}

// TestApplyWorkers checks PGREORDER_BENCH_APPLY_WORKERS's parsing and the catch-up subscribers it
// makes.
func TestApplyWorkers(t *testing.T) {
	t.Setenv(envApplyWorkers, "")
	if got := applyWorkers(t); len(got) != 1 || got[0] != 4 {
		t.Errorf("unset: got %v, want [4]", got)
	}
	t.Setenv(envApplyWorkers, "4, 8")
	var names []string
	for _, c := range catchupContenders(t) {
		names = append(names, c.name())
	}
	want := "limit native pgreorder-buffered pgreorder-eager pgreorder-parallel-4 pgreorder-parallel-4-relaxed pgreorder-parallel-8 pgreorder-parallel-8-relaxed"
	if strings.Join(names, " ") != want {
		t.Errorf("4, 8: got %v, want %s", names, want)
	}
}
