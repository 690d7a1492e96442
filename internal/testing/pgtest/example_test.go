package pgtest_test

import (
	"fmt"

	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// A test package that uses servers calls Main from its TestMain:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
// and each test takes the server of the major version it wants, with a database of its own:
//
//	func TestSomething(t *testing.T) {
//		for _, major := range pgtest.Majors(t) {
//			t.Run(strconv.Itoa(major), func(t *testing.T) {
//				srv := pgtest.Shared(t, major)
//				db := pgtest.NewDatabase(t, srv)
//				conn := pgtest.Connect(t, srv.ConnString(db))
//				pgtest.MustExec(t, conn, "CREATE TABLE t (id int)")
//			})
//		}
//	}
//
// Record captures what the server sends for a workload such as this one.
func Example() {
	w, err := pgtest.ParseWorkload("-- setup\nCREATE TABLE t (id int);\n-- workload\nINSERT INTO t VALUES (1);\n")
	if err != nil {
		panic(err)
	}
	fmt.Println(len(w.Setup), "setup statement,", len(w.Workload), "workload statement")
	// Output: 1 setup statement, 1 workload statement
}
