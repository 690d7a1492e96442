package scrape_test

import (
	"fmt"

	"github.com/pgreorder/pgreorder/internal/testing/scrape"
)

// Parse reads samples by their name and labels as printed.
func ExampleParse() {
	v, err := scrape.Parse("# HELP x_total a counter\n# TYPE x_total counter\nx_total 3\ny{k=\"a\"} 1.5\n")
	fmt.Println(v["x_total"], v[`y{k="a"}`], err)
	// Output: 3 1.5 <nil>
}
