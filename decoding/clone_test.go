package decoding_test

import (
	"bytes"
	"reflect"
	"testing"
	"unsafe"

	"github.com/pgreorder/pgreorder/decoding"
)

// sharedSlice returns the path of a non-empty slice of a that shares its backing array with the
// corresponding slice of b, or "" if none does.
func sharedSlice(a, b reflect.Value, path string) string {
	switch a.Kind() {
	case reflect.Pointer, reflect.Interface:
		if a.IsNil() || b.IsNil() {
			return ""
		}
		return sharedSlice(a.Elem(), b.Elem(), path)
	case reflect.Struct:
		for i := range a.NumField() {
			if p := sharedSlice(a.Field(i), b.Field(i), path+"."+a.Type().Field(i).Name); p != "" {
				return p
			}
		}
	case reflect.Slice:
		if a.Len() > 0 && b.Len() > 0 && a.Pointer() == b.Pointer() {
			return path
		}
		for i := range min(a.Len(), b.Len()) {
			if p := sharedSlice(a.Index(i), b.Index(i), path+"[]"); p != "" {
				return p
			}
		}
	}
	return ""
}

// inside reports whether any byte slice reachable from v points into buf.
func inside(v reflect.Value, buf []byte) bool {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		return !v.IsNil() && inside(v.Elem(), buf)
	case reflect.Struct:
		for i := range v.NumField() {
			if inside(v.Field(i), buf) {
				return true
			}
		}
	case reflect.Slice:
		if b, ok := v.Interface().([]byte); ok {
			lo, hi := uintptr(unsafe.Pointer(unsafe.SliceData(buf))), uintptr(unsafe.Pointer(unsafe.SliceData(buf)))+uintptr(len(buf))
			p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
			return len(b) > 0 && p >= lo && p < hi
		}
		for i := range v.Len() {
			if inside(v.Index(i), buf) {
				return true
			}
		}
	}
	return false
}

// TestCloneSurvivesInput decodes every message of every capture with a Parser, clones it, then
// overwrites the input and decodes the next message with the same Parser: the clone still equals
// the message, is of the same type and shares no memory with the input or the original.
func TestCloneSurvivesInput(t *testing.T) {
	for _, name := range captureNames(t) {
		opts := captureOpts[name]
		d := decoding.NewDecoder(opts)
		p := decoding.Parser{Options: opts}
		var kept []decoding.Message // clones
		var want []decoding.Message // decoded from copies nobody touches
		buf := make([]byte, 0, 1<<16)
		for i, rec := range readCapture(t, name) {
			h, err := d.Accept(rec.data)
			if err != nil {
				t.Fatal(err)
			}
			buf = append(buf[:0], rec.data...)
			m, err := p.Parse(buf, h.InStream)
			if err != nil {
				t.Fatal(err)
			}
			c := decoding.CloneMessage(m)
			if reflect.TypeOf(c) != reflect.TypeOf(m) || !reflect.DeepEqual(c, m) {
				t.Fatalf("%s: message %d: CloneMessage(%#v) = %#v", name, i, m, c)
			}
			if path := sharedSlice(reflect.ValueOf(c), reflect.ValueOf(m), "m"); path != "" {
				t.Fatalf("%s: message %d: clone shares %s with the original", name, i, path)
			}
			if inside(reflect.ValueOf(c), buf) {
				t.Fatalf("%s: message %d: clone points into the input", name, i)
			}
			w, err := decoding.Parse(bytes.Clone(rec.data), h.InStream, opts)
			if err != nil {
				t.Fatal(err)
			}
			kept, want = append(kept, c), append(want, w)
			for j := range buf {
				buf[j] = 0xA5
			}
		}
		if !reflect.DeepEqual(kept, want) {
			for i := range kept {
				if !reflect.DeepEqual(kept[i], want[i]) {
					t.Fatalf("%s: message %d changed after its input was reused: %#v, want %#v", name, i, kept[i], want[i])
				}
			}
		}
	}
}

// TestCloneEmptyAndNil: nil stays nil and empty stays empty, so that a clone is DeepEqual to a
// decoded message; nil messages and foreign types clone to nil.
func TestCloneEmptyAndNil(t *testing.T) {
	u := &decoding.Update{OldKind: 'K', Old: decoding.Tuple{}, New: decoding.Tuple{{Kind: 't', Data: []byte{}}, {Kind: 'n'}}}
	if c := u.Clone(); !reflect.DeepEqual(c, u) || c.Old == nil || c.New[0].Data == nil || c.New[1].Data != nil {
		t.Fatalf("Clone = %#v, want %#v", c, u)
	}
	if c := (&decoding.Update{}).Clone(); c.Old != nil || c.New != nil {
		t.Fatalf("nil tuples cloned as %#v", c)
	}
	lm := &decoding.LogicalMessage{Content: []byte{}}
	if c := lm.Clone(); c.Content == nil {
		t.Fatal("empty content cloned as nil")
	}
	if c := (*decoding.Insert)(nil).Clone(); c != nil {
		t.Fatalf("nil Insert cloned as %#v", c)
	}
	for _, m := range []decoding.Message{nil, (*decoding.Begin)(nil), foreign{}} {
		if c := decoding.CloneMessage(m); c != nil {
			t.Errorf("CloneMessage(%#v) = %#v, want nil", m, c)
		}
	}
}

type foreign struct{}

func (foreign) Type() decoding.MessageType { return decoding.MsgBegin }

// TestCloneEveryType: CloneMessage handles every message type (the captures have all of them,
// TestGoldenCoverage checks that), each Clone returning its own type.
func TestCloneEveryType(t *testing.T) {
	for _, m := range []decoding.Message{
		&decoding.Begin{}, &decoding.Commit{}, &decoding.Origin{}, &decoding.Relation{}, &decoding.DataType{},
		&decoding.Insert{}, &decoding.Update{}, &decoding.Delete{}, &decoding.Truncate{}, &decoding.LogicalMessage{},
		&decoding.StreamStart{}, &decoding.StreamStop{}, &decoding.StreamCommit{}, &decoding.StreamAbort{},
		&decoding.BeginPrepare{}, &decoding.Prepare{}, &decoding.CommitPrepared{}, &decoding.RollbackPrepared{},
		&decoding.StreamPrepare{},
	} {
		c := decoding.CloneMessage(m)
		if reflect.TypeOf(c) != reflect.TypeOf(m) {
			t.Errorf("CloneMessage(%T) = %#v", m, c)
		}
		if ct, ok := reflect.TypeOf(m).MethodByName("Clone"); !ok || ct.Type.Out(0) != reflect.TypeOf(m) {
			t.Errorf("%T has no Clone returning %T", m, m)
		}
	}
}
