package replication_test

import (
	"fmt"
	"strings"

	"github.com/pgreorder/pgreorder/replication"
)

// Negotiate shows what START_REPLICATION will carry against a given server version.
func ExampleConfig_Negotiate() {
	cfg := replication.Config{Slot: "cdc", Publications: []string{"orders"}, Messages: true}
	for _, major := range []int{13, 15, 17} {
		n, err := cfg.Negotiate(major)
		if err != nil {
			fmt.Println(err)
			continue
		}
		fmt.Printf("PostgreSQL %d: %s\n", major, strings.Join(n.PluginArgs, ", "))
	}
	// Output:
	// replication: option messages="true" is not supported by PostgreSQL 13
	// PostgreSQL 15: proto_version '3', publication_names '"orders"', streaming 'on', messages 'true'
	// PostgreSQL 17: proto_version '4', publication_names '"orders"', streaming 'parallel', messages 'true'
}
