// Command changefeed DSN SLOT PUBLICATION... copies the published tables, streams what follows,
// prints every change typed, resumes from SLOT.pos, and serves metrics on 127.0.0.1:$METRICS_PORT.
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"sync"

	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/metrics"
	"github.com/pgreorder/pgreorder/pgvalue"
	"github.com/pgreorder/pgreorder/replication"
)

func main() {
	store, err := changefeed.OpenFile(os.Args[2] + ".pos") // slot, server, copy done, end LSN
	check(err)
	var mu sync.Mutex // copied chunks come from several workers at once
	feed, err := changefeed.New(changefeed.Config{Replication: replication.Config{ConnString: os.Args[1],
		Slot: os.Args[2], Publications: os.Args[3:]}}, store, func(ctx context.Context, b *changefeed.Batch) error {
		var out []byte
		for ch, err := range pgvalue.NewDecoder(nil).Changes(b) { // text values: binary has enums as bytes
			if err != nil {
				return err
			}
			row, del := ch.New, !ch.New.Present()
			if del {
				row = ch.Old // a delete's key
			}
			out = fmt.Appendf(out, "%s %s", b.Kind, ch) // "snapshot Insert public.t", "transaction Delete public.t"
			for c := range row.Columns() {
				if v, err := c.Value(); err != nil && !c.Unchanged() { // unchanged TOAST: not sent
					return err
				} else if !c.Unchanged() && (!del || c.Key) {
					out = fmt.Appendf(out, " %s=%T(%v)", c.Name, v, v)
				}
			}
			out = append(out, '\n')
		}
		mu.Lock()
		defer mu.Unlock()
		_, err := os.Stdout.Write(out)
		return err // the position is stored, and the server told, only now
	})
	check(err)
	srv, err := metrics.Serve("127.0.0.1:"+os.Getenv("METRICS_PORT"), feed, metrics.Options{}) // lag, memory...
	check(err)
	log.Printf("metrics on http://%s/metrics", srv.Addr())
	check(feed.Run(context.Background())) // stop it at any time: it resumes after the last stored batch
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
