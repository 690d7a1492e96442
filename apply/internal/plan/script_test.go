package plan

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/decoding"
)

var update = flag.Bool("update", false, "rewrite the expectations of testdata/*.txt with what the scripts produce")

// A script is a sequence of blocks: lines of events, one per line, then a line "----", then
// the output the events are expected to produce, up to a blank line. Lines starting with # are
// comments. Each file is one state: the acknowledgements, a group, the chain of runs and the
// open run.
//
// Events (arguments are key=value; times are milliseconds from an epoch, positions are LSNs):
//
//	commit seq=N end=L [progress=L] [before=N] [durable] [name=S]   Acks.Committed
//	take prefix=N          Acks.Take: prints the commits acknowledged
//	ready prefix=N         prints HeadReady and Unflushed
//	flushed seq=N pos=L    Acks.MarkFlushed
//	position done=N        prints Acks.Position
//	persist pos=L          Acks.Persist
//	quiet on|off           Acks.Quiet
//	sync at=T [delay=T]    prints Acks.SyncCommit (delay: 10 unless given)
//	acks                   prints the state of the acknowledgements
//	group-add at=T [changes=N]   Group.Add, then N changes
//	group-full at=T        prints Group.Full
//	group-reset            Group.Reset
//	group                  prints the group
//	run-open seq=N at=T    Chain.Opened of a new run
//	run-txn [changes=N] [wait=prev|serial|none]   a transaction joins the open run: with changes,
//	                       the first one notes Change, and Waited with what its dependencies queued
//	run-full [max=N]       prints Run.Full
//	run-expired at=T       prints Run.Expired
//	run-seal               Chain.Sealed: prints whether the runs go back to the workers
//	group-commit           Chain.GroupCommitted
//	chain                  prints the chain's state
//	wait-prefix seq=N committed=N   prints Waits.Prefix of the open run
//	wait-on seq=N [finished]        prints Waits.On of the open run
//	startable done=N [relaxed] [full] [finished=N,N]   prints Waits.Startable of the open run
func TestScripts(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) { runScript(t, f) })
	}
}

type block struct {
	events []string // with their comments, as written
	want   []string
}

func parseScript(t *testing.T, path string) (blocks []block, tail []string) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	var cur block
	inWant := false
	for sc.Scan() {
		line := sc.Text()
		switch {
		case inWant && line == "":
			blocks, cur, inWant = append(blocks, cur), block{}, false
		case inWant:
			cur.want = append(cur.want, line)
		case line == "----":
			inWant = true
		default:
			cur.events = append(cur.events, line)
		}
	}
	if inWant {
		blocks = append(blocks, cur)
		cur = block{}
	}
	return blocks, cur.events
}

