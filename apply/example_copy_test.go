package apply_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"

	"github.com/pgreorder/pgreorder/apply"
	"github.com/pgreorder/pgreorder/replication"
)

// With Copy, a new target needs only its tables, empty: the first Run creates the slot, copies
// the published tables as of the slot's consistent point and streams from there. Later runs (and
// restarts after a crash, once the copy has committed) resume from the progress row.
func ExampleConfig_copy() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	err := apply.Run(ctx, apply.Config{
		Source: replication.Config{
			ConnString:   "host=source.example dbname=app",
			Slot:         "app_to_new_target",
			Publications: []string{"app"},
		},
		Target:      "host=target.example dbname=app",
		Copy:        true,
		CopyWorkers: 4,
		Mode:        apply.Parallel,
	})
	switch {
	case errors.Is(err, apply.ErrTargetNotEmpty):
		fmt.Println("empty the target tables, or set CopyTruncate:", err)
	case errors.Is(err, apply.ErrCopySlotExists):
		fmt.Println("the slot was not made by this copy; drop it, or run without Copy:", err)
	case err != nil && !errors.Is(err, context.Canceled):
		fmt.Println(err)
	}
}

// CopyWorkers is checked with the rest of the configuration.
func ExampleConfig_copyWorkers() {
	_, err := apply.New(apply.Config{
		Source:      replication.Config{ConnString: "dbname=src", Slot: "s", Publications: []string{"p"}},
		Target:      "dbname=dst",
		Copy:        true,
		CopyWorkers: apply.MaxWorkers + 1,
	})
	fmt.Println(errors.Is(err, apply.ErrInvalidConfig))
	// Output:
	// true
}
