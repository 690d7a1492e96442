package kafkatest

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

var sentinels atomic.Int64

// sentinelHeader marks the records ReadCommitted writes to find the end of a partition.
const sentinelHeader = "kafkatest-sentinel"

// ReadCommitted returns every committed record of the topics, in partition order (a topic's
// partitions one after the other), as a read_committed consumer sees them: it commits a sentinel
// record to every partition in a transaction of its own, and reads each partition up to it. A
// transaction left open (by a producer killed) holds it back until a producer of the same
// transactional id fences it, or the transaction times out.
func ReadCommitted(t testing.TB, ctx context.Context, c *Cluster, topics ...string) map[string][]*kgo.Record {
	t.Helper()
	adm, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...), kgo.MetadataMinAge(100*time.Millisecond))
	require.NoError(t, err)
	defer adm.Close()
	td, err := kadm.NewClient(adm).ListTopics(ctx, topics...)
	require.NoError(t, err)
	require.NoError(t, td.Error())
	p, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...), kgo.MetadataMinAge(100*time.Millisecond), kgo.TransactionalID(fmt.Sprintf("sentinel-%d-%d", os.Getpid(), sentinels.Add(1))),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	require.NoError(t, err)
	defer p.Close()
	require.NoError(t, p.BeginTransaction())
	want := map[string]map[int32]int64{}
	parts := map[string]map[int32]kgo.Offset{}
	for _, topic := range topics {
		want[topic] = map[int32]int64{}
		parts[topic] = map[int32]kgo.Offset{}
		for _, pd := range td[topic].Partitions {
			r := &kgo.Record{Topic: topic, Partition: pd.Partition, Key: []byte(sentinelHeader), Headers: []kgo.RecordHeader{{Key: sentinelHeader}}}
			require.NoError(t, p.ProduceSync(ctx, r).FirstErr())
			want[topic][pd.Partition] = r.Offset
			parts[topic][pd.Partition] = kgo.NewOffset().AtStart()
		}
	}
	require.NoError(t, p.EndTransaction(ctx, kgo.TryCommit))
	rd, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...), kgo.MetadataMinAge(100*time.Millisecond), kgo.ConsumePartitions(parts),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.FetchMaxWait(100*time.Millisecond))
	require.NoError(t, err)
	defer rd.Close()
	byPart := map[string]map[int32][]*kgo.Record{}
	left := 0
	for _, ps := range want {
		left += len(ps)
	}
	for left > 0 {
		fs := rd.PollFetches(ctx)
		require.NoError(t, ctx.Err())
		require.NoError(t, fs.Err0())
		fs.EachRecord(func(r *kgo.Record) {
			if len(r.Headers) > 0 && r.Headers[0].Key == sentinelHeader {
				if r.Offset == want[r.Topic][r.Partition] {
					left--
				}
				return
			}
			if byPart[r.Topic] == nil {
				byPart[r.Topic] = map[int32][]*kgo.Record{}
			}
			byPart[r.Topic][r.Partition] = append(byPart[r.Topic][r.Partition], r)
		})
	}
	out := map[string][]*kgo.Record{}
	for topic, ps := range byPart {
		for i := int32(0); i < int32(len(td[topic].Partitions)); i++ {
			out[topic] = append(out[topic], ps[i]...)
		}
	}
	return out
}
