package decoding_test

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/tools/capture"
)

var update = flag.Bool("update", false, "rewrite testdata/golden from the captures")

// captureOpts gives the options each capture was read with (see its header comments).
var captureOpts = map[string]decoding.Options{
	"pg15-proto1-nostream.txt": {ProtoVersion: 1},
	"pg15-proto2-binary.txt":   {ProtoVersion: 2},
	"pg15-proto2-stream.txt":   {ProtoVersion: 2, AbortInfo: decoding.AbortInfoNever},
	"pg15-proto3-twophase.txt": {ProtoVersion: 3, AbortInfo: decoding.AbortInfoNever},
	"pg18-proto1-nostream.txt": {ProtoVersion: 1},
	"pg18-proto4-parallel.txt": {ProtoVersion: 4, AbortInfo: decoding.AbortInfoAlways},
}

type record struct {
	lsn  decoding.LSN
	data []byte
}

func readCapture(t testing.TB, name string) []record {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", "captures", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := capture.NewReader(f)
	var recs []record
	for {
		rec, err := r.Next()
		if err == io.EOF {
			return recs
		}
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, record{rec.LSN, bytes.Clone(rec.Data)})
	}
}

func captureNames(t testing.TB) []string {
	names, err := filepath.Glob(filepath.Join("testdata", "captures", "*.txt"))
	if err != nil || len(names) == 0 {
		t.Fatalf("no captures: %v", err)
	}
	for i, n := range names {
		names[i] = filepath.Base(n)
		if _, ok := captureOpts[names[i]]; !ok {
			t.Fatalf("capture %s has no entry in captureOpts", names[i])
		}
	}
	return names
}

// describe renders a message for the golden files.
func describe(m decoding.Message) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%v", m.Type())
	tm := func(name string, t time.Time) {
		fmt.Fprintf(&b, " %s=%s", name, t.Format("2006-01-02T15:04:05.000000Z"))
	}
	switch v := m.(type) {
	case *decoding.Begin:
		fmt.Fprintf(&b, " xid=%d final_lsn=%s", v.Xid, v.FinalLSN)
		tm("commit_time", v.CommitTime)
	case *decoding.Commit:
		fmt.Fprintf(&b, " flags=%d commit_lsn=%s end_lsn=%s", v.Flags, v.CommitLSN, v.EndLSN)
		tm("commit_time", v.CommitTime)
	case *decoding.Origin:
		fmt.Fprintf(&b, " lsn=%s name=%q", v.CommitLSN, v.Name)
	case *decoding.Relation:
		fmt.Fprintf(&b, " xid=%d id=%d %q.%q replident=%c columns=[", v.Xid, v.RelationID, v.Namespace, v.Name, v.ReplicaIdentity)
		for i, c := range v.Columns {
			if i > 0 {
				b.WriteString(" ")
			}
			fmt.Fprintf(&b, "%s:%d/%d", c.Name, c.TypeOID, c.TypeMod)
			if c.IsKey() {
				b.WriteString(":key")
			}
		}
		b.WriteString("]")
	case *decoding.DataType:
		fmt.Fprintf(&b, " xid=%d oid=%d %q.%q", v.Xid, v.TypeOID, v.Namespace, v.Name)
	case *decoding.Insert:
		fmt.Fprintf(&b, " xid=%d rel=%d new=%s", v.Xid, v.RelationID, tuple(v.New))
	case *decoding.Update:
		fmt.Fprintf(&b, " xid=%d rel=%d", v.Xid, v.RelationID)
		if v.OldKind != 0 {
			fmt.Fprintf(&b, " old(%c)=%s", v.OldKind, tuple(v.Old))
		}
		fmt.Fprintf(&b, " new=%s", tuple(v.New))
	case *decoding.Delete:
		fmt.Fprintf(&b, " xid=%d rel=%d old(%c)=%s", v.Xid, v.RelationID, v.OldKind, tuple(v.Old))
	case *decoding.Truncate:
		fmt.Fprintf(&b, " xid=%d options=%d cascade=%t restart_identity=%t rels=%v", v.Xid, v.Options,
			v.Options&decoding.TruncateCascade != 0, v.Options&decoding.TruncateRestartIdentity != 0, v.RelationIDs)
	case *decoding.LogicalMessage:
		fmt.Fprintf(&b, " xid=%d transactional=%t lsn=%s prefix=%q content=%q", v.Xid, v.Transactional(), v.LSN, v.Prefix, v.Content)
	case *decoding.StreamStart:
		fmt.Fprintf(&b, " xid=%d first_segment=%t", v.Xid, v.FirstSegment)
	case *decoding.StreamStop:
	case *decoding.StreamCommit:
		fmt.Fprintf(&b, " xid=%d flags=%d commit_lsn=%s end_lsn=%s", v.Xid, v.Flags, v.CommitLSN, v.EndLSN)
		tm("commit_time", v.CommitTime)
	case *decoding.StreamAbort:
		fmt.Fprintf(&b, " xid=%d subxid=%d", v.Xid, v.SubXid)
		if v.HasAbortInfo {
			fmt.Fprintf(&b, " abort_lsn=%s", v.AbortLSN)
			tm("abort_time", v.AbortTime)
		}
	case *decoding.BeginPrepare:
		fmt.Fprintf(&b, " xid=%d gid=%q prepare_lsn=%s end_lsn=%s", v.Xid, v.GID, v.PrepareLSN, v.EndLSN)
		tm("prepare_time", v.PrepareTime)
	case *decoding.Prepare:
		fmt.Fprintf(&b, " xid=%d gid=%q flags=%d prepare_lsn=%s end_lsn=%s", v.Xid, v.GID, v.Flags, v.PrepareLSN, v.EndLSN)
		tm("prepare_time", v.PrepareTime)
	case *decoding.StreamPrepare:
		fmt.Fprintf(&b, " xid=%d gid=%q flags=%d prepare_lsn=%s end_lsn=%s", v.Xid, v.GID, v.Flags, v.PrepareLSN, v.EndLSN)
		tm("prepare_time", v.PrepareTime)
	case *decoding.CommitPrepared:
		fmt.Fprintf(&b, " xid=%d gid=%q flags=%d commit_lsn=%s end_lsn=%s", v.Xid, v.GID, v.Flags, v.CommitLSN, v.EndLSN)
		tm("commit_time", v.CommitTime)
	case *decoding.RollbackPrepared:
		fmt.Fprintf(&b, " xid=%d gid=%q flags=%d prepare_end_lsn=%s rollback_end_lsn=%s", v.Xid, v.GID, v.Flags, v.PrepareEndLSN, v.RollbackEndLSN)
		tm("prepare_time", v.PrepareTime)
		tm("rollback_time", v.RollbackTime)
	default:
		panic(fmt.Sprintf("describe: %T", m))
	}
	return b.String()
}

