package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/testing/kafkatest"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
)

// TestKafkaSecured: against one broker with a SASL_PLAINTEXT listener (PLAIN, SCRAM-SHA-256 and
// SCRAM-SHA-512), an SSL listener (a CA made for the test) and ACLs, pgreorder kafka connects
// with the right credentials and streams; with a wrong password, or a CA it was not given, it
// stops at once with an error naming the flags to fix, before it creates the slot; and a user
// whose ACLs deny the table's topic stops with an error naming the user and what it needs,
// having acknowledged nothing of the transaction to PostgreSQL and made none of it visible.
func TestKafkaSecured(t *testing.T) {
	majors := pgtest.Majors(t)
	srv := pgtest.Shared(t, majors[len(majors)-1])
	c := kafkatest.StartWith(t, 1, kafkatest.Options{
		Users:      map[string]string{"alice": "alice-secret", "bob": "bob-secret"},
		TLS:        true,
		SuperUsers: []string{"alice"},
	})
	ctx := pgtest.Context(t, 2*time.Minute)
	dsn := srv.ConnString(pgtest.NewDatabase(t, srv))
	pgtest.ExecAll(t, dsn, "CREATE TABLE t (id int PRIMARY KEY, v text)", "CREATE PUBLICATION p FOR TABLE t")
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	slotLSN := func(slot string) (decoding.LSN, bool) {
		var s *string
		if err := conn.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&s); err != nil || s == nil {
			return 0, false
		}
		l, _ := decoding.ParseLSN(*s)
		return l, true
	}
	next := 0
	insert := func() decoding.LSN {
		next++
		var lsn string
		require.NoError(t, conn.QueryRow(ctx, "WITH i AS (INSERT INTO t VALUES ($1, 'x') RETURNING 1) SELECT pg_current_wal_insert_lsn()::text FROM i", next).Scan(&lsn))
		l, err := decoding.ParseLSN(lsn)
		require.NoError(t, err)
		return l
	}
	base := func(slot string, seeds []string) []string {
		return []string{"-source", dsn, "-slot", slot, "-publication", "p", "-progress", "0", "-status-interval", "100ms",
			"-kafka-brokers", strings.Join(seeds, ","), "-kafka-topic-prefix", slot}
	}
	// streams runs pgreorder kafka until it acknowledged a row inserted once it streams, then
	// stops it, and checks the row reached Kafka.
	streams := func(t *testing.T, slot string, args []string) {
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- runKafka(runCtx, args) }()
		wait := func(past decoding.LSN) {
			for {
				if l, ok := slotLSN(slot); ok && l > past {
					return
				}
				select {
				case err := <-done:
					stop()
					t.Fatalf("pgreorder kafka stopped: %v", err)
				case <-time.After(20 * time.Millisecond):
				}
			}
		}
		wait(0) // copied
		wait(insert())
		stop()
		require.NoError(t, <-done)
		recs := kafkatest.ReadCommitted(t, ctx, c, slot+".public.t")[slot+".public.t"]
		require.NotEmpty(t, recs)
		var e struct{ Op string }
		require.NoError(t, json.Unmarshal(recs[len(recs)-1].Value, &e))
		require.Equal(t, "c", e.Op)
	}
	for _, mech := range []string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"} {
		t.Run(mech, func(t *testing.T) {
			slot := "sasl_" + strings.ToLower(strings.ReplaceAll(mech, "-", "_"))
			t.Setenv(kafkaSASLPasswordEnv, "alice-secret")
			streams(t, slot, append(base(slot, c.SASLAddrs()), "-kafka-sasl-mechanism", mech, "-kafka-sasl-user", "alice"))
		})
	}
	t.Run("TLS", func(t *testing.T) {
		streams(t, "tls_ca", append(base("tls_ca", c.TLSAddrs()), "-kafka-tls-ca", c.CAFile))
	})

	// refused runs pgreorder kafka, which must stop on its own with an error holding every
	// one of want, before it created the slot.
	refused := func(t *testing.T, slot string, args []string, want ...string) {
		t0 := time.Now()
		err := runKafka(ctx, args)
		require.Error(t, err)
		for _, w := range want {
			require.Contains(t, err.Error(), w)
		}
		t.Logf("refused in %v: %v", time.Since(t0).Round(time.Millisecond), err)
		_, ok := slotLSN(slot)
		require.False(t, ok, "the slot was created")
	}
	t.Run("WrongPassword", func(t *testing.T) {
		for _, mech := range []string{"PLAIN", "SCRAM-SHA-512"} {
			t.Setenv(kafkaSASLPasswordEnv, "not-alice-secret")
			refused(t, "wrong_pw", append(base("wrong_pw", c.SASLAddrs()), "-kafka-sasl-mechanism", mech, "-kafka-sasl-user", "alice"),
				"authentication", "-kafka-sasl-user", "$"+kafkaSASLPasswordEnv)
		}
	})
	t.Run("UntrustedCertificate", func(t *testing.T) {
		refused(t, "no_ca", append(base("no_ca", c.TLSAddrs()), "-kafka-tls"), "authentication", "-kafka-tls-ca")
	})

	// bob may use his transactional id and the offsets topic, not the table's topic: the copy
	// (of no rows) commits, the first streamed transaction fails.
	t.Run("Unauthorized", func(t *testing.T) {
		const slot = "denied"
		adm, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...))
		require.NoError(t, err)
		defer adm.Close()
		a := kadm.NewClient(adm)
		compact := "compact"
		_, err = a.CreateTopic(ctx, 1, 1, map[string]*string{"cleanup.policy": &compact}, slot+".offsets")
		require.NoError(t, err)
		_, err = a.CreateTopic(ctx, 1, 1, nil, slot+".public.t")
		require.NoError(t, err)
		acls := kadm.NewACLs().Allow("User:bob").AllowHosts().
			Topics(slot+".offsets").TransactionalIDs("pgreorder-"+slot).
			Operations(kadm.OpRead, kadm.OpWrite, kadm.OpDescribe, kadm.OpDescribeConfigs).ResourcePatternType(kadm.ACLPatternLiteral)
		res, err := a.CreateACLs(ctx, acls)
		require.NoError(t, err)
		for _, r := range res {
			require.NoError(t, r.Err)
		}
		require.NoError(t, pgtest.Exec(ctx, dsn, "DELETE FROM t"))
		t.Setenv(kafkaSASLPasswordEnv, "bob-secret")
		args := append(base(slot, c.SASLAddrs()), "-kafka-sasl-mechanism", "SCRAM-SHA-256", "-kafka-sasl-user", "bob")
		done := make(chan error, 1)
		go func() { done <- runKafka(ctx, args) }()
		var created decoding.LSN
		for {
			if l, ok := slotLSN(slot); ok && l > 0 {
				created = l
				break
			}
			select {
			case err := <-done:
				t.Fatalf("pgreorder kafka stopped before streaming: %v", err)
			case <-time.After(20 * time.Millisecond):
			}
		}
		last := insert()
		select {
		case err = <-done:
		case <-ctx.Done():
			t.Fatal("pgreorder kafka went on streaming into a topic its user may not write")
		}
		require.Error(t, err)
		t.Logf("stopped: %v", err)
		for _, w := range []string{"not authorized", `user "bob"`, "-kafka-sasl-user", "pgreorder-" + slot, "TOPIC_AUTHORIZATION_FAILED"} {
			require.Contains(t, err.Error(), w)
		}
		acked, ok := slotLSN(slot)
		require.True(t, ok)
		require.Less(t, acked, last, "the denied transaction was acknowledged (slot created at %v)", created)
		require.Empty(t, kafkatest.ReadCommitted(t, ctx, c, slot+".public.t")[slot+".public.t"])
		require.NoError(t, pgtest.Exec(ctx, dsn, fmt.Sprintf("SELECT pg_drop_replication_slot('%s')", slot)))
	})
}
