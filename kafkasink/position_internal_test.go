package kafkasink

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/testing/kafkatest"
)

// TestPositionTables: the offsets record keeps a position's known tables and the table whose
// copy began, and a record of an earlier release (without them) loads with neither.
func TestPositionTables(t *testing.T) {
	c := kafkatest.Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	prefix := fmt.Sprintf("postables%d", os.Getpid())
	open := func() *Sink {
		s, err := Open(Config{Brokers: c.Addrs(), TopicPrefix: prefix})
		require.NoError(t, err)
		return s
	}
	const slot = "pos_slot"

	// A record as an earlier release wrote it.
	s := open()
	_, _, err := s.Load(ctx, slot)
	require.NoError(t, err)
	u, err := s.Begin(ctx, changefeed.StreamWorker)
	require.NoError(t, err)
	old := `{"slot":"pos_slot","system_id":"42","copy_done":true,"end_lsn":"0/1000","state":"MTIz"}`
	require.NoError(t, s.produce(ctx, &kgo.Record{Topic: s.cfg.OffsetsTopic, Key: []byte(slot), Value: []byte(old)}, "", nil))
	require.NoError(t, u.Commit(ctx, nil))
	require.NoError(t, s.Close())
	s = open()
	pos, ok, err := s.Load(ctx, slot)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, changefeed.Position{Slot: slot, SystemID: "42", CopyDone: true, EndLSN: 0x1000, State: []byte("123")}, pos)
	require.Nil(t, pos.Tables, "unknown, not empty")

	// The new fields round-trip, an empty known set included.
	for _, want := range []changefeed.Position{
		{Slot: slot, SystemID: "42", CopyDone: true, EndLSN: 0x2000, Tables: []uint32{16384, 16390},
			Sync: &changefeed.TableSync{Table: changefeed.TableRef{OID: 16400, Schema: "public", Name: "T late"}, From: decoding.LSN(0x2000)}},
		{Slot: slot, SystemID: "42", CopyDone: true, EndLSN: 0x3000, Tables: []uint32{}},
	} {
		u, err := s.Begin(ctx, changefeed.StreamWorker)
		require.NoError(t, err)
		require.NoError(t, u.Commit(ctx, &want))
		require.NoError(t, s.Close())
		s = open()
		got, ok, err := s.Load(ctx, slot)
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, want, got)
	}
	require.NoError(t, s.Close())
}
