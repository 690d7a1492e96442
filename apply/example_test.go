package apply_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"

	"github.com/pgreorder/pgreorder/apply"
	"github.com/pgreorder/pgreorder/replication"
)

// Run replicates until the context ends; a refused change stops it with an *ApplyError naming
// the table, the source transaction and its commit.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	a, err := apply.New(apply.Config{
		Source: replication.Config{
			ConnString:   "host=source.example dbname=app",
			Slot:         "app_to_target",
			Publications: []string{"app"},
			CreateSlot:   true,
		},
		Target: "host=target.example dbname=app",
		Mode:   apply.Parallel,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, nil)),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	err = a.Run(ctx)
	var ae *apply.ApplyError
	switch {
	case errors.Is(err, context.Canceled):
		fmt.Println("stopped; applied through", a.Stats().AppliedLSN)
	case errors.As(err, &ae) && errors.Is(err, apply.ErrConstraint):
		fmt.Printf("fix %s, then run again: it resumes with transaction %d\n", ae.Relation, ae.Xid)
	case err != nil:
		fmt.Println(err)
	}
}

// ParseMode reads the mode names the command line uses.
func ExampleParseMode() {
	for _, s := range []string{"buffered", "Eager", "parallel", "fast"} {
		m, err := apply.ParseMode(s)
		if err != nil {
			fmt.Println(err)
			continue
		}
		fmt.Println(m)
	}
	// Output:
	// buffered
	// eager
	// parallel
	// apply: invalid configuration: mode "fast" (want buffered, eager or parallel)
}

// New checks the configuration before anything connects.
func ExampleNew() {
	_, err := apply.New(apply.Config{Source: replication.Config{ConnString: "dbname=src", Slot: "s"}, Target: "dbname=dst"})
	fmt.Println(err)
	fmt.Println(errors.Is(err, apply.ErrInvalidConfig))
	// Output:
	// apply: invalid configuration: Source.Publications is required
	// true
}
