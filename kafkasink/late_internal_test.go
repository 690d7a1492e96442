package kafkasink

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgreorder/pgreorder/internal/testing/kafkatest"
)

// holdHook holds the promise of the record keyed "late" until release is closed.
type holdHook struct {
	held    chan struct{}
	release chan struct{}
}

func (h holdHook) OnProduceRecordUnbuffered(r *kgo.Record, _ error) {
	if string(r.Key) == "late" {
		close(h.held)
		<-h.release
	}
}

// TestLatePromiseOfAbortedTxn: a record of a transaction that ended fails (it was produced as the
// transaction was aborted, and never buffered, so the abort did not wait for it), and its promise
// comes only once the next transaction has begun, as when a copy that failed starts over. The
// next transaction must not take that failure as its own: its commit succeeds.
func TestLatePromiseOfAbortedTxn(t *testing.T) {
	c := kafkatest.Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h := holdHook{held: make(chan struct{}), release: make(chan struct{})}
	prefix := fmt.Sprintf("late%d", os.Getpid())
	s, err := Open(Config{Brokers: c.Addrs(), TopicPrefix: prefix, Opts: []kgo.Opt{kgo.WithHooks(h)}})
	require.NoError(t, err)
	defer s.Close()
	_, _, err = s.Load(ctx, "late_slot")
	require.NoError(t, err)

	u, err := s.Begin(ctx, 0)
	require.NoError(t, err)
	require.NoError(t, u.Rollback(ctx))
	require.NoError(t, s.produce(ctx, &kgo.Record{Topic: s.cfg.OffsetsTopic, Key: []byte("late")}, "", nil))
	select {
	case <-h.held: // failed, its promise on its way
	case <-ctx.Done():
		t.Fatal("the record produced outside a transaction did not fail")
	}

	u, err = s.Begin(ctx, 0)
	require.NoError(t, err)
	close(h.release)
	// Promises run in order: once this record's has run, so has the late one's.
	done := make(chan struct{})
	s.cl.Produce(ctx, &kgo.Record{}, func(*kgo.Record, error) { close(done) })
	<-done
	require.NoError(t, u.Commit(ctx, nil), "the late failure of the aborted transaction's record")
	require.NoError(t, u.Rollback(ctx))
}

// TestAbortedUnderBatch: two chunks of the copy share its transaction; one fails and its unit is
// rolled back, which aborts the transaction while the other still produces. The other's records
// fail for the abort, and its commit says so with a cancellation (it wraps context.Canceled), not
// with the client's error, which would pass for the cause of the copy's failure.
func TestAbortedUnderBatch(t *testing.T) {
	c := kafkatest.Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	prefix := fmt.Sprintf("aborted%d", os.Getpid())
	s, err := Open(Config{Brokers: c.Addrs(), TopicPrefix: prefix})
	require.NoError(t, err)
	defer s.Close()
	_, _, err = s.Load(ctx, "aborted_slot")
	require.NoError(t, err)

	failed, err := s.Begin(ctx, 0)
	require.NoError(t, err)
	other, err := s.Begin(ctx, 1)
	require.NoError(t, err)
	require.NoError(t, failed.Rollback(ctx))
	// Produced as the transaction was aborted: it fails outside a transaction.
	require.NoError(t, s.produce(ctx, &kgo.Record{Topic: s.cfg.OffsetsTopic, Key: []byte("after abort")}, "", nil))
	// Promises run in order: once this record's has run, so has the one above's.
	done := make(chan struct{})
	s.cl.Produce(ctx, &kgo.Record{}, func(*kgo.Record, error) { close(done) })
	<-done
	err = other.Commit(ctx, nil)
	require.ErrorIs(t, err, errAborted)
	require.True(t, errors.Is(err, context.Canceled), "%v is not a cancellation", err)
}
