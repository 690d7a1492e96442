package pgserver_test

import (
	"context"
	"fmt"
	"os"

	"github.com/pgreorder/pgreorder/internal/tools/pgserver"
)

func ExampleDefaultSettings() {
	s := pgserver.DefaultSettings()
	fmt.Println(s["wal_level"], s["logical_decoding_work_mem"], s["max_prepared_transactions"])
	_, set := s["wal_sender_timeout"]
	fmt.Println("wal_sender_timeout changed:", set)
	// Output:
	// logical 64kB 10
	// wal_sender_timeout changed: false
}

// Start the newest PostgreSQL installed, saying on stderr what that changes on the system.
func ExampleStart() {
	installs := pgserver.FindInstalls()
	if len(installs) == 0 {
		fmt.Println("no PostgreSQL installed:", pgserver.HowToInstall)
		return
	}
	srv, err := pgserver.Start(context.Background(), installs[len(installs)-1], pgserver.Options{
		Settings:   map[string]string{"logical_decoding_work_mem": "1MB"},
		CreateUser: true, // as root, create the unprivileged user "pgreorder" if needed
		Log:        os.Stderr,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Stop()
	if err := pgserver.Exec(context.Background(), srv.ConnString("postgres"), "CREATE TABLE t (id int)"); err != nil {
		fmt.Println(err)
	}
}