func runScript(t *testing.T, path string) {
	blocks, tail := parseScript(t, path)
	for _, l := range tail {
		if strings.TrimSpace(l) != "" && !strings.HasPrefix(l, "#") {
			t.Fatalf("%s: events without a ---- line after them: %q", path, l)
		}
	}
	st := &scriptState{}
	var out strings.Builder
	failed := false
	for i := range blocks {
		b := &blocks[i]
		var got []string
		for _, l := range b.events {
			if strings.TrimSpace(l) == "" || strings.HasPrefix(l, "#") {
				continue
			}
			lines, err := st.do(l)
			if err != nil {
				t.Fatalf("%s: %q: %v", path, l, err)
			}
			got = append(got, lines...)
		}
		if !*update && !slices.Equal(got, b.want) {
			t.Errorf("%s, block %d (%s):\ngot:\n%s\nwant:\n%s", path, i+1, firstEvent(b.events),
				strings.Join(got, "\n"), strings.Join(b.want, "\n"))
			failed = true
		}
		for _, l := range b.events {
			out.WriteString(l + "\n")
		}
		out.WriteString("----\n")
		for _, l := range got {
			out.WriteString(l + "\n")
		}
		out.WriteString("\n")
	}
	for _, l := range tail {
		out.WriteString(l + "\n")
	}
	if *update && !failed {
		if err := os.WriteFile(path, []byte(strings.TrimSuffix(out.String(), "\n")), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func firstEvent(events []string) string {
	for _, l := range events {
		if strings.TrimSpace(l) != "" && !strings.HasPrefix(l, "#") {
			return l
		}
	}
	return ""
}

type scriptState struct {
	acks  Acks[string]
	group Group
	chain Chain
	run   *Run
	waits Waits
}

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

type args map[string]string

func (a args) num(t string) (uint64, error) {
	v, ok := a[t]
	if !ok {
		return 0, fmt.Errorf("missing %s=", t)
	}
	return strconv.ParseUint(v, 10, 64)
}

func (a args) lsn(t string) (decoding.LSN, error) {
	v, ok := a[t]
	if !ok {
		return 0, nil
	}
	return decoding.ParseLSN(v)
}

func (a args) at(t string) (time.Time, error) {
	n, err := a.num(t)
	return epoch.Add(time.Duration(n) * time.Millisecond), err
}

func (a args) has(t string) bool { _, ok := a[t]; return ok }

func (st *scriptState) do(line string) ([]string, error) {
	fields := strings.Fields(line)
	cmd, a := fields[0], args{}
	for _, f := range fields[1:] {
		k, v, _ := strings.Cut(f, "=")
		a[k] = v
	}
	var first error
	num := func(k string) uint64 {
		n, err := a.num(k)
		if first == nil {
			first = err
		}
		return n
	}
	opt := func(k string) uint64 {
		if !a.has(k) {
			return 0
		}
		return num(k)
	}
	lsn := func(k string) decoding.LSN {
		l, err := a.lsn(k)
		if first == nil {
			first = err
		}
		return l
	}
	at := func(k string) time.Time {
		t, err := a.at(k)
		if first == nil {
			first = err
		}
		return t
	}
	var out []string
	say := func(format string, v ...any) { out = append(out, fmt.Sprintf(format, v...)) }
	needRun := func() bool {
		if st.run == nil && first == nil {
			first = fmt.Errorf("no open run")
		}
		return st.run != nil
	}
	switch cmd {
	case "commit":
		name := a["name"]
		if name == "" {
			name = "seq" + a["seq"]
		}
		c := Commit[string]{Seq: num("seq"), End: lsn("end"), Progress: lsn("progress"), Before: opt("before"), Value: name}
		st.acks.Committed(c, a.has("durable"))
	case "take":
		ready := st.acks.Take(num("prefix"))
		if len(ready) == 0 {
			say("ack none")
		}
		for _, c := range ready {
			say("ack %s seq=%d end=%s", c.Value, c.Seq, c.End)
		}
	case "ready":
		p := num("prefix")
		say("head-ready=%v unflushed=%v", st.acks.HeadReady(p), st.acks.Unflushed(p))
	case "flushed":
		st.acks.MarkFlushed(num("seq"), lsn("pos"))
	case "position":
		say("position %s", st.acks.Position(num("done")))
	case "persist":
		st.acks.Persist(lsn("pos"))
	case "quiet":
		st.acks.Quiet = len(fields) > 1 && fields[1] == "on"
	case "sync":
		delay := 10 * time.Millisecond
		if a.has("delay") {
			delay = time.Duration(num("delay")) * time.Millisecond
		}
		say("sync=%v", st.acks.SyncCommit(at("at"), delay))
	case "acks":
		var seqs []string
		for _, c := range st.acks.list {
			d := ""
			if c.Durable {
				d = "!"
			}
			seqs = append(seqs, fmt.Sprintf("%d%s", c.Seq, d))
		}
		say("acks pending=[%s] flushed=%d persisted=%s quiet=%v", strings.Join(seqs, " "), st.acks.Flushed, st.acks.Persisted, st.acks.Quiet)
	case "group-add":
		st.group.Add(at("at"))
		st.group.Changes += int(opt("changes"))
	case "group-full":
		say("full=%v", st.group.Full(at("at")))
	case "group-reset":
		st.group.Reset()
	case "group":
		say("group open=%v txns=%d changes=%d", st.group.Open(), st.group.Txns, st.group.Changes)
	case "run-open":
		st.run, st.waits = &Run{Opened: at("at")}, Waits{}
		st.chain.Opened(st.run, num("seq"))
		say("run seq=%d after-run=%v probe=%v", st.run.Seq, st.run.AfterRun, st.run.Probe)
	case "run-txn":
		if !needRun() {
			break
		}
		r := st.run
		r.Txns++
		for range opt("changes") {
			r.Change()
			r.Changes++
			switch a["wait"] {
			case "prev":
				st.waits.Prefix(r.Seq-1, 0)
				r.Waited(false, st.waits.OnPrev(r.Seq))
			case "serial":
				r.Waited(true, st.waits.OnPrev(r.Seq))
			default:
				r.Waited(false, st.waits.OnPrev(r.Seq))
			}
		}
	case "run-full":
		if needRun() {
			say("full=%v chained=%v", st.run.Full(int(opt("max"))), st.run.Chained())
		}
	case "run-expired":
		if needRun() {
			say("expired=%v", st.run.Expired(at("at")))
		}
	case "run-seal":
		if needRun() {
			say("handback=%v chained=%v", st.chain.Sealed(st.run), st.run.Chained())
			st.run = nil
		}
	case "group-commit":
		st.chain.GroupCommitted()
	case "chain":
		c := &st.chain
		say("chain leads=%v probing=%v streak=%d groups=%d interval=%d", c.Leads(), c.Probing(), c.streak, c.groups, c.interval())
	case "wait-prefix":
		say("queue=%v", st.waits.Prefix(num("seq"), num("committed")))
	case "wait-on":
		say("queue=%v", st.waits.On(num("seq"), a.has("finished")))
	case "startable":
		var fin []uint64
		if f := a["finished"]; f != "" {
			for _, s := range strings.Split(f, ",") {
				n, err := strconv.ParseUint(s, 10, 64)
				if err != nil {
					return nil, err
				}
				fin = append(fin, n)
			}
		}
		seq := uint64(0)
		if st.run != nil {
			seq = st.run.Seq
		}
		say("startable=%v", st.waits.Startable(seq, a.has("full"), a.has("relaxed"), num("done"),
			func(s uint64) bool { return slices.Contains(fin, s) }))
	default:
		return nil, fmt.Errorf("unknown event %q", cmd)
	}
	return out, first
}
