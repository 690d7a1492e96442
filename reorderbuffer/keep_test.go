package reorderbuffer_test

import (
	"fmt"
	"io/fs"
	"math"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/reorderbuffer"
)

func TestKeep(t *testing.T) {
	t.Run("a kept transaction outlives Next and is freed after Release", func(t *testing.T) {
		mem := reorderbuffer.NewMemory(1 << 20)
		b := newBuffer(t, reorderbuffer.Config{Memory: mem})
		feed(t, b, plainTxn(t, 10, 0x2000, "a", "b")...)
		x, ok := b.Next()
		require.True(t, ok)
		require.Positive(t, x.MemoryBytes())
		require.True(t, x.Keep())
		require.False(t, x.Keep(), "kept twice")
		feed(t, b, plainTxn(t, 11, 0x3000, "c")...)
		y, ok := b.Next()
		require.True(t, ok)
		require.False(t, x.Keep(), "no longer the transaction the last Next returned")
		require.Equal(t, []string{"c"}, values(t, y))
		_, ok = b.Next() // releases y, not x
		require.False(t, ok)
		require.Equal(t, []string{"a", "b"}, values(t, x))
		require.NoError(t, b.CheckInvariants())

		done := make(chan struct{})
		go func() { x.Release(); x.Release(); close(done) }() // any goroutine, twice
		<-done
		for _, err := range x.Changes() {
			require.ErrorIs(t, err, reorderbuffer.ErrReleased)
		}
		require.Zero(t, x.MemoryBytes())
		require.NoError(t, b.CheckInvariants(), "released, not yet freed")
		_, _ = b.Next() // frees it
		require.NoError(t, b.CheckInvariants(), "freed")
		require.NoError(t, b.Ack(x))
		require.NoError(t, b.Ack(y))
		require.Equal(t, decoding.LSN(0x3000), b.AckedThrough())
	})
	t.Run("a spilled transaction is kept with its reader", func(t *testing.T) {
		dir := t.TempDir()
		b, err := reorderbuffer.New(reorderbuffer.Config{WorkMem: reorderbuffer.SpillEverything, Dir: dir})
		require.NoError(t, err)
		feed(t, b, streamTxn(t, 10, true, "a", "b")...)
		feed(t, b, streamCommit(t, 10, 0x2000))
		feed(t, b, streamTxn(t, 11, true, "c")...)
		feed(t, b, streamCommit(t, 11, 0x3000))
		x, ok := b.Next()
		require.True(t, ok)
		require.True(t, x.Spilled())
		require.True(t, x.Keep())
		y, ok := b.Next()
		require.True(t, ok)
		require.True(t, y.Spilled())
		done := make(chan []string)
		go func() { done <- values(t, x) }() // read on another goroutine while y is read here
		require.Equal(t, []string{"c"}, values(t, y))
		require.Equal(t, []string{"a", "b"}, <-done)
		_, _ = b.Next() // releases y; x stays
		require.Equal(t, []string{"a", "b"}, values(t, x), "read again from the start")
		require.NoError(t, b.CheckInvariants())
		x.Release()
		x.Release()     // twice
		_, _ = b.Next() // frees x: its spill log goes
		require.NoError(t, b.CheckInvariants())
		var files []string
		require.NoError(t, filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() && d.Name() != "lock" { // the store's own lock file stays
				files = append(files, path)
			}
			return err
		}))
		require.Empty(t, files, "spill logs left after both were released")
		require.NoError(t, b.Close())
	})
	t.Run("only the transaction Next lent is kept", func(t *testing.T) {
		b := newBuffer(t, reorderbuffer.Config{})
		feed(t, b, plainTxn(t, 10, 0x2000, "a")...)
		x, ok := b.Next()
		require.True(t, ok)
		_, ok = b.Next()
		require.False(t, ok)
		require.False(t, x.Keep(), "released by the Next after it")
		x.Release() // not kept: nothing
	})
	t.Run("Close releases what is still kept", func(t *testing.T) {
		mem := reorderbuffer.NewMemory(1 << 20)
		b, err := reorderbuffer.New(reorderbuffer.Config{Memory: mem, Dir: t.TempDir()})
		require.NoError(t, err)
		feed(t, b, plainTxn(t, 10, 0x2000, "a")...)
		feed(t, b, plainTxn(t, 11, 0x3000, "b")...)
		x, _ := b.Next()
		require.True(t, x.Keep())
		y, _ := b.Next()
		require.True(t, y.Keep())
		y.Release() // returned, not yet freed
		require.NoError(t, b.Close())
		require.Zero(t, mem.Used(), "a closed Buffer counts nothing")
		for _, err := range x.Changes() {
			require.ErrorIs(t, err, reorderbuffer.ErrReleased)
		}
		x.Release() // after Close: nothing
		require.False(t, x.Keep())
		require.NoError(t, b.Close())
	})
	t.Run("a part is kept with its own parser", func(t *testing.T) {
		b := newBuffer(t, reorderbuffer.Config{Incremental: true})
		feed(t, b, streamTxn(t, 10, true, "a")...)
		x, ok := b.Next()
		require.True(t, ok)
		require.Equal(t, reorderbuffer.PartChanges, x.Part)
		require.True(t, x.Keep())
		feed(t, b, streamTxn(t, 10, false, "b")...)
		feed(t, b, streamCommit(t, 10, 0x2000))
		y, ok := b.Next()
		require.True(t, ok)
		require.Equal(t, reorderbuffer.PartChanges, y.Part)
		var p decoding.Parser
		x.UseParser(&p)
		require.Equal(t, []string{"a"}, values(t, x))
		require.Equal(t, []string{"b"}, values(t, y), "the lent part reads with the Buffer's parser meanwhile")
		x.Release()
	})
}

