package kafkasink

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/pgreorder/pgreorder/catalog"
	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/format"
	"github.com/pgreorder/pgreorder/internal/configerr"
)

// Defaults of Config.
const (
	DefaultTopicPrefix        = "pgreorder"
	DefaultMaxBufferedBytes   = 64 << 20
	DefaultMaxBufferedRecords = 100_000
	DefaultTransactionTimeout = 5 * time.Minute

	// Defaults of Config.Group. A group stays open (while the next source transaction is
	// there) at most DefaultGroupCommitMultiple times the recent duration of a Kafka commit, at
	// least DefaultGroupMinDelay, and at most DefaultGroupDelay: about 40ms when a commit takes
	// 10ms. The count and the WAL it spans bound it too.
	DefaultGroupTransactions   = 10_000
	DefaultGroupBytes          = 16 << 20
	DefaultGroupDelay          = 250 * time.Millisecond
	DefaultGroupCommitMultiple = 4
	DefaultGroupMinDelay       = 10 * time.Millisecond
)

// TopicCreation says what the sink does about a topic that does not exist.
type TopicCreation int

const (
	// CreateTopics creates a missing topic with Config.Partitions and Config.ReplicationFactor
	// (the default).
	CreateTopics TopicCreation = iota
	// RequireTopics refuses to write to a missing topic: the sink stops with ErrTopicMissing.
	RequireTopics
)

// RecordFormat is how a record's key or value is written.
type RecordFormat int

const (
	// FormatJSON is the JSON of the event alone, as Kafka's JsonConverter writes it with
	// schemas.enable=false (the default).
	FormatJSON RecordFormat = iota
	// FormatJSONSchema is {"schema":…,"payload":…}: the event with its Kafka Connect schema, as
	// Debezium's records through JsonConverter with schemas.enable=true, which Kafka Connect sinks
	// need.
	FormatJSONSchema
)

// String returns the format's name: json or json-schema.
func (f RecordFormat) String() string {
	switch f {
	case FormatJSON:
		return "json"
	case FormatJSONSchema:
		return "json-schema"
	}
	return fmt.Sprintf("RecordFormat(%d)", int(f))
}

// ParseRecordFormat returns the format named s: json or json-schema ("" is FormatJSON).
func ParseRecordFormat(s string) (RecordFormat, error) {
	switch s {
	case "", "json":
		return FormatJSON, nil
	case "json-schema":
		return FormatJSONSchema, nil
	}
	return 0, fmt.Errorf("%w: record format %q (valid: json, json-schema)", ErrInvalidConfig, s)
}

// Compression is the producer's batch compression.
type Compression int

const (
	// CompressionDefault is the client's default (snappy where the broker takes it).
	CompressionDefault Compression = iota
	CompressionNone
	CompressionGzip
	CompressionSnappy
	CompressionLZ4
	CompressionZstd
)

var compressionNames = map[string]Compression{"none": CompressionNone, "gzip": CompressionGzip,
	"snappy": CompressionSnappy, "lz4": CompressionLZ4, "zstd": CompressionZstd}

// ParseCompression returns the compression named s: none, gzip, snappy, lz4 or zstd ("" is
// CompressionDefault).
func ParseCompression(s string) (Compression, error) {
	if s == "" {
		return CompressionDefault, nil
	}
	if c, ok := compressionNames[s]; ok {
		return c, nil
	}
	return 0, fmt.Errorf("%w: compression %q (valid: none, gzip, snappy, lz4, zstd)", ErrInvalidConfig, s)
}

// SASLMechanism is a SASL authentication mechanism.
type SASLMechanism int

const (
	// SASLNone: no SASL authentication (the default).
	SASLNone SASLMechanism = iota
	SASLPlain
	SASLScramSHA256
	SASLScramSHA512
)

// String returns the mechanism's name as Kafka spells it (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512),
// or "none".
func (m SASLMechanism) String() string {
	switch m {
	case SASLNone:
		return "none"
	case SASLPlain:
		return "PLAIN"
	case SASLScramSHA256:
		return "SCRAM-SHA-256"
	case SASLScramSHA512:
		return "SCRAM-SHA-512"
	}
	return fmt.Sprintf("SASLMechanism(%d)", int(m))
}

// ParseSASLMechanism returns the mechanism named s: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 ("" is
// SASLNone), in any case.
func ParseSASLMechanism(s string) (SASLMechanism, error) {
	switch strings.ToUpper(s) {
	case "":
		return SASLNone, nil
	case "PLAIN":
		return SASLPlain, nil
	case "SCRAM-SHA-256":
		return SASLScramSHA256, nil
	case "SCRAM-SHA-512":
		return SASLScramSHA512, nil
	}
	return 0, fmt.Errorf("%w: SASL mechanism %q (valid: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)", ErrInvalidConfig, s)
}

// SASL is the authentication to the brokers.
type SASL struct {
	Mechanism      SASLMechanism
	User, Password string
}

