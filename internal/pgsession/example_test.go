package pgsession_test

import (
	"fmt"

	"github.com/pgreorder/pgreorder/internal/pgsession"
)

// Quoting, passwords kept out of messages, and the SQLSTATEs worth trying again: what every
// package that talks to PostgreSQL uses, without a server.
func Example() {
	fmt.Println("SELECT * FROM " + pgsession.QuoteQualified("public", "Order Lines") +
		" WHERE note = " + pgsession.QuoteLiteral(`it's C:\temp`))
	fmt.Println("START_REPLICATION ... (publication_names " + pgsession.QuoteCommandLiteral(pgsession.QuoteIdent("pub")) + ")")
	fmt.Println(pgsession.DisplayIdent("orders"), pgsession.DisplayIdent("Orders"))

	fmt.Println(pgsession.RedactConnString("host=db user=cdc password='s3cret pass' dbname=shop"))
	fmt.Println(pgsession.RedactConnString("postgres://cdc:s3cret@db/shop?sslpassword=key"))
	_, err := pgsession.ParseConnString("host=db password=s3cret port=many")
	fmt.Println(err)

	for _, code := range []string{"40P01", "08006", "23505"} {
		fmt.Println(code, pgsession.TransientSQLState(code))
	}
	for _, s := range pgsession.Settings(pgsession.Replication)[:4] {
		fmt.Printf("%s=%s ", s.Name, s.Value)
	}
	fmt.Println()
	// Output:
	// SELECT * FROM "public"."Order Lines" WHERE note = E'it''s C:\\temp'
	// START_REPLICATION ... (publication_names '"pub"')
	// orders "Orders"
	// host=db user=cdc password=xxxxx dbname=shop
	// postgres://cdc:xxxxx@db/shop?sslpassword=xxxxx
	// cannot parse `host=db password=xxxxx port=many`: invalid port
	// 40P01 true
	// 08006 true
	// 23505 false
	// datestyle=ISO intervalstyle=postgres extra_float_digits=3 client_encoding=UTF8
}
