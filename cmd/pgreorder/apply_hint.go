package main

import (
	"errors"

	"github.com/pgreorder/pgreorder/apply/conflict"
)

// flagHint words the hint of a conflict that stopped apply in terms of the -conflict flag
// (the library names its Config fields).
func flagHint(err error) {
	var ce *conflict.StopError
	if !errors.As(err, &ce) || ce.Report == nil {
		return
	}
	rs := ce.Resolutions()
	h := "use -conflict " + ce.Report.Type.String() + "=" + rs[0].String()
	if len(rs) > 1 {
		h += " (or " + rs[1].String() + ")"
	}
	ce.Hint = h + " to get past it"
}