// TestModelKept is the model test with a consumer that keeps the transactions it is handed and
// applies them later, in order, on a goroutine of its own while the Buffer is fed; a transaction
// that cannot be kept (spilled) waits until the kept ones before it are applied. What comes out
// is what the model says, and the Buffer's memory returns within the limit once nothing is kept.
func TestModelKept(t *testing.T) {
	seed := seed(t)
	rounds := 10
	if testing.Short() {
		rounds = 3
	}
	for r := range rounds {
		s := seed + uint64(r)
		g := generate(t, s, 300)
		for i, limit := range []int64{math.MaxInt64, 1 << 20, 4 << 10} {
			incremental := (r+i)%2 == 1
			cfg := reorderbuffer.Config{WorkMem: limit, Dir: t.TempDir(), Incremental: incremental}
			got := runKept(t, g.out, cfg, rand.New(rand.NewPCG(s, uint64(i))))
			require.Equal(t, g.want, got, "seed %d limit %d incremental %v", s, limit, incremental)
		}
	}
}

// runKept feeds the stream to a Buffer whose consumer keeps what it is handed, at random, and
// applies the kept transactions on another goroutine. One assembler serves both goroutines, one
// at a time: the consumer applies a transaction itself only once the other goroutine has applied
// every kept one before it.
func runKept(t *testing.T, stream []wire, cfg reorderbuffer.Config, rng *rand.Rand) []wantTxn {
	t.Helper()
	b, err := reorderbuffer.New(cfg)
	require.NoError(t, err)
	type result struct {
		x    *reorderbuffer.Txn
		out  wantTxn
		done bool
		fail string
	}
	var a assembler
	work := make(chan *reorderbuffer.Txn, 64)
	results := make(chan result, 64)
	go func() { // the applier: reads kept transactions while the Buffer goes on
		defer close(results)
		var p decoding.Parser
		for x := range work {
			x.UseParser(&p)
			r := result{x: x}
			func() {
				ft := &failT{TB: t}
				defer func() {
					if v := recover(); v != nil {
						if v != ft {
							panic(v)
						}
						r.fail = ft.msg
					}
				}()
				r.out, r.done = a.take(ft, x)
			}()
			x.Release()
			results <- r
		}
	}()
	defer close(work)
	var got []wantTxn
	pending := 0
	collect := func(r result) {
		pending--
		require.Empty(t, r.fail)
		if r.done {
			got = append(got, r.out)
			require.NoError(t, b.Ack(r.x))
		} else if r.x.Part != reorderbuffer.Whole {
			require.ErrorIs(t, b.Ack(r.x), reorderbuffer.ErrNotCommit)
		}
	}
	limit := cfg.WorkMem
	for i, w := range stream {
		require.NoError(t, b.Add(w.lsn, w.data), "message %d", i)
		for x, ok := b.Next(); ok; x, ok = b.Next() {
			if (pending > 0 || rng.IntN(2) == 0) && pending < cap(work) && x.Keep() {
				pending++
				work <- x
				continue
			}
			for pending > 0 {
				collect(<-results)
			}
			out, done := a.take(t, x)
			if done {
				got = append(got, out)
				require.NoError(t, b.Ack(x))
			}
		}
		for len(results) > 0 {
			collect(<-results)
		}
		require.NoError(t, b.CheckInvariants(), "after message %d", i)
		if pending == 0 && limit < math.MaxInt64 {
			require.LessOrEqual(t, b.Stats().MemoryBytes, limit+maxChunk, "memory over the limit with nothing kept, after message %d", i)
		}
	}
	for pending > 0 {
		collect(<-results)
	}
	require.Empty(t, a.open, "parts of transactions never ended")
	require.NoError(t, b.Close())
	return got
}

// maxChunk is the reorder buffer's largest chunk: what the Buffer may hold beyond its limit for
// the chunk it fills.
const maxChunk = 64 << 10

// failT turns a failed assertion on a goroutine other than the test's into a panic the goroutine
// recovers and reports.
type failT struct {
	testing.TB
	msg string
}

func (f *failT) Helper() {}

func (f *failT) Errorf(format string, args ...any) { f.msg += fmt.Sprintf(format, args...) }

func (f *failT) FailNow() { panic(f) }
