// Package pgtest starts throwaway PostgreSQL servers (15 to 18) for tests.
package pgtest
