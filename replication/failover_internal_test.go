package replication

import (
	"strings"
	"testing"
)

// TestFailoverProblems: what the failover check says for each state of a server.
func TestFailoverProblems(t *testing.T) {
	for _, tc := range []struct {
		name                string
		recovery, promoted  bool
		syncSlots, physical string
		want                []string // the settings warned about, each with a word of its problem
	}{
		{name: "set up", syncSlots: "sb", physical: "sb true,other false"},
		{name: "quoted and spaced", syncSlots: ` "sb" , sb2`, physical: "sb true,sb2 true"},
		{name: "standby", recovery: true, want: []string{"pg_is_in_recovery standby"}},
		{name: "empty", physical: "sb true", want: []string{"synchronized_standby_slots empty"}},
		{name: "empty, promoted", promoted: true},
		{name: "missing slot", syncSlots: "sb", want: []string{"synchronized_standby_slots not a physical slot"}},
		{name: "missing slot, promoted", promoted: true, syncSlots: "sb", want: []string{"synchronized_standby_slots not a physical slot"}},
		{name: "inactive", syncSlots: "sb,sb2", physical: "sb false,sb2 true", want: []string{"synchronized_standby_slots no standby streams"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := failoverProblems(tc.recovery, tc.promoted, tc.syncSlots, tc.physical)
			if len(got) != len(tc.want) {
				t.Fatalf("problems %+v; want %d", got, len(tc.want))
			}
			for i, p := range got {
				setting, word, _ := strings.Cut(tc.want[i], " ")
				if p.setting != setting || !strings.Contains(p.problem, word) || p.fix == "" {
					t.Errorf("problem %+v; want setting %s, mentioning %q, with a fix", p, setting, word)
				}
			}
		})
	}
}
