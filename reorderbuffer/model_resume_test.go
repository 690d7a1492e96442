package reorderbuffer_test

import (
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/reorderbuffer"
)

// The resume model test drives a Buffer the way a real consumer does, against a simulated
// server: the consumer reads transactions as they come, acknowledges them later and out of
// order, reports its flush position now and then, loses its connection (Buffer.Restart, the
// server sends again from the confirmed position) and crashes (a new Buffer resumed from the
// acknowledged prefix). The server follows PostgreSQL's rule for what it sends again after a
// restart at confirmed position P: every transaction whose commit, PREPARE or abort is at or after
// P, whole, and non-transactional messages at or after P.
//
// What must hold: within one Buffer's life, the transactions handed out are exactly those of
// the model that end after its skip position, in commit order, each once, with the model's
// contents (relations resolved as of each transaction's position); across crashes the
// acknowledged transactions cover the model exactly; memory stays within the limit; the
// buffer's invariants hold after every step.

// server replays a generated stream.
type server struct {
	all  []wire
	list []wire // this session's messages
	pos  int

	// For each message, if it is an insert of a non-streamed transaction: its relation, and
	// the relation's latest description in the generated stream up to it. A new session
	// describes a relation again before its first use, as pgoutput's per-session cache does.
	rel  []uint32
	desc [][]byte

	last decoding.LSN // position of the last message sent in this session: a keepalive's walEnd
}

func newServer(t testing.TB, all []wire) *server {
	s := &server{all: all, rel: make([]uint32, len(all)), desc: make([][]byte, len(all))}
	dec := decoding.NewDecoder(decoding.Options{})
	latest := map[uint32][]byte{}
	for i, w := range all {
		m, err := dec.Decode(w.data)
		require.NoError(t, err)
		switch m := m.(type) {
		case *decoding.Relation:
			r := *m
			r.Xid = 0
			latest[r.RelationID], err = decoding.Append(nil, &r, false, decoding.Options{})
			require.NoError(t, err)
		case *decoding.Insert:
			if !dec.InStream() {
				s.rel[i], s.desc[i] = m.RelationID, latest[m.RelationID]
			}
		}
	}
	return s
}

// session starts a new replication session at confirmed position p.
func (s *server) session(p decoding.LSN, first bool) {
	s.list, s.pos, s.last = s.list[:0], 0, 0
	described := map[uint32]bool{}
	for i, w := range s.all {
		if !first && (w.decide == 0 || w.decide < p) {
			continue
		}
		if rel := s.rel[i]; rel != 0 && !described[rel] && !first {
			s.list = append(s.list, wire{lsn: 0, data: s.desc[i]})
		}
		if s.rel[i] != 0 {
			described[s.rel[i]] = true
		}
		s.list = append(s.list, w)
	}
}

type consumer struct {
	t       *testing.T
	rng     *rand.Rand
	cfg     reorderbuffer.Config
	b       *reorderbuffer.Buffer
	srv     *server
	want    []wantTxn
	expect  []wantTxn // what this Buffer must still hand out, in order
	handed  []*reorderbuffer.Txn
	acked   map[decoding.LSN]bool // end LSNs acknowledged, over all lives (durable)
	confirm decoding.LSN          // the server's confirmed position
	flushed decoding.LSN          // the last flush position of this Buffer
	parts   assembler             // with Config.Incremental: transactions being applied
}

// start makes a new Buffer resumed at skip (the consumer's durable position) and a new session.
func (c *consumer) start(skip decoding.LSN, first bool) {
	c.t.Helper()
	cfg := c.cfg
	cfg.SkipThrough = skip
	b, err := reorderbuffer.New(cfg)
	require.NoError(c.t, err)
	c.b = b
	c.handed = nil
	c.flushed = 0
	c.parts = assembler{} // a crash loses what was being applied
	c.expect = c.expect[:0]
	for _, w := range c.want {
		if w.end > skip {
			c.expect = append(c.expect, w)
		}
	}
	c.srv.session(c.confirm, first)
}

func (c *consumer) check(step int) {
	c.t.Helper()
	require.NoError(c.t, c.b.CheckInvariants(), "step %d", step)
	st := c.b.Stats()
	limit := max(c.cfg.WorkMem, 0)
	require.LessOrEqual(c.t, st.MemoryBytes, limit, "step %d: memory over the limit", step)
}

// next hands out what is ready and checks it against the model.
func (c *consumer) next(step int) bool {
	x, ok := c.b.Next()
	if !ok {
		return false
	}
	got, done := c.parts.take(c.t, x)
	if !done {
		return true
	}
	require.NotEmpty(c.t, c.expect, "step %d: handed out %d (end %s), the model has nothing more", step, x.Xid, x.EndLSN)
	require.Equal(c.t, c.expect[0], got, "step %d: handed out out of order, twice, or with other contents", step)
	c.expect = c.expect[1:]
	c.handed = append(c.handed, x)
	return true
}

