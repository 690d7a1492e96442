package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/pgreorder/pgreorder/catalog"
	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/format"
	"github.com/pgreorder/pgreorder/kafkasink"
	"github.com/pgreorder/pgreorder/metrics"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/replication"
	"github.com/pgreorder/pgreorder/snapshot"
)

func init() {
	register("kafka", "copy, then stream, published tables into Kafka, exactly once", runKafka)
}

// kafkaSASLPasswordEnv holds the SASL password: not a flag, which other users could read in the
// process list.
const kafkaSASLPasswordEnv = "PGREORDER_KAFKA_SASL_PASSWORD"

// kafkaFlags are the flags of `pgreorder kafka`: stream's source flags, and Kafka's.
type kafkaFlags struct {
	sourceFlags    // -source, -slot, -publication
	spillFlags     // -work-mem, -spill-dir, -spill-compression
	pgoutputFlags  // -streaming, -proto, -messages, -binary, -two-phase, -origin-filter
	monitorFlags   // -status-interval, -progress, -metrics-addr, -v
	newTablesFlags // -copy-new-tables

	copyWorkers            int
	sourceName, sourceDB   string
	values                 valueFlags
	keyFormat, valueFormat string
	topicMap               map[catalog.TableName]string

	brokers, prefix, offsetsTopic, txID, clientID  string
	createTopics, tombstones                       bool
	partitions, replicationFactor                  int
	topicConfigs                                   map[string]string
	tls, tlsInsecure                               bool
	tlsCA, tlsCert, tlsKey                         string
	saslMechanism, saslUser, compression, maxBytes string
	txTimeout, startTimeout                        time.Duration
	group                                          int
}

const kafkaUsage = `usage: pgreorder kafka -source DSN -slot NAME -publication NAME -kafka-brokers HOST:PORT,... [flags]

Copies the published tables, then streams every committed transaction from the copy's consistent
point, into Kafka, as Debezium's PostgreSQL connector writes it: one topic per table
(PREFIX.SCHEMA.TABLE, or -kafka-topic-map), one record per change with the change event as value
and the primary key's columns as key (else a unique index's of NOT NULL columns; no key for a
table with neither); a change of key is a delete of the old key and a create of the new one.
Tables whose topic names collide in Kafka are refused before anything starts.

Exactly once for consumers that read committed (isolation.level=read_committed): every source
transaction is one Kafka transaction, which also writes the source position to a compacted
offsets topic (PREFIX.offsets); the source is acknowledged only once Kafka committed, and a
restart resumes after the last committed position. The slot is created by the first run (do not
create it beforehand). A second pgreorder for the same slot fences the first, which stops. See
docs/kafka.md.

Progress goes to stderr as with pgreorder stream; Ctrl-C stops. The SASL password is read from
$` + kafkaSASLPasswordEnv + `.
Flags, the most used first:
`

func runKafka(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("kafka", flag.ContinueOnError)
	var f kafkaFlags
	f.register(fs)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), kafkaUsage)
		printFlags(fs.Output(), fs, kafkaGroups)
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, kcfg, err := f.config(fs)
	if err != nil {
		return err
	}
	log := f.logger()
	cfg.Logger, kcfg.Logger = log, log

	sink, err := kafkasink.Open(kcfg)
	if err != nil {
		return err
	}
	feed, err := changefeed.New(cfg, sink, sink.Handle)
	if err != nil {
		sink.Close()
		return err
	}
	kc, err := metrics.NewKafkaCollector(metrics.KafkaFunc(func() metrics.KafkaStats {
		st := sink.Stats()
		return metrics.KafkaStats{Events: st.Events, Bytes: st.Bytes, Transactions: st.Transactions, CommitTime: st.CommitTime, Committed: uint64(st.Position)}
	}), feed, metrics.Options{})
	if err != nil {
		sink.Close()
		return err
	}
	stopMonitoring, err := monitor(feed, f.metricsAddr, f.progress, log, kc)
	if err != nil {
		sink.Close()
		return err
	}
	stopKafkaProgress := kafkaProgress(sink, f.progress)
	err = feed.Run(ctx)
	stopKafkaProgress()
	if ctx.Err() != nil && errors.Is(err, context.Cause(ctx)) {
		err = nil // Ctrl-C: a clean stop
	}
	closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	merr := stopMonitoring(closeCtx)
	cancel()
	st := sink.Stats()
	log.Info("stopped", "committed_through", st.Position, "kafka_transactions", st.Transactions, "events", st.Events,
		"bytes", st.Bytes, "commit_time", st.CommitTime)
	err = f.refusalHint(err)
	if errors.Is(err, kafkasink.ErrRecordTooLarge) {
		err = fmt.Errorf("%w\n(raise it for the topic, e.g. kafka-configs.sh --alter --entity-type topics --add-config max.message.bytes=N, or with -kafka-topic-config before the topic is created)", err)
	}
	return errors.Join(err, merr)
}

