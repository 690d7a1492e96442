package apply

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild()) // a re-executed test binary: an applier to kill
	}
	pgtest.Main(m)
}

// TestModes replicates the mixed workload in each mode, with text and binary values, and checks
// that the target equals the source, that no conflict was met, and that the slot confirmed no
// further than the target applied.
func TestModes(t *testing.T) {
	for _, major := range testMajors {
		for _, mode := range []Mode{Buffered, Eager, Parallel} {
			for _, bin := range []bool{false, true} {
				name := fmt.Sprintf("pg%d/%s/text", major, mode)
				if bin {
					name = fmt.Sprintf("pg%d/%s/binary", major, mode)
				}
				t.Run(name, func(t *testing.T) {
					e := newEnv(t, major)
					cfg := e.config(t, mode)
					cfg.Source.Binary = bin
					cfg.SynchronousCommit = bin // both ways, without doubling the runs
					r := start(t, cfg)
					ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
					defer cancel()
					must(t, workload(ctx, e.src, seeded(t), 1, nil))
					e.waitMarker(t, r, 1)
					r.halt(t)
					e.compare(t)
					st := r.a.Stats()
					t.Logf("stats %+v", st)
					if st.UpdateMissing != 0 || st.DeleteMissing != 0 {
						t.Errorf("conflicts: %d updates and %d deletes found no row", st.UpdateMissing, st.DeleteMissing)
					}
					if st.InsertsViaCopy == 0 {
						t.Error("no row went through COPY")
					}
					if mode != Buffered && st.KeptParts == 0 {
						t.Error("no worker read a part where the reorder buffer holds it")
					}
				})
			}
		}
	}
}

// TestConcurrent replicates many small transactions from concurrent clients on hot rows, in each
// mode, and checks that the target equals the source and that no change missed its row.
func TestConcurrent(t *testing.T) {
	for _, major := range testMajors {
		for _, mode := range []Mode{Eager, Parallel, -Parallel} {
			sync := mode < 0 // SynchronousCommit
			mode = max(mode, -mode)
			name := fmt.Sprintf("pg%d/%s", major, mode)
			if sync {
				name += "/sync"
			}
			t.Run(name, func(t *testing.T) {
				e := newEnv(t, major)
				cfg := e.config(t, mode)
				cfg.SynchronousCommit = sync
				r := start(t, cfg)
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
				defer cancel()
				must(t, concurrent(ctx, e.src, seeded(t), 4, 150))
				must(t, pgtest.Exec(ctx, e.src, `INSERT INTO marker VALUES (1)`))
				e.waitMarker(t, r, 1)
				r.halt(t)
				e.compare(t)
				st := r.a.Stats()
				t.Logf("stats %+v", st)
				if st.UpdateMissing != 0 || st.DeleteMissing != 0 {
					t.Errorf("conflicts: %d updates and %d deletes found no row", st.UpdateMissing, st.DeleteMissing)
				}
			})
		}
	}
}
