// Command typed-values DSN SLOT PUBLICATION... prints each committed change: table, columns, Go values.
package main

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/pgreorder/pgreorder/pgvalue"
	"github.com/pgreorder/pgreorder/replication"
)

func main() {
	s, err := replication.Start(context.Background(), replication.Config{ConnString: os.Args[1],
		Slot: os.Args[2], Publications: os.Args[3:], CreateSlot: true}) // text: binary has enums as []byte
	check(err)
	dec := pgvalue.NewDecoder(nil) // custom codecs: register them in dec.Map()
	for {
		txn, err := s.Next(context.Background())
		check(err)
		for ch, err := range dec.Changes(txn) {
			check(err)
			fmt.Println(ch) // "Insert public.t", "Truncate public.a, public.b"
			for i, row := range []pgvalue.Row{ch.Old, ch.New} {
				for c := range row.Columns() {
					v, err := c.Value() // pgvalue.ErrUnchanged for an unchanged TOASTed value (not sent)
					fmt.Printf("  %s %s %s = %T %v %v\n", [2]string{"old", "new"}[i], c.Name, c.TypeName(), v, v, err)
				}
			}
		}
		check(s.Ack(txn)) // Ctrl-C stops at any point: what was not acknowledged is sent again
	}
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