// register defines the flags of kafka.
func (f *kafkaFlags) register(fs *flag.FlagSet) {
	f.topicConfigs, f.topicMap = map[string]string{}, map[catalog.TableName]string{}
	f.sourceFlags.register(fs, "logical replication slot (pgoutput), created by the first run")
	f.spillFlags.register(fs)
	f.pgoutputFlags.register(fs, "receive logical decoding messages (to topic PREFIX.message)",
		"decode prepared transactions at PREPARE; their events go to Kafka at COMMIT PREPARED, "+
			"none at ROLLBACK PREPARED (turns two-phase on for the slot for good)")
	fs.IntVar(&f.copyWorkers, "copy-workers", 0, fmt.Sprintf("tables (or parts of tables) copied at once (default %d)", snapshot.DefaultWorkers))
	f.monitorFlags.register(fs, replication.DefaultStatusInterval)
	f.newTablesFlags.register(fs)
	fs.StringVar(&f.sourceName, "source-name", "pgreorder", "source.name of the events, the logical name of the source server")
	fs.StringVar(&f.sourceDB, "source-db", "", "source.db of the events (default: the name of the database -source connects to)")
	f.values.register(fs, "")

	fs.StringVar(&f.brokers, "kafka-brokers", "", "Kafka seed brokers, host:port, comma-separated")
	fs.StringVar(&f.prefix, "kafka-topic-prefix", kafkasink.DefaultTopicPrefix, "topic names: PREFIX.SCHEMA.TABLE, PREFIX.message, PREFIX.offsets")
	fs.StringVar(&f.offsetsTopic, "kafka-offsets-topic", "", "compacted topic of the source positions (default PREFIX.offsets)")
	fs.StringVar(&f.txID, "kafka-transactional-id", "", `producer transactional.id (default "pgreorder-" and the slot)`)
	fs.BoolVar(&f.createTopics, "kafka-create-topics", true, "create missing topics; with false, a missing topic stops pgreorder")
	fs.IntVar(&f.partitions, "kafka-partitions", 0, "partitions of the topics created (default: the brokers' num.partitions)")
	fs.IntVar(&f.replicationFactor, "kafka-replication-factor", 0, "replication factor of the topics created (default: the brokers' default.replication.factor)")
	fs.Func("kafka-topic-config", "NAME=VALUE configuration of the table topics created, such as retention.ms=604800000 (repeatable)", func(s string) error {
		k, v, ok := strings.Cut(s, "=")
		if !ok || k == "" {
			return fmt.Errorf("want NAME=VALUE, such as max.message.bytes=10485760")
		}
		f.topicConfigs[k] = v
		return nil
	})
	fs.BoolVar(&f.tombstones, "kafka-tombstones", false, "follow each delete with a tombstone (the key, no value), for log compaction")
	fs.Func("kafka-topic-map", "SCHEMA.TABLE=TOPIC: the topic of a table instead of PREFIX.SCHEMA.TABLE, such as for two tables whose "+
		`topic names collide (repeatable; quote a name that holds a '.' as SQL does: "my.schema".t=topic)`, func(s string) error {
		tn, topic, err := parseTopicMap(s)
		if err != nil {
			return err
		}
		f.topicMap[tn] = topic
		return nil
	})
	fs.StringVar(&f.keyFormat, "kafka-key-format", "json", "record keys: json, or json-schema (with the Kafka Connect schema, "+
		"as JsonConverter with schemas.enable=true)")
	fs.StringVar(&f.valueFormat, "kafka-value-format", "json", "record values: json, or json-schema (with the Kafka Connect schema, "+
		"which Kafka Connect sinks need)")
	fs.StringVar(&f.clientID, "kafka-client-id", "pgreorder", "Kafka client.id")
	fs.StringVar(&f.compression, "kafka-compression", "", "batch compression: none, gzip, snappy, lz4 or zstd (default: snappy)")
	fs.StringVar(&f.maxBytes, "kafka-max-buffered", "64MB", "most record bytes waiting for the brokers; a big transaction waits for room")
	startTimeoutVar(fs, &f.startTimeout, "kafka", "the source and the Kafka brokers")
	fs.DurationVar(&f.txTimeout, "kafka-transaction-timeout", kafkasink.DefaultTransactionTimeout,
		"Kafka transaction timeout: the longest a transaction (and the initial copy) may take to produce; at most the brokers' transaction.max.timeout.ms")
	fs.IntVar(&f.group, "kafka-group", kafkasink.DefaultGroupTransactions,
		"most source transactions in one Kafka transaction while a backlog is there (1: one each); a transaction with nothing after it commits at once")
	fs.BoolVar(&f.tls, "kafka-tls", false, "connect to the brokers with TLS")
	fs.StringVar(&f.tlsCA, "kafka-tls-ca", "", "PEM file of the CA certificates that sign the brokers' (implies -kafka-tls; default: the system's)")
	fs.StringVar(&f.tlsCert, "kafka-tls-cert", "", "PEM file of the client certificate, with -kafka-tls-key (implies -kafka-tls)")
	fs.StringVar(&f.tlsKey, "kafka-tls-key", "", "PEM file of the client certificate's key")
	fs.BoolVar(&f.tlsInsecure, "kafka-tls-insecure", false, "do not verify the brokers' certificates (testing only)")
	fs.StringVar(&f.saslMechanism, "kafka-sasl-mechanism", "", "SASL mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (password in $"+kafkaSASLPasswordEnv+")")
	fs.StringVar(&f.saslUser, "kafka-sasl-user", "", "SASL user name")
}

