package target

import "testing"

// TestLaterRan checks which resolutions count as coming after later statements of their batch:
// those with a statement after them, on the same table, that took effect.
func TestLaterRan(t *testing.T) {
	a, b := &Table{}, &Table{}
	ops := []batchOp{
		{op: 'I', rel: a}, // 0
		{op: 0},           // 1: transaction control
		{op: 'U', rel: b}, // 2
		{op: 'D', rel: a}, // 3
		{op: 'U', rel: a}, // 4
	}
	for _, c := range []struct {
		name   string
		ops    []batchOp
		missed []int
		j      int
		want   bool
	}{
		{"a later statement of the table ran", ops, []int{0}, 0, true},
		{"the later ones of the table missed too", ops, []int{0, 3, 4}, 0, false},
		{"one of them missed, one ran", ops, []int{0, 3}, 0, true},
		{"only other tables and control after it", ops[:3], []int{0}, 0, false},
		{"the last statement", ops, []int{4}, 4, false},
		{"another table's statement", ops, []int{2}, 2, false},
		{"a failed statement is not among the ops", ops[:4], []int{0, 3}, 0, false},
	} {
		var rest []int
		for _, k := range c.missed {
			if k > c.j {
				rest = append(rest, k)
			}
		}
		if got := laterRan(c.ops, rest, c.j); got != c.want {
			t.Errorf("%s: laterRan %v, want %v", c.name, got, c.want)
		}
	}
}
