package kafkatest_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgreorder/pgreorder/internal/testing/kafkatest"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestKillRestart: the shared broker answers, dies with Kill, and comes back with its data.
func TestKillRestart(t *testing.T) {
	t0 := time.Now()
	c := kafkatest.Shared(t)
	t.Logf("started in %v", time.Since(t0))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...), kgo.RequiredAcks(kgo.AllISRAcks()))
	require.NoError(t, err)
	defer cl.Close()
	adm := kadm.NewClient(cl)
	_, err = adm.CreateTopic(ctx, 1, 1, nil, "kafkatest.kill")
	require.NoError(t, err)
	require.NoError(t, cl.ProduceSync(ctx, &kgo.Record{Topic: "kafkatest.kill", Value: []byte("v")}).FirstErr())
	t0 = time.Now()
	c.Brokers[0].Kill()
	require.NoError(t, c.Brokers[0].Restart(ctx))
	t.Logf("restarted in %v", time.Since(t0))
	ends, err := adm.ListEndOffsets(ctx, "kafkatest.kill")
	require.NoError(t, err)
	o, ok := ends.Lookup("kafkatest.kill", 0)
	require.True(t, ok)
	require.EqualValues(t, 1, o.Offset)
}

// TestRestartInCluster: Restart of a node of a three-node cluster returns once that node answers
// and every node lists all three, although the others list the killed node until its session
// times out.
func TestRestartInCluster(t *testing.T) {
	c := kafkatest.Start(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b := c.Brokers[2]
	b.Kill()
	require.NoError(t, b.Restart(ctx))
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()))
	require.NoError(t, err)
	defer cl.Close()
	req := kmsg.NewPtrMetadataRequest()
	req.Topics = []kmsg.MetadataRequestTopic{}
	rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
	defer rcancel()
	resp, err := cl.SeedBrokers()[0].Request(rctx, req)
	require.NoError(t, err, "the restarted node does not answer")
	require.Len(t, resp.(*kmsg.MetadataResponse).Brokers, 3)
}
