package conflict

import (
	"errors"
	"testing"
)

func TestNames(t *testing.T) {
	for _, ct := range Types() {
		got, err := ParseType(ct.String())
		if err != nil || got != ct {
			t.Errorf("ParseType(%q) = %v, %v", ct, got, err)
		}
	}
	for r := Default; r < numResolutions; r++ {
		got, err := ParseResolution(r.String())
		if err != nil || got != r {
			t.Errorf("ParseResolution(%q) = %v, %v", r, got, err)
		}
	}
	for _, s := range []string{"keep_local", "", "nosuch"} {
		if _, err := ParseResolution(s); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseResolution(%q): %v, want ErrInvalid", s, err)
		}
	}
	if _, err := ParseResolutions("insert_exists", nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("ParseResolutions without =: %v", err)
	}
	if Type(-1).Valid() || Type(numTypes).Valid() || Resolution(numResolutions).Valid() {
		t.Error("out of range values are valid")
	}
	if RemoteWins.String() != "remote" || LocalWins.String() != "local" || NoWinner.String() != "" {
		t.Error("Winner names")
	}
}

func TestConfigResolution(t *testing.T) {
	var c Config
	if c.Resolution(InsertExists) != Error || c.Resolution(UpdateMissing) != Skip || c.Resolution(DeleteOriginDiffers) != ApplyRemote {
		t.Error("defaults are not PostgreSQL's")
	}
	c.Resolutions = map[Type]Resolution{InsertExists: LastUpdateWins, UpdateMissing: Default}
	if c.Resolution(InsertExists) != LastUpdateWins || c.Resolution(UpdateMissing) != Skip {
		t.Error("overrides")
	}
}

func TestUnquoteRelation(t *testing.T) {
	for in, want := range map[string]string{
		`"public"."t"`:  "public.t",
		`"a""b"."c.d"`:  `a"b.c.d`,
		`"t"`:           "t",
		`public.t`:      "public.t",
		`"unterminated`: `"unterminated`,
		`"a"x`:          `"a"x`,
		`"a".`:          `"a".`,
	} {
		if got := unquoteRelation(in); got != want {
			t.Errorf("unquoteRelation(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestStopErrorResolutions(t *testing.T) {
	e := &StopError{Report: &Report{Type: DeleteMissing, Relation: `"public"."t"`, Resolution: Error}, Hint: "h"}
	if rs := e.Resolutions(); len(rs) != 1 || rs[0] != Skip {
		t.Errorf("delete_missing: %v", rs)
	}
	e.Report.Type = InsertExists
	if rs := e.Resolutions(); len(rs) != 2 || rs[0] != ApplyRemote {
		t.Errorf("insert_exists: %v", rs)
	}
	if got := e.Error(); got[:len(`conflict detected on relation "public.t": conflict=insert_exists`)] != `conflict detected on relation "public.t": conflict=insert_exists` {
		t.Errorf("Error() = %q", got)
	}
}
