//go:build tools

// Package tools pins dependencies until the packages that use them land; delete when unused.
package tools

import (
	_ "github.com/emirpasic/gods/trees/binaryheap"
	_ "github.com/jackc/pglogrepl"
	_ "github.com/jackc/pgx/v5/pgconn"
	_ "github.com/stretchr/testify/require"
)