// Config configures a Sink. Brokers is required; every other field has a working zero value.
type Config struct {
	// Brokers are the seed brokers, host:port.
	Brokers []string
	// TopicPrefix starts every topic name: PREFIX.SCHEMA.TABLE for a table's events,
	// PREFIX.message for logical decoding messages. "" means DefaultTopicPrefix.
	TopicPrefix string
	// OffsetsTopic is the compacted topic the source positions are written to, in the Kafka
	// transaction of the events they follow. "" means PREFIX.offsets.
	OffsetsTopic string
	// TransactionalID is the producer's transactional.id. "" means "pgreorder-" and the slot's
	// name: two sinks of one slot fence each other, whichever started last wins.
	TransactionalID string
	// Topics says whether missing topics are created (CreateTopics, the default) or refused.
	Topics TopicCreation
	// Partitions and ReplicationFactor of the topics the sink creates; 0 means the broker's
	// default (num.partitions, default.replication.factor). The offsets topic has one partition.
	Partitions        int32
	ReplicationFactor int16
	// TopicConfigs are the topic configurations of the table topics the sink creates
	// (retention.ms, max.message.bytes, ...).
	TopicConfigs map[string]string
	// TopicMap names the topic of some tables, instead of PREFIX.SCHEMA.TABLE: for two tables
	// whose topic names would collide, or to route a table elsewhere (as Debezium's routing
	// transform is used for).
	TopicMap map[catalog.TableName]string
	// Tombstones adds, after each delete event, a record with the key and no value, as
	// Debezium's tombstones.on.delete does, so that log compaction can drop the key. A table
	// without key gets no tombstones.
	Tombstones bool
	// KeyFormat and ValueFormat say whether keys and values carry their Kafka Connect schema.
	KeyFormat, ValueFormat RecordFormat

	// Format gives the events' source block (Server, Database, Version), the value mapping
	// (Decimal, Interval, Values) and the clock (Now); its Kind, StageBytes and TempDir do not
	// apply, and the Sink sets KeySchema, ValueSchema and SchemaName. Its Tables, if nil, is the
	// changefeed's catalog reader (changefeed.Batch.Catalog), and its Database, if "", the name of
	// the database that reader reads.
	Format format.Config

	// TLS, when not nil, connects to the brokers with TLS.
	TLS *tls.Config
	// SASL authenticates to the brokers.
	SASL SASL
	// ClientID is the Kafka client.id; "" means "pgreorder".
	ClientID string
	// Compression of produced batches.
	Compression Compression
	// MaxBufferedBytes and MaxBufferedRecords bound what the producer holds while the brokers have
	// not acknowledged it; a transaction is produced while it is read, and its records wait for
	// room. 0 means DefaultMaxBufferedBytes and DefaultMaxBufferedRecords.
	MaxBufferedBytes   int
	MaxBufferedRecords int
	// TransactionTimeout is the Kafka transaction timeout: the longest a source transaction (or
	// the initial copy, one Kafka transaction) may take to produce. It must not exceed the
	// brokers' transaction.max.timeout.ms (15 minutes by default). 0 means
	// DefaultTransactionTimeout.
	TransactionTimeout time.Duration
	// Group bounds how many consecutive source transactions share one Kafka transaction when
	// the stream already holds the next one (a steady load, a backlog): at most MaxTransactions
	// of them, over at most MaxBytes of WAL, for at most CommitMultiple times the recent duration
	// of a Kafka commit but at least MinDelay, and at most MaxDelay. So the first source
	// transaction of a group waits for its commit about as long as a few commits take (with the
	// defaults, 4 times a commit's duration, 10ms to 250ms), and commits take about a fifth of
	// the time when the stream is behind. A source transaction the stream has nothing after
	// commits at once, alone. Zero fields mean DefaultGroupTransactions (10,000),
	// DefaultGroupBytes (16MB), DefaultGroupDelay (250ms), DefaultGroupCommitMultiple (4) and
	// DefaultGroupMinDelay (10ms); MaxTransactions 1 makes every source transaction its own
	// Kafka transaction.
	Group changefeed.Grouping

	// ConnectTimeout bounds the first contact with the brokers, when the Sink loads the position:
	// no broker answering within it is ErrUnreachable. 0 means 30 seconds.
	ConnectTimeout time.Duration

	// Opts are more options for the client, applied after the sink's own; options that break
	// the sink's promise (another TransactionalID, DisableIdempotentWrite, a read isolation
	// level) must not be given.
	Opts []kgo.Opt

	// Logger receives what the sink does; nil logs nothing.
	Logger *slog.Logger
}

var discardLogger = slog.New(slog.DiscardHandler)

