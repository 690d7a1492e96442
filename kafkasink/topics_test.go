package kafkasink_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgreorder/pgreorder/catalog"
	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/internal/testing/kafkatest"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/kafkasink"
)

// TestTopicCollisions: tables whose topics Kafka would take for one (sales.order_items and
// sales_order.items: '.' and '_' collide) or that are one (x."a.b" and "x.a".b) are refused
// before a slot exists, naming both tables and the flag that resolves it; with the topic map,
// the run goes on, every table on its own topic.
func TestTopicCollisions(t *testing.T) {
	c := kafkatest.Shared(t)
	srv := pgtest.Shared(t, pgtest.Majors(t)[len(pgtest.Majors(t))-1])
	for _, tc := range []struct {
		name         string
		tables       []string
		first, other catalog.TableName
	}{
		{"underscore", []string{"sales.order_items", "sales_order.items"},
			catalog.TableName{Schema: "sales", Name: "order_items"}, catalog.TableName{Schema: "sales_order", Name: "items"}},
		{"dot", []string{`x."a.b"`, `"x.a".b`},
			catalog.TableName{Schema: "x", Name: "a.b"}, catalog.TableName{Schema: "x.a", Name: "b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := pgtest.Context(t, 2*time.Minute)
			dsn := srv.ConnString(pgtest.NewDatabase(t, srv))
			pgtest.ExecAll(t, dsn, "CREATE SCHEMA sales", "CREATE SCHEMA sales_order", "CREATE SCHEMA x", `CREATE SCHEMA "x.a"`)
			for _, tbl := range tc.tables {
				pgtest.ExecAll(t, dsn, "CREATE TABLE "+tbl+" (id int PRIMARY KEY)", "INSERT INTO "+tbl+" VALUES (1)")
			}
			pgtest.ExecAll(t, dsn, "CREATE PUBLICATION p FOR TABLE "+tc.tables[0]+", "+tc.tables[1])
			prefix := newPrefix(t)
			sink, err := kafkasink.Open(kafkasink.Config{Brokers: c.Addrs(), TopicPrefix: prefix})
			require.NoError(t, err)
			err = changefeed.Run(ctx, feedConfig(dsn), sink, sink.Handle)
			var ce *kafkasink.TopicCollisionError
			require.ErrorAs(t, err, &ce)
			require.ErrorIs(t, err, kafkasink.ErrTopicCollision)
			require.ElementsMatch(t, []catalog.TableName{tc.first, tc.other}, []catalog.TableName{ce.Table, ce.Other})
			require.ErrorContains(t, err, "-kafka-topic-map")
			require.False(t, slotExists(t, ctx, dsn), "a slot was left behind")

			// The map gives the second table a topic of its own.
			r := start(t, ctx, feedConfig(dsn), kafkasink.Config{Brokers: c.Addrs(), TopicPrefix: prefix,
				TopicMap: map[catalog.TableName]string{tc.other: prefix + ".other"}})
			r.waitPast(t, ctx, 0)
			kept := ce.Topic // the topic of the table the map leaves alone
			if ce.Table == tc.other {
				kept = ce.OtherTopic
			}
			for topic, recs := range readCommitted(t, ctx, c, kept, prefix+".other") {
				require.Len(t, recs, 1, topic)
			}
		})
	}
}

// TestTopicCollisionMidStream: a table added to the publication while the sink runs, whose topic
// collides with a table's it already writes, stops the sink before anything of the transaction
// that brings its first change is visible; a run with the topic map goes on from there, nothing
// lost: the added table is copied (its row is in the copy, which commits once the stream has
// passed that transaction).
func TestTopicCollisionMidStream(t *testing.T) {
	c := kafkatest.Shared(t)
	srv := pgtest.Shared(t, pgtest.Majors(t)[len(pgtest.Majors(t))-1])
	ctx := pgtest.Context(t, 2*time.Minute)
	dsn := srv.ConnString(pgtest.NewDatabase(t, srv))
	pgtest.ExecAll(t, dsn, "CREATE SCHEMA sales", "CREATE SCHEMA sales_order",
		"CREATE TABLE sales.order_items (id int PRIMARY KEY)", "CREATE TABLE sales_order.items (id int PRIMARY KEY)",
		"CREATE PUBLICATION p FOR TABLE sales.order_items", "INSERT INTO sales.order_items VALUES (1)")
	prefix := newPrefix(t)
	r := start(t, ctx, feedConfig(dsn), kafkasink.Config{Brokers: c.Addrs(), TopicPrefix: prefix})
	r.waitPast(t, ctx, 0)
	pgtest.ExecAll(t, dsn, "ALTER PUBLICATION p ADD TABLE sales_order.items")
	lsn := commitLSN(t, ctx, dsn, "INSERT INTO sales.order_items VALUES (2)", "INSERT INTO sales_order.items VALUES (1)")
	var err error
	select {
	case err = <-r.done:
		r.done <- err // for the cleanup's stop
	case <-ctx.Done():
		t.Fatal("the sink did not stop")
	}
	var ce *kafkasink.TopicCollisionError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, catalog.TableName{Schema: "sales_order", Name: "items"}, ce.Table)
	require.Equal(t, catalog.TableName{Schema: "sales", Name: "order_items"}, ce.Other)
	require.Less(t, r.sink.Stats().Position, lsn)
	require.Len(t, readCommitted(t, ctx, c, prefix+".sales.order_items")[prefix+".sales.order_items"], 1, "the transaction was half visible")

	r2 := start(t, ctx, feedConfig(dsn), kafkasink.Config{Brokers: c.Addrs(), TopicPrefix: prefix,
		TopicMap: map[catalog.TableName]string{ce.Table: prefix + ".items"}})
	r2.waitPast(t, ctx, lsn)
	require.Len(t, readCommitted(t, ctx, c, prefix+".sales.order_items")[prefix+".sales.order_items"], 2)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...))
	require.NoError(t, err)
	defer cl.Close()
	var items []*kgo.Record
	require.True(t, pgtest.Until(ctx, func() bool {
		td, err := kadm.NewClient(cl).ListTopics(ctx, prefix+".items")
		if err != nil || td.Error() != nil {
			return false
		}
		items = readCommitted(t, ctx, c, prefix+".items")[prefix+".items"]
		return len(items) > 0
	}), "the added table's copy")
	require.Len(t, items, 1)
	require.Contains(t, string(items[0].Value), `"op":"r"`, "a copied row")
}

// TestTopicCollisionExisting: a table whose topic collides with a topic the brokers already hold
// (made by someone else) is refused before a slot exists.
func TestTopicCollisionExisting(t *testing.T) {
	var existing string
	err := refusedBeforeSlot(t, func(prefix string) (string, int32, map[string]*string) {
		existing = prefix + "_public.t"
		return existing, 1, nil
	})
	var ce *kafkasink.TopicCollisionError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, existing, ce.OtherTopic)
}