func (c *consumer) ackOne() {
	if len(c.handed) == 0 {
		return
	}
	i := c.rng.IntN(len(c.handed))
	x := c.handed[i]
	c.handed = slices.Delete(c.handed, i, i+1)
	require.NoError(c.t, c.b.Ack(x))
	c.acked[x.EndLSN] = true
}

func TestModelResume(t *testing.T) {
	seed := seed(t)
	rounds := 40
	if testing.Short() {
		rounds = 8
	}
	for r := range rounds {
		s := seed + uint64(r)
		for _, limit := range []int64{math.MaxInt64, 4 << 10, reorderbuffer.SpillEverything} {
			resumeRound(t, s, 200, limit, r%2 == 1)
		}
	}
}

// TestModelResumeFound replays rounds that once failed, whatever seed the run draws.
func TestModelResumeFound(t *testing.T) {
	for _, r := range []struct {
		seed        uint64
		limit       int64
		incremental bool
	}{
		// A streamed prepared transaction, committed and acknowledged, sent again after a
		// restart from a confirmed position before its PREPARE; a second restart, once the
		// flush position passed its COMMIT PREPARED, came before that was sent again: the
		// PREPARE held it, and its parts stayed open for good.
		{1796151855448593491, math.MaxInt64, true},
	} {
		resumeRound(t, r.seed, 200, r.limit, r.incremental)
	}
}

// FuzzModelResume runs the resume model with fuzzer-chosen seeds, sizes and memory limits.
func FuzzModelResume(f *testing.F) {
	f.Add(uint64(1), uint16(200), uint8(0), false)
	f.Add(uint64(2), uint16(50), uint8(1), true)
	f.Add(uint64(3), uint16(300), uint8(2), true)
	f.Fuzz(func(t *testing.T, seed uint64, steps uint16, limit uint8, incremental bool) {
		limits := []int64{math.MaxInt64, 4 << 10, reorderbuffer.SpillEverything, 64 << 10}
		resumeRound(t, seed, int(steps%400), limits[int(limit)%len(limits)], incremental)
	})
}

// resumeRound generates a stream from seed and consumes it with restarts and crashes.
func resumeRound(t *testing.T, s uint64, steps int, limit int64, incremental bool) {
	g := generate(t, s, steps)
	dir := t.TempDir()
	c := &consumer{
		t: t, rng: rand.New(rand.NewPCG(s, 7)), cfg: reorderbuffer.Config{WorkMem: limit, Dir: dir, Incremental: incremental},
		srv: newServer(t, g.out), want: g.want, acked: map[decoding.LSN]bool{},
	}
	c.start(0, true)
	restarts, crashes := 0, 0
	debug := os.Getenv("PGREORDER_DEBUG") != ""
	for step := 0; ; step++ {
		if debug {
			t.Logf("step %d confirm %s flushed %s acked %s", step, c.confirm, c.flushed, c.b.AckedThrough())
		}
		switch a := c.rng.IntN(100); {
		case a < 55:
			if c.srv.pos < len(c.srv.list) {
				w := c.srv.list[c.srv.pos]
				c.srv.pos++
				if debug {
					m, _ := decoding.Parse(w.data, false, decoding.Options{})
					t.Logf("  add %s %T %+v decide %s", w.lsn, m, m, w.decide)
				}
				require.NoError(t, c.b.Add(w.lsn, w.data), "seed %d limit %d step %d", s, limit, step)
				c.srv.last = max(c.srv.last, w.lsn)
			}
		case a < 60:
			c.b.Keepalive(c.srv.last)
		case a < 75:
			c.next(step)
		case a < 90:
			c.ackOne()
		case a < 96:
			// The server never moves its confirmed position back; a new Buffer starts from
			// nothing received.
			f := c.b.FlushPosition()
			require.LessOrEqual(t, c.flushed, f, "flush position went back")
			c.flushed = f
			c.confirm = max(c.confirm, f)
		case a < 98 && restarts < 6:
			restarts++
			if debug {
				t.Logf("  restart")
			}
			require.NoError(t, c.b.Restart())
			c.srv.session(c.confirm, false)
		case a < 99 && crashes < 3:
			crashes++
			durable := c.b.AckedThrough()
			if debug {
				t.Logf("  crash, durable %s", durable)
			}
			require.NoError(t, c.b.Close())
			c.start(durable, false)
		}
		c.check(step)
		if c.srv.pos == len(c.srv.list) {
			// The stream is over: drain and acknowledge everything.
			for c.next(step) {
			}
			for len(c.handed) > 0 {
				c.ackOne()
			}
			c.check(step)
			break
		}
	}
	require.Empty(t, c.expect, "seed %d limit %d: transactions never handed out", s, limit)
	require.Empty(t, c.parts.open, "seed %d limit %d: parts of transactions never ended", s, limit)
	for _, w := range g.want {
		require.True(t, c.acked[w.end], "seed %d limit %d: transaction ending at %s never acknowledged", s, limit, w.end)
	}
	require.NoError(t, c.b.Close())
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Empty(t, ents, "spill files left after Close (seed %d)", s)
}
