package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
)

// flagGroup is a section of a command's usage: a title and the flags under it, in order.
type flagGroup struct {
	title string
	flags []string
}

// printFlags writes the flags of fs to w by groups, each flag as flag.PrintDefaults writes it.
// Every flag belongs to exactly one group (a test checks it); one that belongs to none is still
// shown, under "other".
func printFlags(w io.Writer, fs *flag.FlagSet, groups []flagGroup) {
	shown := map[string]bool{}
	for _, g := range groups {
		fmt.Fprintf(w, "\n%s:\n", g.title)
		for _, name := range g.flags {
			if f := fs.Lookup(name); f != nil {
				printFlag(w, f)
				shown[name] = true
			}
		}
	}
	first := true
	fs.VisitAll(func(f *flag.Flag) {
		if shown[f.Name] {
			return
		}
		if first {
			fmt.Fprintf(w, "\nother:\n")
			first = false
		}
		printFlag(w, f)
	})
}

// printFlag writes one flag as flag.PrintDefaults does: its name and the type of its value, then
// its usage, indented, and its default unless it is the zero value.
func printFlag(w io.Writer, f *flag.Flag) {
	var b strings.Builder
	fmt.Fprintf(&b, "  -%s", f.Name)
	name, usage := flag.UnquoteUsage(f)
	if name != "" {
		b.WriteString(" " + name)
	}
	if b.Len() <= 4 { // a one-letter flag without a value: usage on the same line
		b.WriteString("\t")
	} else {
		b.WriteString("\n    \t")
	}
	b.WriteString(strings.ReplaceAll(usage, "\n", "\n    \t"))
	switch f.DefValue {
	case "", "0", "false", "0s": // the zero value
	default:
		if g, ok := f.Value.(flag.Getter); ok {
			if _, isString := g.Get().(string); isString {
				fmt.Fprintf(&b, " (default %q)", f.DefValue)
				break
			}
		}
		fmt.Fprintf(&b, " (default %v)", f.DefValue)
	}
	fmt.Fprintln(w, b.String())
}
