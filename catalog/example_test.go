package catalog_test

import (
	"errors"
	"fmt"

	"github.com/pgreorder/pgreorder/catalog"
	"github.com/pgreorder/pgreorder/format"
)

// A Reader is the Tables of Debezium events: with it, keys are the primary key's columns and
// Connect schemas say which fields are optional, as Debezium's. It connects on first use.
func Example() {
	cat, err := catalog.New(catalog.Config{ConnString: "host=db.example.com dbname=app user=cdc"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cat.Close()
	ev := format.NewEvents(format.Config{Tables: cat, KeySchema: true, ValueSchema: true})
	_ = ev // ev.Txn(ctx, txn, emit) looks tables up as it meets them

	_, err = catalog.New(catalog.Config{})
	fmt.Println(errors.Is(err, catalog.ErrInvalidConfig), err)
	fmt.Println(catalog.TableName{Schema: "sales", Name: "Order Items"})
	// Output:
	// true catalog: invalid configuration: no ConnString or ConnConfig
	// sales."Order Items"
}