// config checks the flags, naming them, and returns the feed's and the sink's configurations.
func (f *kafkaFlags) config(fs *flag.FlagSet) (changefeed.Config, kafkasink.Config, error) {
	var cfg changefeed.Config
	var kcfg kafkasink.Config
	if fs.NArg() != 0 {
		return cfg, kcfg, fmt.Errorf("unexpected arguments: %s (every option is a flag; see pgreorder kafka -h)", strings.Join(fs.Args(), " "))
	}
	missing := f.sourceFlags.missing()
	if strings.TrimSpace(f.brokers) == "" {
		missing = append(missing, "-kafka-brokers")
	}
	if len(missing) > 0 {
		return cfg, kcfg, fmt.Errorf("missing %s (see pgreorder kafka -h)", strings.Join(missing, ", "))
	}
	streaming, originFilter, err := f.pgoutputFlags.parse()
	if err != nil {
		return cfg, kcfg, err
	}
	if err := f.monitorFlags.check(); err != nil {
		return cfg, kcfg, err
	}
	if f.copyWorkers < 0 || f.copyWorkers > 64 {
		return cfg, kcfg, fmt.Errorf("-copy-workers %d: want 1 to 64", f.copyWorkers)
	}
	workMem, comp, err := f.spillFlags.parse()
	if err != nil {
		return cfg, kcfg, err
	}
	cfg = changefeed.Config{
		Replication: replication.Config{
			ConnString:     f.source,
			Slot:           f.slot,
			Publications:   f.publications,
			ProtoVersion:   f.proto,
			Streaming:      streaming,
			Binary:         f.binary,
			Messages:       f.messages,
			TwoPhase:       f.twoPhase,
			Failover:       f.failover,
			OriginFilter:   originFilter,
			StatusInterval: f.status,
			Buffer:         reorderbuffer.Config{WorkMem: workMem, Dir: f.dir, SpillCompressor: comp},
		},
		Copy:         snapshot.Config{Workers: f.copyWorkers},
		NewTables:    f.newTables(),
		StartTimeout: cliSlotWait(f.startTimeout),
	}

	var brokers []string
	for b := range strings.SplitSeq(f.brokers, ",") {
		if b = strings.TrimSpace(b); b != "" {
			brokers = append(brokers, b)
		}
	}
	if f.partitions < 0 || f.partitions > 1<<20 {
		return cfg, kcfg, fmt.Errorf("-kafka-partitions %d: want a positive number, or 0 for the brokers' default", f.partitions)
	}
	if f.replicationFactor < 0 || f.replicationFactor > 1<<14 {
		return cfg, kcfg, fmt.Errorf("-kafka-replication-factor %d: want a positive number, or 0 for the brokers' default", f.replicationFactor)
	}
	compression, err := kafkasink.ParseCompression(f.compression)
	if err != nil {
		return cfg, kcfg, fmt.Errorf("-kafka-compression %q: valid values are none, gzip, snappy, lz4 and zstd", f.compression)
	}
	mech, err := kafkasink.ParseSASLMechanism(f.saslMechanism)
	if err != nil {
		return cfg, kcfg, fmt.Errorf("-kafka-sasl-mechanism %q: valid values are PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512", f.saslMechanism)
	}
	if mech != kafkasink.SASLNone && f.saslUser == "" {
		return cfg, kcfg, errors.New("-kafka-sasl-mechanism needs -kafka-sasl-user (and the password in $" + kafkaSASLPasswordEnv + ")")
	}
	if mech == kafkasink.SASLNone && f.saslUser != "" {
		return cfg, kcfg, errors.New("-kafka-sasl-user needs -kafka-sasl-mechanism")
	}
	maxBytes, err := reorderbuffer.ParseWorkMem(f.maxBytes)
	if err != nil || maxBytes <= 0 || maxBytes > 1<<40 {
		return cfg, kcfg, fmt.Errorf("-kafka-max-buffered %q: want a size with a unit, such as 64MB", f.maxBytes)
	}
	if f.txTimeout <= 0 {
		return cfg, kcfg, fmt.Errorf("-kafka-transaction-timeout %v: want a duration such as 5m", f.txTimeout)
	}
	if f.group < 1 {
		return cfg, kcfg, fmt.Errorf("-kafka-group %d: want 1 or more (1: every source transaction its own Kafka transaction)", f.group)
	}
	tlsCfg, err := f.tlsConfig()
	if err != nil {
		return cfg, kcfg, err
	}
	topics := kafkasink.CreateTopics
	if !f.createTopics {
		topics = kafkasink.RequireTopics
	}
	keyFormat, err := kafkasink.ParseRecordFormat(f.keyFormat)
	if err != nil {
		return cfg, kcfg, fmt.Errorf("-kafka-key-format %q: valid values are json and json-schema", f.keyFormat)
	}
	valueFormat, err := kafkasink.ParseRecordFormat(f.valueFormat)
	if err != nil {
		return cfg, kcfg, fmt.Errorf("-kafka-value-format %q: valid values are json and json-schema", f.valueFormat)
	}
	fcfg := format.Config{Server: f.sourceName, Database: f.sourceDB, Version: shortVersion()}
	if err := f.values.apply(&fcfg); err != nil {
		return cfg, kcfg, err
	}
	kcfg = kafkasink.Config{
		Brokers:            brokers,
		TopicPrefix:        f.prefix,
		OffsetsTopic:       f.offsetsTopic,
		TransactionalID:    f.txID,
		Topics:             topics,
		Partitions:         int32(f.partitions),
		ReplicationFactor:  int16(f.replicationFactor),
		TopicConfigs:       f.topicConfigs,
		Tombstones:         f.tombstones,
		TopicMap:           f.topicMap,
		KeyFormat:          keyFormat,
		ValueFormat:        valueFormat,
		Format:             fcfg,
		TLS:                tlsCfg,
		SASL:               kafkasink.SASL{Mechanism: mech, User: f.saslUser, Password: os.Getenv(kafkaSASLPasswordEnv)},
		ClientID:           f.clientID,
		Compression:        compression,
		MaxBufferedBytes:   int(maxBytes),
		TransactionTimeout: f.txTimeout,
		Group:              changefeed.Grouping{MaxTransactions: f.group},
	}
	if err := kafkasink.ValidTopicName(f.prefix); err != nil {
		return cfg, kcfg, fmt.Errorf("-kafka-topic-prefix: %w", err)
	}
	if f.offsetsTopic != "" {
		if err := kafkasink.ValidTopicName(f.offsetsTopic); err != nil {
			return cfg, kcfg, fmt.Errorf("-kafka-offsets-topic: %w", err)
		}
	}
	return cfg, kcfg, nil
}

