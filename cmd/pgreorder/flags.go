package main

import (
	"flag"
	"fmt"
	"strconv"
	"time"
)

// durationFlag is a time.Duration flag that also takes a bare number, in seconds (as
// PostgreSQL's settings of that unit do): -status-interval 10 is 10s.
type durationFlag struct{ d *time.Duration }

func (f durationFlag) String() string {
	if f.d == nil {
		return ""
	}
	return f.d.String()
}

func (f durationFlag) Set(s string) error {
	if n, err := strconv.ParseFloat(s, 64); err == nil {
		*f.d = time.Duration(n * float64(time.Second))
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("want a duration such as 10s, 500ms or 2m (a bare number is in seconds)")
	}
	*f.d = d
	return nil
}

// durationVar defines a durationFlag.
func durationVar(fs *flag.FlagSet, p *time.Duration, name string, value time.Duration, usage string) {
	*p = value
	fs.Var(durationFlag{p}, name, usage)
}

// cliSlotWait turns -slot-wait into the libraries' SlotWait: 0 there means the default, here it
// means not waiting.
func cliSlotWait(d time.Duration) time.Duration {
	if d == 0 {
		return time.Nanosecond
	}
	return d
}
