package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgreorder/pgreorder/internal/testing/kafkatest"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var runs atomic.Int64

// TestReadCommitted produces committed and aborted transactions on the topics of a prefix, on
// its offsets topic and on a topic outside it, and checks what the reader prints: the committed
// records of the prefix's topics only, a tombstone's value as null, a record's headers;
// PREFIX.offsets only with -offsets; and a topic created while the reader runs.
func TestReadCommitted(t *testing.T) {
	c := kafkatest.Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := fmt.Sprintf("kr%d_%d", os.Getpid(), runs.Add(1)) // topics of their own, with -count too
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...), kgo.TransactionalID(p+"-producer"),
		kgo.MetadataMinAge(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	create := func(topics ...string) {
		t.Helper()
		resp, err := kadm.NewClient(cl).CreateTopics(ctx, 1, 1, nil, topics...)
		if err == nil {
			err = resp.Error()
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	// Each transaction takes an offset for its commit or abort marker.
	txn := func(end kgo.TransactionEndTry, rs ...*kgo.Record) {
		t.Helper()
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if err := cl.EndTransaction(ctx, end); err != nil {
			t.Fatal(err)
		}
	}
	rec := func(topic, key, value string) *kgo.Record {
		r := &kgo.Record{Topic: topic, Key: []byte(key)}
		if value != "" {
			r.Value = []byte(value)
		}
		return r
	}
	create(p+".public.t", p+".public.u", p+".offsets", p+"x.public.t")
	txn(kgo.TryCommit, rec(p+".public.t", `{"id":1}`, `{"op":"c"}`), rec(p+".public.u", `{"id":7}`, `{"op":"c"}`),
		rec(p+"x.public.t", `{"id":1}`, `{"op":"c"}`), rec(p+".offsets", "slot", "0/1000"))
	txn(kgo.TryAbort, rec(p+".public.t", `{"id":2}`, `{"op":"c","aborted":true}`), rec(p+".public.u", `{"id":8}`, `{"op":"c","aborted":true}`))
	withHeaders := rec(p+".public.u", `{"id":9}`, `{"op":"c"}`)
	withHeaders.Headers = []kgo.RecordHeader{{Key: "trace", Value: []byte("abc")}, {Key: "origin", Value: []byte("test")}}
	txn(kgo.TryCommit, rec(p+".public.t", `{"id":1}`, `{"op":"d"}`), rec(p+".public.t", `{"id":1}`, ""),
		withHeaders, rec(p+".offsets", "slot", "0/2000"))
	committed := []string{
		"topic=" + p + `.public.t partition=0 offset=0 key={"id":1} value={"op":"c"}`,
		"topic=" + p + `.public.u partition=0 offset=0 key={"id":7} value={"op":"c"}`,
		"topic=" + p + `.public.t partition=0 offset=4 key={"id":1} value={"op":"d"}`,
		"topic=" + p + `.public.t partition=0 offset=5 key={"id":1} value=null`,
		"topic=" + p + `.public.u partition=0 offset=4 key={"id":9} headers=trace:abc,origin:test value={"op":"c"}`,
	}
	late := "topic=" + p + `.message partition=0 offset=0 key={"prefix":"p"} value={"op":"m"}`
	positions := []string{
		"topic=" + p + ".offsets partition=0 offset=0 key=slot value=0/1000",
		"topic=" + p + ".offsets partition=0 offset=2 key=slot value=0/2000",
	}

	// What was committed, then a topic created once the reader runs.
	lines, done := start(t, ctx, "-brokers", c.Seeds(), "-topic-prefix", p, "-n", "6")
	expect(t, lines, committed...)
	create(p + ".message")
	txn(kgo.TryCommit, rec(p+".message", `{"prefix":"p"}`, `{"op":"m"}`))
	expect(t, lines, late)
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// Everything again, the positions too.
	lines, done = start(t, ctx, "-brokers", c.Seeds(), "-topic-prefix", p, "-offsets", "-n", "8")
	expect(t, lines, slices.Concat(committed, positions, []string{late})...)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// start runs the reader with args, in-process; it returns the reader's lines and, once it
// returned, its error.
func start(t *testing.T, ctx context.Context, args ...string) (*bufio.Scanner, chan error) {
	pr, pw := io.Pipe()
	t.Cleanup(func() { pr.Close() }) // a reader the test stopped listening to fails its write
	done := make(chan error, 1)
	go func() {
		err := run(ctx, args, pw)
		pw.Close()
		done <- err
	}()
	return bufio.NewScanner(pr), done
}

// expect reads as many lines as want holds and checks they are want's, in any order: the
// reader interleaves partitions. The reader stops at the test's deadline, ending the lines.
func expect(t *testing.T, lines *bufio.Scanner, want ...string) {
	t.Helper()
	var got []string
	for len(got) < len(want) && lines.Scan() {
		got = append(got, lines.Text())
	}
	got, want = slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(want))
	if !slices.Equal(got, want) {
		t.Fatalf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestFlagErrors: a wrong flag is named, and the fix said, before anything is read.
func TestFlagErrors(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String() // a port nothing listens on
	l.Close()
	for _, tt := range []struct {
		args []string
		want string
	}{
		{nil, "missing -brokers: name a broker, such as -brokers 127.0.0.1:9092"},
		{[]string{"-brokers", " , "}, "missing -brokers"},
		{[]string{"-brokers", "127.0.0.1:9092", "-topic-prefix", ""}, `-topic-prefix "": want the prefix`},
		{[]string{"-brokers", "127.0.0.1:9092", "-topic-prefix", "a b"}, `-topic-prefix "a b"`},
		{[]string{"-brokers", "127.0.0.1:9092", "-n", "-1"}, "-n -1: want a number of records"},
		{[]string{"-brokers", "127.0.0.1:9092", "-n", "x"}, `invalid value "x" for flag -n`},
		{[]string{"-brokers", "127.0.0.1:9092", "app"}, `unexpected argument "app": every option is a flag`},
		{[]string{"-topic", "app"}, "flag provided but not defined: -topic"},
		{[]string{"-brokers", closed}, "-brokers " + closed + ": no broker answers"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := run(ctx, tt.args, io.Discard)
		cancel()
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: got error %v, want %q", tt.args, err, tt.want)
		}
	}
	var help bytes.Buffer
	if err := run(context.Background(), []string{"-h"}, &help); err != nil || !strings.Contains(help.String(), "-brokers host:port,...") {
		t.Errorf("-h: %v, printed\n%s", err, help.String())
	}
}