// parseTopicMap reads SCHEMA.TABLE=TOPIC, each name as SQL writes it: bare (folded to lower
// case, as PostgreSQL folds it) or double-quoted (as it is, "" for a quote).
func parseTopicMap(s string) (catalog.TableName, string, error) {
	bad := func(why string) (catalog.TableName, string, error) {
		return catalog.TableName{}, "", fmt.Errorf("%q: %s; want SCHEMA.TABLE=TOPIC, such as sales.order_items=sales-order-items", s, why)
	}
	var names []string
	rest := s
	for len(names) < 2 {
		var name string
		if strings.HasPrefix(rest, `"`) {
			var b strings.Builder
			i := 1
			for ; i < len(rest); i++ {
				if rest[i] == '"' {
					if i+1 < len(rest) && rest[i+1] == '"' {
						b.WriteByte('"')
						i++
						continue
					}
					break
				}
				b.WriteByte(rest[i])
			}
			if i >= len(rest) {
				return bad("an unterminated quoted name")
			}
			name, rest = b.String(), rest[i+1:]
		} else {
			end := strings.IndexAny(rest, ".=")
			if end < 0 {
				return bad("no '='")
			}
			name, rest = strings.ToLower(rest[:end]), rest[end:]
		}
		if name == "" {
			return bad("an empty name")
		}
		names = append(names, name)
		sep := byte('=')
		if len(names) == 1 {
			sep = '.'
		}
		if rest == "" || rest[0] != sep {
			return bad(fmt.Sprintf("expected '%c' after %q", sep, name))
		}
		rest = rest[1:]
	}
	if err := kafkasink.ValidTopicName(rest); err != nil {
		return bad(err.Error())
	}
	return catalog.TableName{Schema: names[0], Name: names[1]}, rest, nil
}