func tuple(t decoding.Tuple) string {
	var b strings.Builder
	b.WriteString("(")
	for i, c := range t {
		if i > 0 {
			b.WriteString(" ")
		}
		switch c.Kind {
		case decoding.ColumnText:
			d := string(c.Data)
			if len(d) > 24 {
				d = fmt.Sprintf("%s…[%d bytes]", d[:16], len(c.Data))
			}
			fmt.Fprintf(&b, "t%q", d)
		case decoding.ColumnBinary:
			fmt.Fprintf(&b, "b%x", c.Data)
		default:
			b.WriteByte(c.Kind)
		}
	}
	b.WriteString(")")
	return b.String()
}

// decodeCapture runs a capture through a Decoder and renders one line per message, with the
// header's xid (which the Decoder fills in for changes inside Begin…Commit).
func decodeCapture(t *testing.T, name string) (string, map[string]bool) {
	t.Helper()
	d := decoding.NewDecoder(captureOpts[name])
	hd := decoding.NewDecoder(captureOpts[name]) // the header path, as a reorder buffer drives it
	seen := map[string]bool{}
	var out strings.Builder
	for i, rec := range readCapture(t, name) {
		inStream := d.InStream() && rec.data[0] != byte(decoding.MsgStreamStart)
		m, err := d.Decode(rec.data)
		if err != nil {
			t.Fatalf("%s: message %d (%s): %v", name, i, rec.lsn, err)
		}
		h, err := hd.Accept(rec.data)
		if err != nil {
			t.Fatalf("%s: message %d (%s): Next: %v", name, i, rec.lsn, err)
		}
		// The stateless header agrees with the Decoder where both know the xid.
		ph, err := decoding.ParseHeader(rec.data, inStream)
		if err != nil {
			t.Fatalf("%s: message %d: ParseHeader: %v", name, i, err)
		}
		if ph.Type != m.Type() || h.Type != m.Type() || h.InStream != inStream && h.Type != decoding.MsgStreamStop {
			t.Fatalf("%s: message %d: headers %+v and %+v, message %v", name, i, ph, h, m.Type())
		}
		if ph.Xid != 0 && ph.Xid != h.Xid {
			t.Fatalf("%s: message %d: ParseHeader xid %d, Next xid %d", name, i, ph.Xid, h.Xid)
		}
		// Round trip: Append(Parse(x)) == x for real server output.
		again, err := decoding.Append(nil, m, inStream, captureOpts[name])
		if err != nil || !bytes.Equal(again, rec.data) {
			t.Fatalf("%s: message %d: Append = %x, %v; want %x", name, i, again, err, rec.data)
		}
		fmt.Fprintf(&out, "%s hdr.xid=%d %s\n", rec.lsn, h.Xid, describe(m))
		for _, f := range features(m) {
			seen[f] = true
		}
	}
	if d.InStream() || d.InTransaction() {
		t.Errorf("%s: capture ends inside a transaction or block", name)
	}
	return out.String(), seen
}

