package reorderbuffer_test

import (
	"reflect"
	"testing"

	"github.com/pgreorder/pgreorder/reorderbuffer"
)

// TestStatsPlus checks Stats.Plus field by field: every counter is added, PeakMemoryBytes is the
// higher of both, and the gauges are the receiver's. A field added to Stats fails the test until
// it is placed in one of the three.
func TestStatsPlus(t *testing.T) {
	gauges := map[string]bool{"SpillBytesNow": true, "MemoryBytes": true, "OverheadBytes": true, "OpenTxns": true,
		"QueuedTxns": true, "UnackedTxns": true, "OldestUnackedLSN": true, "AckedThrough": true, "ReceivedLSN": true,
		"FlushLagBytes": true}
	typ := reflect.TypeFor[reorderbuffer.Stats]()
	for i := range typ.NumField() {
		name := typ.Field(i).Name
		var s, o reorderbuffer.Stats
		setInt(reflect.ValueOf(&s).Elem().Field(i), 2)
		setInt(reflect.ValueOf(&o).Elem().Field(i), 3)
		got := reflect.ValueOf(s.Plus(o)).Field(i)
		var want int64
		switch {
		case name == "PeakMemoryBytes":
			want = 3
		case gauges[name]:
			want = 2
		default:
			want = 5
		}
		if v := asInt(got); v != want {
			t.Errorf("%s: 2 plus 3 is %d, want %d", name, v, want)
		}
	}
}

// setInt sets an integer field, signed (counts) or not (positions).
func setInt(v reflect.Value, n int64) {
	if v.CanInt() {
		v.SetInt(n)
	} else {
		v.SetUint(uint64(n))
	}
}

func asInt(v reflect.Value) int64 {
	if v.CanInt() {
		return v.Int()
	}
	return int64(v.Uint())
}