func (f *kafkaFlags) tlsConfig() (*tls.Config, error) {
	if !f.tls && f.tlsCA == "" && f.tlsCert == "" && f.tlsKey == "" && !f.tlsInsecure {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: f.tlsInsecure}
	if f.tlsCA != "" {
		pem, err := os.ReadFile(f.tlsCA)
		if err != nil {
			return nil, fmt.Errorf("-kafka-tls-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("-kafka-tls-ca %s: no PEM certificate in it", f.tlsCA)
		}
		c.RootCAs = pool
	}
	if (f.tlsCert == "") != (f.tlsKey == "") {
		return nil, errors.New("-kafka-tls-cert and -kafka-tls-key go together")
	}
	if f.tlsCert != "" {
		cert, err := tls.LoadX509KeyPair(f.tlsCert, f.tlsKey)
		if err != nil {
			return nil, fmt.Errorf("-kafka-tls-cert, -kafka-tls-key: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

// refusalHint adds to the brokers' refusals (and failed TLS handshakes) the flags that decide
// them.
func (f *kafkaFlags) refusalHint(err error) error {
	var verify *tls.CertificateVerificationError
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	switch {
	case errors.Is(err, kafkasink.ErrAuthentication) && (errors.As(err, &verify) || errors.As(err, &unknown) || errors.As(err, &host)):
		return fmt.Errorf("%w\n(the brokers' TLS certificate is not trusted: give the CA that signs it with -kafka-tls-ca, "+
			"and name the brokers in -kafka-brokers as their certificate does)", err)
	case errors.Is(err, kafkasink.ErrAuthentication) && f.saslMechanism != "":
		return fmt.Errorf("%w\n(check -kafka-sasl-mechanism %s, -kafka-sasl-user %q and the password in $%s)", err, f.saslMechanism, f.saslUser, kafkaSASLPasswordEnv)
	case errors.Is(err, kafkasink.ErrAuthentication):
		return fmt.Errorf("%w\n(check -kafka-tls, -kafka-tls-ca, -kafka-tls-cert and -kafka-tls-key, and whether the brokers want SASL: -kafka-sasl-mechanism)", err)
	case errors.Is(err, kafkasink.ErrAuthorization):
		user := "ANONYMOUS"
		if f.saslUser != "" {
			user = f.saslUser
		}
		txID := f.txID
		if txID == "" {
			txID = "pgreorder-" + f.slot
		}
		return fmt.Errorf("%w\n(the brokers' ACLs deny user %q, of -kafka-sasl-user: it needs WRITE and DESCRIBE on transactional id %q, "+
			"and READ, WRITE, DESCRIBE and DESCRIBE_CONFIGS on the topics %s.* (and CREATE, unless they exist and -kafka-create-topics=false); "+
			"nothing of the failed transaction was acknowledged to PostgreSQL)", err, user, txID, f.prefix)
	}
	return err
}

// kafkaProgress prints, every interval in which something was committed, what reached Kafka:
// a line after the stream's progress line. It returns what stops it.
func kafkaProgress(sink *kafkasink.Sink, every time.Duration) (stop func()) {
	if every <= 0 {
		return func() {}
	}
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(every)
		defer t.Stop()
		var last kafkasink.Stats
		for {
			select {
			case <-done:
				return
			case now := <-t.C:
				st := sink.Stats()
				if st.Transactions == last.Transactions {
					continue
				}
				n := st.Transactions - last.Transactions
				avg := (st.CommitTime - last.CommitTime) / time.Duration(n)
				fmt.Fprintf(os.Stderr, "%s kafka committed_through=%s transactions=%d (+%d) events=%d (+%d) bytes=%d commit_avg=%v\n",
					now.Format(time.TimeOnly), st.Position, st.Transactions, n, st.Events, st.Events-last.Events, st.Bytes, avg.Round(time.Microsecond))
				last = st
			}
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}
