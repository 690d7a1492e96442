package schedule

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/reorderbuffer"
)

var errRefused = errors.New("refused")

// fakeJob is a JobTarget that records the calls RunJob makes.
type fakeJob struct {
	calls []string
	// A change record "x" and part 66 are refused (errRefused), "bad" and part 99 are unreadable. flushErr is Flush's
	// error; onFlush runs at a Flush (to push the records that follow).
	onFlush  func()
	flushErr error
	states   []int32
}

func (f *fakeJob) call(format string, args ...any) {
	f.calls = append(f.calls, fmt.Sprintf(format, args...))
}

func (f *fakeJob) State(st int32)                   { f.states = append(f.states, st) }
func (f *fakeJob) Record(ctx context.Context) error { return nil }
func (f *fakeJob) Begin()                           { f.call("begin") }
func (f *fakeJob) Txn(ctx context.Context, i uint32) error {
	f.call("txn %d", i)
	return nil
}
func (f *fakeJob) Change(ctx context.Context, rec []byte) error {
	f.call("change %s", rec[1:])
	switch string(rec[1:]) {
	case "x":
		return errRefused
	case "bad":
		return Fatal(errors.New("unreadable"))
	}
	return nil
}
func (f *fakeJob) Part(ctx context.Context, i uint32) error {
	f.call("part %d", i)
	switch i {
	case 66:
		return errRefused
	case 99:
		return Fatal(errors.New("unreadable"))
	}
	return nil
}
func (f *fakeJob) RollbackTo(ctx context.Context, sub uint32) error {
	f.call("rollback to %d", sub)
	return nil
}
func (f *fakeJob) Flush(ctx context.Context) error {
	f.call("flush")
	if f.onFlush != nil {
		f.onFlush()
	}
	return f.flushErr
}
func (f *fakeJob) Wait(ctx context.Context, seq uint64) error {
	f.call("wait %d", seq)
	return nil
}
func (f *fakeJob) WaitFor(ctx context.Context, seq uint64) error {
	f.call("wait for %d", seq)
	return nil
}
func (f *fakeJob) Failed(ctx context.Context, err error) (failed, fatal error) {
	f.call("failed %v", err)
	if errors.Is(err, errRefused) {
		return err, nil
	}
	return nil, err
}
func (f *fakeJob) Commit(ctx context.Context, begun bool, failed error) error {
	f.call("commit begun=%v failed=%v", begun, failed)
	return nil
}
func (f *fakeJob) Abort(ctx context.Context, begun bool) error {
	f.call("abort begun=%v", begun)
	return nil
}

func change(s string) []byte { return append([]byte{RecChange}, s...) }

func newTestQueue(t *testing.T) *Queue {
	st := NewSpillStore(t.TempDir(), nil)
	t.Cleanup(func() { st.Close() })
	return NewQueue(st, NewBudget(reorderbuffer.NewMemory(1<<20)), 1<<20, new(atomic.Int64))
}

// TestRunJob: RunJob drives a job's records through its target as the workers apply them: the
// transaction begins at its first change or savepoint, a rollback before it is skipped, a change
// the target refuses rolls the job back and skips its records up to the end, and what is pending
// is flushed before waiting for more records.
func TestRunJob(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, c := range []struct {
		name string
		recs [][]byte
		want []string
	}{
		{"commit", [][]byte{change("a"), PartRecord(2), change("b"), RollbackRecord(2), WaitRecord(7), {RecCommit}},
			[]string{"begin", "change a", "part 2", "change b", "rollback to 2", "wait 7", "commit begun=true failed=<nil>"}},
		{"rollback before begin", [][]byte{RollbackRecord(3), WaitRecord(1), {RecCommit}},
			[]string{"wait 1", "commit begun=false failed=<nil>"}},
		{"part first", [][]byte{PartRecord(4), change("a"), {RecAbort}},
			[]string{"begin", "part 4", "change a", "abort begun=true"}},
		{"part refused", [][]byte{PartRecord(66), PartRecord(4), {RecCommit}},
			[]string{"begin", "part 66", "failed refused", "commit begun=false failed=refused"}},
		{"refused", [][]byte{change("a"), change("x"), change("b"), PartRecord(5), WaitRecord(2), {RecCommit}},
			[]string{"begin", "change a", "change x", "failed refused", "commit begun=false failed=refused"}},
		{"refused then abort", [][]byte{change("x"), {RecAbort}},
			[]string{"begin", "change x", "failed refused", "abort begun=false"}},
		{"empty abort", [][]byte{{RecAbort}}, []string{"abort begun=false"}},
		{"wait for one", [][]byte{AfterRecord(3), change("a"), AfterRecord(9), WaitRecord(4), {RecCommit}},
			[]string{"wait for 3", "begin", "change a", "wait for 9", "wait 4", "commit begun=true failed=<nil>"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			q := newTestQueue(t)
			for _, r := range c.recs {
				if err := q.Push(r); err != nil {
					t.Fatal(err)
				}
			}
			f := &fakeJob{}
			if err := RunJob(ctx, q, f); err != nil {
				t.Fatalf("RunJob: %v", err)
			}
			if !slices.Equal(f.calls, c.want) {
				t.Fatalf("calls:\n%s\nwant:\n%s", strings.Join(f.calls, "\n"), strings.Join(c.want, "\n"))
			}
			if err := q.Push(change("late")); !errors.Is(err, ErrQueueClosed) {
				t.Fatalf("the queue is open after the job's end: Push = %v", err)
			}
		})
	}
}

