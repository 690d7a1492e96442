package schedule

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
)

// Record kinds of a job's Queue: the first byte of each record.
const (
	RecChange   = 'c' // a change, in the form the JobTarget reads
	RecPart     = 'p' // u32 index: the changes of the index-th part the JobTarget holds for the job
	RecRollback = 'r' // u32 subtransaction: roll back to its savepoint, if the job took one
	RecWait     = 'w' // u64 sequence number that must be committed first, with every one before it
	RecAfter    = 'a' // u64 sequence number of one transaction that must be committed first
	RecCommit   = 'C' // the end: commit
	RecAbort    = 'A' // the end: the transaction aborted on the source
	RecTxn      = 't' // u32 index: the changes that follow are the index-th transaction of a run
)

// TxnRecord returns a RecTxn record for the i-th transaction of a run.
func TxnRecord(i uint32) []byte { return binary.BigEndian.AppendUint32([]byte{RecTxn}, i) }

// PartRecord returns a RecPart record for the i-th part of a job.
func PartRecord(i uint32) []byte { return binary.BigEndian.AppendUint32([]byte{RecPart}, i) }

// RollbackRecord returns a RecRollback record for subtransaction sub.
func RollbackRecord(sub uint32) []byte {
	return binary.BigEndian.AppendUint32([]byte{RecRollback}, sub)
}

// WaitRecord returns a RecWait record for sequence number seq.
func WaitRecord(seq uint64) []byte { return binary.BigEndian.AppendUint64([]byte{RecWait}, seq) }

// AfterRecord returns a RecAfter record for sequence number seq.
func AfterRecord(seq uint64) []byte { return binary.BigEndian.AppendUint64([]byte{RecAfter}, seq) }

// Worker states, for the watchdog.
const (
	WorkerIdle     int32 = iota // no job
	WorkerApplying              // sending statements
	WorkerWaiting               // waiting for records, for an earlier commit, or for its turn: holding its locks
)

// A JobTarget is what RunJob applies a job's records with: a target connection, and the commit
// order the job waits in.
type JobTarget interface {
	// State records the worker's state (WorkerApplying or WorkerWaiting).
	State(st int32)
	// Record is called before each record is applied; its error ends RunJob.
	Record(ctx context.Context) error
	// Begin starts the target transaction (nothing is sent yet).
	Begin()
	// Txn starts the i-th transaction of a run (a job of several committed transactions).
	Txn(ctx context.Context, i uint32) error
	// Change applies a RecChange record, taking the savepoint of a subtransaction before its
	// first change; Part applies the changes of the i-th part held for the job (RecPart) alike.
	Change(ctx context.Context, rec []byte) error
	Part(ctx context.Context, i uint32) error
	// RollbackTo rolls back to the savepoint of subtransaction sub, if Change or Part took one.
	RollbackTo(ctx context.Context, sub uint32) error
	// Flush sends what is pending (a target may keep a short run of inserts for the next records
	// to join): RunJob calls it before waiting for more records.
	Flush(ctx context.Context) error
	// Wait waits until sequence number seq and every one before it committed.
	Wait(ctx context.Context, seq uint64) error
	// WaitFor waits until sequence number seq committed, whether or not those before it did.
	WaitFor(ctx context.Context, seq uint64) error
	// Failed handles an error of Change, Part, RollbackTo, Flush, Wait or WaitFor: it returns
	// failed when the target refused a change (the target transaction is then rolled back and
	// the job's later records up to its end are skipped), or an error that ends RunJob.
	Failed(ctx context.Context, err error) (failed, fatal error)
	// Commit ends the job at a RecCommit: begun says whether a target transaction is open,
	// failed is the change the target refused, or nil.
	Commit(ctx context.Context, begun bool, failed error) error
	// Abort ends the job at a RecAbort; begun says whether a target transaction is open.
	Abort(ctx context.Context, begun bool) error
}

// Fatal marks an error of JobTarget.Change or Part that is not the target refusing the change (a
// record that cannot be read): RunJob returns it (unwrapped) without calling Failed.
func Fatal(err error) error { return &fatalError{err} }

type fatalError struct{ err error }

func (e *fatalError) Error() string { return e.err.Error() }
func (e *fatalError) Unwrap() error { return e.err }

// RunJob applies the records of q through t until the job's end (RecCommit or RecAbort), which
// closes q. The target transaction begins at the first change or part; a rollback to a
// savepoint before it is nothing to undo. Before waiting for more records it flushes what is
// pending, so that the target keeps up with the source.
func RunJob(ctx context.Context, q *Queue, t JobTarget) error {
	var (
		begun  bool
		failed error
	)
	waiting := func() { t.State(WorkerWaiting) }
	for {
		rec, ok, err := q.TryPop()
		if err == nil && !ok {
			if begun && failed == nil {
				if err := t.Flush(ctx); err != nil {
					if failed, err = t.Failed(ctx, err); err != nil {
						return err
					}
					begun = false
				}
			}
			rec, err = q.Pop(ctx, waiting)
		}
		if err != nil {
			return err
		}
		t.State(WorkerApplying)
		if err := t.Record(ctx); err != nil {
			return err
		}
		if len(rec) == 0 {
			return errors.New("apply: empty queue record")
		}
		if failed != nil && rec[0] != RecCommit && rec[0] != RecAbort {
			continue
		}
		switch rec[0] {
		case RecChange:
			if !begun {
				t.Begin()
				begun = true
			}
			err = t.Change(ctx, rec)
			var fe *fatalError
			if errors.As(err, &fe) {
				return fe.err
			}
		case RecPart:
			if len(rec) < 5 {
				return errors.New("apply: short queue record")
			}
			if !begun {
				t.Begin()
				begun = true
			}
			err = t.Part(ctx, binary.BigEndian.Uint32(rec[1:]))
			var fe *fatalError
			if errors.As(err, &fe) {
				return fe.err
			}
		case RecRollback:
			if len(rec) < 5 {
				return errors.New("apply: short queue record")
			}
			if begun {
				err = t.RollbackTo(ctx, binary.BigEndian.Uint32(rec[1:]))
			}
		case RecTxn:
			if len(rec) < 5 {
				return errors.New("apply: short queue record")
			}
			err = t.Txn(ctx, binary.BigEndian.Uint32(rec[1:]))
		case RecWait:
			if len(rec) < 9 {
				return errors.New("apply: short queue record")
			}
			t.State(WorkerWaiting)
			err = t.Wait(ctx, binary.BigEndian.Uint64(rec[1:]))
		case RecAfter:
			if len(rec) < 9 {
				return errors.New("apply: short queue record")
			}
			t.State(WorkerWaiting)
			err = t.WaitFor(ctx, binary.BigEndian.Uint64(rec[1:]))
		case RecAbort:
			q.Close()
			return t.Abort(ctx, begun)
		case RecCommit:
			q.Close()
			return t.Commit(ctx, begun, failed)
		default:
			return fmt.Errorf("apply: unknown queue record %q", rec[0])
		}
		if err != nil {
			if failed, err = t.Failed(ctx, err); err != nil {
				return err
			}
			begun = false
		}
	}
}
