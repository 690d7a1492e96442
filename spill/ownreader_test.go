package spill_test

import (
	"bytes"
	"fmt"
	"io"
	"testing"

	"github.com/pgreorder/pgreorder/spill"
)

// TestOpenReaderOnItsOwn reads a log with a reader of OpenReader on another goroutine while the
// store goes on: other logs are appended (through the shared write buffer), read and removed
// under a budget of one open file. Rewind reads the log again; Close hands the file back.
func TestOpenReaderOnItsOwn(t *testing.T) {
	s := openStore(t, spill.Options{MaxOpenFiles: 1, BufferSize: 4096})
	l := create(t, s)
	var want [][]byte
	for i := range 3000 {
		rec := []byte(fmt.Sprintf("record %d of the log being read", i))
		want = append(want, rec)
		if err := l.Append(rec); err != nil {
			t.Fatal(err)
		}
	}
	r := l.OpenReader()
	done := make(chan error)
	go func() {
		var err error
		for pass := range 2 {
			r.Rewind()
			for i := 0; ; i++ {
				rec, e := r.Next()
				if e == io.EOF {
					if i != len(want) {
						err = fmt.Errorf("pass %d: %d records, want %d", pass, i, len(want))
					}
					break
				}
				if e != nil || !bytes.Equal(rec, want[i]) {
					err = fmt.Errorf("pass %d: record %d: %q, %v", pass, i, rec, e)
					break
				}
			}
		}
		done <- err
	}()
	for i := range 200 {
		o := create(t, s)
		for j := range 50 {
			if err := o.Append([]byte(fmt.Sprintf("other %d %d", i, j))); err != nil {
				t.Fatal(err)
			}
		}
		if got, err := readAll(o); err != nil || len(got) != 50 {
			t.Fatalf("other log %d: %d records, %v", i, len(got), err)
		}
		_ = l.Size()
		if err := o.Remove(); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	r.Close()
	if _, err := r.Next(); err != spill.ErrClosed {
		t.Fatalf("Next after Close: %v", err)
	}
	// The file is back in the store's hands: the log works as before.
	if got, err := readAll(l); err != nil || len(got) != len(want) {
		t.Fatalf("after Close: %d records, %v", len(got), err)
	}
	if err := l.Append([]byte("more")); err != nil {
		t.Fatal(err)
	}
	if got, err := readAll(l); err != nil || len(got) != len(want)+1 {
		t.Fatalf("after Append: %d records, %v", len(got), err)
	}
}

func TestOpenReaderEmptyAndClosed(t *testing.T) {
	s := openStore(t, spill.Options{})
	l := create(t, s)
	r := l.OpenReader()
	if _, err := r.Next(); err != io.EOF {
		t.Fatalf("empty log: %v", err)
	}
	r.Close()
	if err := l.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.OpenReader().Next(); err != spill.ErrClosed {
		t.Fatalf("removed log: %v", err)
	}
}
