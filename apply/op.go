package apply

import "github.com/pgreorder/pgreorder/apply/internal/target"

// Op is the statement an ApplyError names. Its String method returns the statement's SQL
// keyword, such as "INSERT" ("" for OpNone). It is the type the target connections name their
// statements with, so that an error of theirs carries its Op as it is.
type Op = target.Op

// The statements an ApplyError names.
const (
	OpNone     Op = target.OpNone     // not one statement
	OpInsert   Op = target.OpInsert   // INSERT, or a COPY of inserted rows
	OpUpdate   Op = target.OpUpdate   // UPDATE
	OpDelete   Op = target.OpDelete   // DELETE
	OpTruncate Op = target.OpTruncate // TRUNCATE
	OpCommit   Op = target.OpCommit   // COMMIT: a deferred constraint, say
	OpCopy     Op = target.OpCopy     // the initial copy's COPY
)
