package kafkasink_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgreorder/pgreorder/internal/testing/kafkatest"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

func TestMain(m *testing.M) {
	if spec := os.Getenv(crashConsumerEnv); spec != "" {
		os.Exit(crashConsumer(spec))
	}
	pgtest.Main(m)
}

// testedMajors are the server versions the integration tests run against, when installed.
var testedMajors = []int{15, 18}

func eachMajor(t *testing.T, f func(t *testing.T, srv *pgtest.Server)) {
	pgtest.EachMajor(t, testedMajors, f)
}

var prefixes atomic.Int64

// newPrefix returns a topic prefix no other test of the binary uses.
func newPrefix(t *testing.T) string {
	return fmt.Sprintf("t%d_%d", os.Getpid(), prefixes.Add(1))
}

// readCommitted returns every committed record of the topics (kafkatest.ReadCommitted).
func readCommitted(t *testing.T, ctx context.Context, c *kafkatest.Cluster, topics ...string) map[string][]*kgo.Record {
	t.Helper()
	return kafkatest.ReadCommitted(t, ctx, c, topics...)
}

// event is what the tests read of a change event.
type event struct {
	Before map[string]any `json:"before"`
	After  map[string]any `json:"after"`
	Op     string         `json:"op"`
	Source struct {
		Table    string  `json:"table"`
		TxID     *uint64 `json:"txId"`
		LSN      *uint64 `json:"lsn"`
		Snapshot string  `json:"snapshot"`
	} `json:"source"`
	Transaction *struct {
		ID         string `json:"id"`
		TotalOrder int64  `json:"total_order"`
	} `json:"transaction"`
	Message *struct {
		Prefix  string `json:"prefix"`
		Content []byte `json:"content"`
	} `json:"message"`
}

func parseEvent(t *testing.T, r *kgo.Record) event {
	t.Helper()
	var e event
	dec := json.NewDecoder(bytes.NewReader(r.Value))
	dec.UseNumber()
	require.NoError(t, dec.Decode(&e), string(r.Value))
	return e
}

// model applies row events of a table keyed by "id" to a map, refusing what exactly once
// excludes: a create of a present key, an update or delete of a missing one.
type model map[string]string

func (m model) apply(e event) error {
	id := func(row map[string]any) string { return fmt.Sprint(row["id"]) }
	switch e.Op {
	case "r", "c":
		k := id(e.After)
		if _, ok := m[k]; ok {
			return fmt.Errorf("%s of key %s, which is present", e.Op, k)
		}
		m[k] = fmt.Sprint(e.After["v"])
	case "u":
		k := id(e.After)
		if _, ok := m[k]; !ok {
			return fmt.Errorf("update of key %s, which is missing", k)
		}
		m[k] = fmt.Sprint(e.After["v"])
	case "d":
		k := id(e.Before)
		if _, ok := m[k]; !ok {
			return fmt.Errorf("delete of key %s, which is missing", k)
		}
		delete(m, k)
	case "t":
		clear(m)
	}
	return nil
}

// tableModel reads table t's rows (id, v) as a model.
func tableModel(t *testing.T, ctx context.Context, dsn, table string) model {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SELECT id::text, coalesce(v, '<nil>') FROM "+table)
	require.NoError(t, err)
	m := model{}
	for rows.Next() {
		var k, v string
		require.NoError(t, rows.Scan(&k, &v))
		m[k] = v
	}
	require.NoError(t, rows.Err())
	return m
}