// TestRunJobFlushes: with no record waiting, a begun job flushes before it waits (the records
// that follow are pushed during the flush); a refused flush rolls the job back.
func TestRunJobFlushes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	q := newTestQueue(t)
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(q.Push(change("a")))
	f := &fakeJob{}
	f.onFlush = func() {
		f.onFlush = nil
		must(q.Push(change("b")))
		must(q.Push([]byte{RecCommit}))
	}
	must(RunJob(ctx, q, f))
	want := []string{"begin", "change a", "flush", "change b", "commit begun=true failed=<nil>"}
	if !slices.Equal(f.calls, want) {
		t.Fatalf("calls %q, want %q", f.calls, want)
	}
	if len(f.states) == 0 || f.states[0] != WorkerApplying {
		t.Fatalf("states %v: the worker was not applying", f.states)
	}

	q = newTestQueue(t)
	must(q.Push(change("a")))
	f = &fakeJob{flushErr: errRefused}
	f.onFlush = func() {
		f.onFlush = nil
		must(q.Push(change("b")))
		must(q.Push([]byte{RecCommit}))
	}
	must(RunJob(ctx, q, f))
	want = []string{"begin", "change a", "flush", "failed refused", "commit begun=false failed=refused"}
	if !slices.Equal(f.calls, want) {
		t.Fatalf("calls %q, want %q", f.calls, want)
	}
}

// TestRunJobErrors: an unreadable record, an unknown kind, and an error the target does not
// take as a refused change end RunJob with that error.
func TestRunJobErrors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, c := range []struct {
		name string
		rec  []byte
		want string
	}{
		{"unreadable", change("bad"), "unreadable"},
		{"unreadable part", PartRecord(99), "unreadable"},
		{"short part", []byte{RecPart, 1}, "short queue record"},
		{"unknown", []byte{'?'}, "unknown queue record"},
		{"short", []byte{RecWait, 1}, "short queue record"},
	} {
		t.Run(c.name, func(t *testing.T) {
			q := newTestQueue(t)
			if err := q.Push(c.rec); err != nil {
				t.Fatal(err)
			}
			f := &fakeJob{}
			err := RunJob(ctx, q, f)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("RunJob = %v, want %q", err, c.want)
			}
			if slices.ContainsFunc(f.calls, func(s string) bool { return strings.HasPrefix(s, "failed") }) {
				t.Fatalf("Failed called: %q", f.calls)
			}
		})
	}
	// A wait the context ends is not a refused change.
	q := newTestQueue(t)
	if err := q.Push(WaitRecord(1)); err != nil {
		t.Fatal(err)
	}
	f := &fakeJob{}
	wctx, wcancel := context.WithCancel(ctx)
	wcancel()
	errWait := &waitJob{fakeJob: f, err: context.Cause(wctx)}
	if err := RunJob(ctx, q, errWait); !errors.Is(err, context.Canceled) {
		t.Fatalf("RunJob = %v, want context.Canceled", err)
	}
}

type waitJob struct {
	*fakeJob
	err error
}

func (w *waitJob) Wait(ctx context.Context, seq uint64) error { return w.err }