func (c *Config) withDefaults() (Config, error) {
	cfg := *c
	if len(cfg.Brokers) == 0 {
		return cfg, configerr.New(ErrInvalidConfig, field("Brokers"), "is required")
	}
	if cfg.TopicPrefix == "" {
		cfg.TopicPrefix = DefaultTopicPrefix
	}
	if err := validTopic(cfg.TopicPrefix); err != nil {
		return cfg, configerr.New(ErrInvalidConfig, field("TopicPrefix"), "is not valid: %v", err)
	}
	if cfg.OffsetsTopic == "" {
		cfg.OffsetsTopic = cfg.TopicPrefix + ".offsets"
	}
	for tn, topic := range cfg.TopicMap {
		if err := validTopic(topic); err != nil {
			return cfg, configerr.New(ErrInvalidConfig, field("TopicMap"), "of %s is not valid: %v", tn, err)
		}
	}
	if cfg.KeyFormat != FormatJSON && cfg.KeyFormat != FormatJSONSchema || cfg.ValueFormat != FormatJSON && cfg.ValueFormat != FormatJSONSchema {
		f, v := field("KeyFormat"), cfg.KeyFormat
		if cfg.KeyFormat == FormatJSON || cfg.KeyFormat == FormatJSONSchema {
			f, v = field("ValueFormat"), cfg.ValueFormat
		}
		return cfg, configerr.New(ErrInvalidConfig, f, "%v is unknown", v)
	}
	if err := validTopic(cfg.OffsetsTopic); err != nil {
		return cfg, configerr.New(ErrInvalidConfig, field("OffsetsTopic"), "is not valid: %v", err)
	}
	if cfg.Partitions < 0 {
		return cfg, configerr.New(ErrInvalidConfig, field("Partitions"), "%d (want 0 for the brokers' default, or more)", cfg.Partitions)
	}
	if cfg.ReplicationFactor < 0 {
		return cfg, configerr.New(ErrInvalidConfig, field("ReplicationFactor"), "%d (want 0 for the brokers' default, or more)", cfg.ReplicationFactor)
	}
	if cfg.ClientID == "" {
		cfg.ClientID = "pgreorder"
	}
	if cfg.MaxBufferedBytes <= 0 {
		cfg.MaxBufferedBytes = DefaultMaxBufferedBytes
	}
	if cfg.MaxBufferedRecords <= 0 {
		cfg.MaxBufferedRecords = DefaultMaxBufferedRecords
	}
	if cfg.TransactionTimeout <= 0 {
		cfg.TransactionTimeout = DefaultTransactionTimeout
	}
	if cfg.Group.MaxTransactions < 0 || cfg.Group.MaxBytes < 0 || cfg.Group.MaxDelay < 0 ||
		!(cfg.Group.CommitMultiple >= 0) || math.IsInf(cfg.Group.CommitMultiple, 0) || cfg.Group.MinDelay < 0 {
		return cfg, configerr.New(ErrInvalidConfig, field("Group"), "has a negative (or infinite) bound")
	}
	if cfg.Group.MaxTransactions == 0 {
		cfg.Group.MaxTransactions = DefaultGroupTransactions
	}
	if cfg.Group.MaxBytes == 0 {
		cfg.Group.MaxBytes = DefaultGroupBytes
	}
	if cfg.Group.MaxDelay == 0 {
		cfg.Group.MaxDelay = DefaultGroupDelay
	}
	if cfg.Group.CommitMultiple == 0 {
		cfg.Group.CommitMultiple = DefaultGroupCommitMultiple
	}
	if cfg.Group.MinDelay == 0 {
		cfg.Group.MinDelay = DefaultGroupMinDelay
	}
	if cfg.Logger == nil {
		cfg.Logger = discardLogger
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = 30 * time.Second
	}
	if cfg.SASL.Mechanism != SASLNone && cfg.SASL.User == "" {
		return cfg, configerr.New(ErrInvalidConfig, field("SASL.User"), "is required with a SASL mechanism")
	}
	return cfg, nil
}

// clientOpts returns the options every client of the sink has: connection, authentication.
func (c *Config) clientOpts() ([]kgo.Opt, error) {
	// Metadata is not cached for long: a topic just created is written at once.
	opts := []kgo.Opt{kgo.SeedBrokers(c.Brokers...), kgo.ClientID(c.ClientID), kgo.MetadataMinAge(100 * time.Millisecond)}
	if c.TLS != nil {
		opts = append(opts, kgo.DialTLSConfig(c.TLS.Clone()))
	}
	var m sasl.Mechanism
	switch c.SASL.Mechanism {
	case SASLNone:
	case SASLPlain:
		m = plain.Auth{User: c.SASL.User, Pass: c.SASL.Password}.AsMechanism()
	case SASLScramSHA256:
		m = scram.Auth{User: c.SASL.User, Pass: c.SASL.Password}.AsSha256Mechanism()
	case SASLScramSHA512:
		m = scram.Auth{User: c.SASL.User, Pass: c.SASL.Password}.AsSha512Mechanism()
	default:
		return nil, configerr.New(ErrInvalidConfig, field("SASL.Mechanism"), "%d is unknown", c.SASL.Mechanism)
	}
	if m != nil {
		opts = append(opts, kgo.SASL(m))
	}
	return opts, nil
}

func (c Compression) codec() (kgo.CompressionCodec, bool) {
	switch c {
	case CompressionNone:
		return kgo.NoCompression(), true
	case CompressionGzip:
		return kgo.GzipCompression(), true
	case CompressionSnappy:
		return kgo.SnappyCompression(), true
	case CompressionLZ4:
		return kgo.Lz4Compression(), true
	case CompressionZstd:
		return kgo.ZstdCompression(), true
	}
	return kgo.CompressionCodec{}, false
}