// features names what a message exercises, for the coverage test.
func features(m decoding.Message) []string {
	fs := []string{m.Type().String()}
	cols := func(t decoding.Tuple) {
		for _, c := range t {
			fs = append(fs, "column "+string(c.Kind))
		}
	}
	switch v := m.(type) {
	case *decoding.Insert:
		cols(v.New)
	case *decoding.Update:
		cols(v.Old)
		cols(v.New)
		if v.OldKind != 0 {
			fs = append(fs, "Update "+string(v.OldKind))
		}
	case *decoding.Delete:
		cols(v.Old)
		fs = append(fs, "Delete "+string(v.OldKind))
	case *decoding.Truncate:
		fs = append(fs, fmt.Sprintf("Truncate options %d", v.Options))
	case *decoding.LogicalMessage:
		fs = append(fs, fmt.Sprintf("Message transactional=%t", v.Transactional()))
	case *decoding.StreamAbort:
		fs = append(fs, fmt.Sprintf("Stream Abort sub=%t abort_info=%t", v.SubXid != v.Xid, v.HasAbortInfo))
	case *decoding.StreamStart:
		fs = append(fs, fmt.Sprintf("Stream Start first=%t", v.FirstSegment))
	}
	return fs
}

func TestGolden(t *testing.T) {
	for _, name := range captureNames(t) {
		t.Run(name, func(t *testing.T) {
			got, _ := decodeCapture(t, name)
			path := filepath.Join("testdata", "golden", name)
			if *update {
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test -update to create it)", err)
			}
			if got != string(want) {
				gl, wl := strings.Split(got, "\n"), strings.Split(string(want), "\n")
				for i := range min(len(gl), len(wl)) {
					if gl[i] != wl[i] {
						t.Fatalf("line %d:\n got: %s\nwant: %s\n(run go test -update if the change is intended)", i+1, gl[i], wl[i])
					}
				}
				t.Fatalf("got %d lines, want %d (run go test -update if intended)", len(gl), len(wl))
			}
		})
	}
}

// TestGoldenCoverage asserts that the real-server captures contain every message type of
// protocols 1 to 4 and the variants the decoder must handle.
func TestGoldenCoverage(t *testing.T) {
	seen := map[string]bool{}
	for _, name := range captureNames(t) {
		_, s := decodeCapture(t, name)
		for f := range s {
			seen[f] = true
		}
	}
	want := []string{
		"column n", "column u", "column t", "column b",
		"Update K", "Update O", "Delete K", "Delete O", "Truncate options 3",
		"Message transactional=true", "Message transactional=false",
		"Stream Abort sub=true abort_info=false", "Stream Abort sub=false abort_info=false",
		"Stream Abort sub=true abort_info=true", "Stream Start first=true",
	}
	for _, c := range "BCORYIUDTMSEcAbPKrp" {
		want = append(want, decoding.MessageType(c).String())
	}
	for _, f := range want {
		if !seen[f] {
			t.Errorf("no capture has %s", f)
		}
	}
}
