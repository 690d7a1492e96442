package kafkasink

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgreorder/pgreorder/catalog"
	"github.com/pgreorder/pgreorder/changefeed"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/format"
	"github.com/pgreorder/pgreorder/internal/configerr"
	"github.com/pgreorder/pgreorder/internal/retry"
)

var (
	// ErrInvalidConfig is wrapped by the errors of a Config that cannot work.
	ErrInvalidConfig = retry.Stop("kafkasink: invalid configuration")
	// ErrFenced: another sink with the same transactional id (the same slot) started and took
	// over; this one stopped, and what it had not committed is aborted.
	ErrFenced = retry.Stop("kafkasink: fenced by another instance with the same transactional id")
	// ErrTopicMissing: a topic does not exist and Config.Topics is RequireTopics.
	ErrTopicMissing = retry.Stop("kafkasink: topic does not exist")
	// ErrRecordTooLarge: an event is larger than its topic's max.message.bytes.
	ErrRecordTooLarge = retry.Stop("kafkasink: record larger than the topic's max.message.bytes")
	// ErrUnreachable: no broker answered.
	ErrUnreachable = retry.Retry("kafkasink: cannot reach the Kafka brokers")
	// ErrAuthentication: the brokers refused the SASL credentials (Config.SASL), or the TLS
	// handshake failed (Config.TLS: the brokers' certificate is not trusted, or names another
	// host). Nothing was produced.
	ErrAuthentication = retry.Stop("kafkasink: authentication to the Kafka brokers failed")
	// ErrAuthorization: the brokers' ACLs deny the sink's user an operation it needs (writing
	// its transactional id, describing, creating, reading or writing a topic). What the open
	// Kafka transaction held is aborted, and nothing of it is acknowledged to the source.
	ErrAuthorization = retry.Stop("kafkasink: not authorized by the Kafka brokers")
	// ErrClosed is returned after Close.
	ErrClosed = retry.Stop("kafkasink: closed")
)

// recordOverhead bounds what a record adds to its key and value in a batch of one: the batch
// header (61 bytes) and the record's own varints and attributes.
const recordOverhead = 61 + 40

// Stats are a Sink's counters since it was opened.
type Stats struct {
	Events       int64         // events produced, committed or not (tombstones included; positions not)
	Bytes        int64         // bytes of their keys and values
	Transactions int64         // Kafka transactions committed
	CommitTime   time.Duration // total time spent committing (flush and EndTxn)
	LastCommit   time.Duration // the last commit's
	Position     decoding.LSN
}

// Sink writes a changefeed to Kafka: it is the changefeed.Store whose units are Kafka
// transactions, and Handle is the changefeed.Handler that produces the events into them.
// Open one per Run; it is used by one Run at a time.
type Sink struct {
	cfg Config
	log *slog.Logger
	adm *kadm.Client
	ac  *kgo.Client // admin and reading: not transactional

	slot string
	txID string
	cl   *kgo.Client // the transactional producer, made by Load

	// recCtx ends with the Sink. txCtx, under it, is the context of the open transaction's
	// records: a record's delivery does not end with its batch's context (a copied chunk's ends
	// with the copy, before the copy's transaction commits), only with its transaction, or when
	// a batch's context ends while the producer waits for room in its buffer (interrupt).
	recCtx    context.Context
	recCancel context.CancelFunc
	waiting   atomic.Int64 // Produce calls waiting for room

	mu       sync.Mutex // the open transaction; held while the client ends it
	inTxn    bool
	txCtx    context.Context
	txCancel context.CancelFunc
	closed   bool

	// failMu guards failed and txn apart from mu: promises set failed while mu's holder waits
	// for them (AbortBufferedRecords, EndTransaction). txn numbers the transactions begun: a
	// record's promise can come after its transaction ended and the next began (a record that
	// failed before it was buffered is not waited for by AbortBufferedRecords), and its error is
	// not the new transaction's. txn is written with mu held too, so that produce reads it with
	// txCtx.
	failMu  sync.Mutex
	failed  error  // the first produce error of the open transaction
	txn     uint64 // the open (or last) transaction's number
	aborted bool   // abort ended transaction txn: its records' failures are errAborted

	topicMu sync.Mutex
	topics  map[string]int // topics known to exist: their max.message.bytes
	names   *topics        // the tables' topics

	dbOnce sync.Once // the source database's name read from the catalog, where Format has none
	db     string
	dbErr  error

	evMu   sync.Mutex
	events map[int]*format.Events // by worker

	initialized atomic.Pointer[string] // the transactional id, once initialized

	events64, bytes64, txns64, commitNs, lastNs atomic.Int64
	lastPos                                     atomic.Uint64
}

// Open returns a Sink for cfg. It connects when Run loads the position (Load).
func Open(cfg Config) (*Sink, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	opts, err := c.clientOpts()
	if err != nil {
		return nil, err
	}
	ac, err := kgo.NewClient(append(opts, c.Opts...)...)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	s := &Sink{cfg: c, log: c.Logger, ac: ac, adm: kadm.NewClient(ac), topics: map[string]int{}, events: map[int]*format.Events{},
		names: newTopics(c.TopicPrefix, c.TopicMap, c.OffsetsTopic, c.TopicPrefix+".message")}
	s.recCtx, s.recCancel = context.WithCancel(context.Background())
	return s, nil
}

// TransactionalID returns the producer's transactional id once Load has initialized it (from then
// on, earlier producers of the id are fenced), "" before. It is safe for concurrent use.
func (s *Sink) TransactionalID() string {
	if p := s.initialized.Load(); p != nil {
		return *p
	}
	return ""
}

// Stats returns the sink's counters.
func (s *Sink) Stats() Stats {
	return Stats{Events: s.events64.Load(), Bytes: s.bytes64.Load(), Transactions: s.txns64.Load(),
		CommitTime: time.Duration(s.commitNs.Load()), LastCommit: time.Duration(s.lastNs.Load()),
		Position: decoding.LSN(s.lastPos.Load())}
}

// storedPosition is a position as the offsets topic holds it (the record's key is the slot).
type storedPosition struct {
	Slot     string       `json:"slot"`
	SystemID string       `json:"system_id"`
	CopyDone bool         `json:"copy_done"`
	EndLSN   decoding.LSN `json:"end_lsn"` // as PostgreSQL prints it, "16/B374D848"
	State    []byte       `json:"state,omitempty"`
	// Tables and Sync are changefeed.Position's (absent from an earlier release's records, which
	// load with neither: Tables null is unknown).
	Tables []uint32              `json:"tables"`
	Sync   *changefeed.TableSync `json:"sync,omitempty"`
}

// Load fences any earlier producer of the slot's transactional id (its open transaction is
// aborted), then reads the slot's last committed position from the offsets topic
// (read_committed). It is changefeed.Store's Load, which the Feed running on the Sink calls at
// each attempt; called again, it aborts the Sink's open transaction. To read what a running Sink
// committed, read the offsets topic with a consumer of its own (read_committed).
func (s *Sink) Load(ctx context.Context, slot string) (changefeed.Position, bool, error) {
	if s.closed {
		return changefeed.Position{}, false, ErrClosed
	}
	if s.cl != nil {
		// Again (a copy started over): the transaction left open is aborted, and the position
		// read anew.
		if slot != s.slot {
			return changefeed.Position{}, false, fmt.Errorf("%w: the Sink is of slot %q, not %q", ErrInvalidConfig, s.slot, slot)
		}
		s.mu.Lock()
		err := s.abort(ctx)
		s.mu.Unlock()
		if err != nil {
			return changefeed.Position{}, false, err
		}
		return s.readPosition(ctx)
	}
	if slot == "" {
		return changefeed.Position{}, false, fmt.Errorf("%w: no slot", ErrInvalidConfig)
	}
	s.slot = slot
	s.txID = s.cfg.TransactionalID
	if s.txID == "" {
		s.txID = "pgreorder-" + slot
	}
	if err := s.reach(ctx); err != nil {
		return changefeed.Position{}, false, err
	}
	if err := s.ensureOffsetsTopic(ctx); err != nil {
		return changefeed.Position{}, false, err
	}
	opts, err := s.cfg.clientOpts()
	if err != nil {
		return changefeed.Position{}, false, err
	}
	opts = append(opts,
		kgo.TransactionalID(s.txID),
		kgo.TransactionTimeout(s.cfg.TransactionTimeout),
		kgo.RecordDeliveryTimeout(s.cfg.TransactionTimeout),
		kgo.MaxBufferedBytes(s.cfg.MaxBufferedBytes),
		kgo.MaxBufferedRecords(s.cfg.MaxBufferedRecords),
		kgo.ProducerBatchMaxBytesFn(s.batchMaxBytes),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.UnknownTopicRetries(-1), // topics are made before they are written
	)
	if codec, ok := s.cfg.Compression.codec(); ok {
		opts = append(opts, kgo.ProducerBatchCompression(codec))
	}
	cl, err := kgo.NewClient(append(opts, s.cfg.Opts...)...)
	if err != nil {
		return changefeed.Position{}, false, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	s.cl = cl
	// Fence: from here on an earlier instance can neither produce nor commit, and its open
	// transaction is aborted.
	if _, _, err := cl.ProducerID(ctx); err != nil {
		return changefeed.Position{}, false, s.wrap(fmt.Errorf("kafkasink: initializing transactional id %q: %w", s.txID, err))
	}
	id := s.txID
	s.initialized.Store(&id)
	return s.readPosition(ctx)
}

// reach checks that a broker answers, within Config.ConnectTimeout. It sends a metadata request
// of its own: kadm's BrokerMetadata answers from the client's list of brokers once it has one.
func (s *Sink) reach(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(ctx, s.cfg.ConnectTimeout)
	defer cancel()
	req := kmsg.NewPtrMetadataRequest()
	req.Topics = []kmsg.MetadataRequestTopic{} // brokers only
	if _, err := req.RequestWith(rctx, s.ac); err != nil {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		if cerr := s.classify(err); cerr != nil {
			return cerr
		}
		return fmt.Errorf("%w %v: %v", ErrUnreachable, s.cfg.Brokers, err)
	}
	return nil
}

// probeKey is the key of the record Load commits to find the end of what was committed before it.
func (s *Sink) probeKey() []byte { return []byte("pgreorder.load:" + s.slot) }

// readPosition commits a probe record to the offsets topic, then reads the topic read_committed
// up to it: every position committed before Load fenced the earlier producer is before it.
func (s *Sink) readPosition(ctx context.Context) (changefeed.Position, bool, error) {
	if err := s.cl.BeginTransaction(); err != nil {
		return changefeed.Position{}, false, s.wrap(err)
	}
	r := &kgo.Record{Topic: s.cfg.OffsetsTopic, Key: s.probeKey(), Value: []byte(strconv.FormatInt(time.Now().UnixMilli(), 10))}
	res := s.cl.ProduceSync(ctx, r)
	err := res.FirstErr()
	if err == nil {
		err = s.cl.EndTransaction(ctx, kgo.TryCommit)
	} else {
		s.cl.EndTransaction(context.WithoutCancel(ctx), kgo.TryAbort)
	}
	if err != nil {
		return changefeed.Position{}, false, s.wrap(fmt.Errorf("kafkasink: writing to the offsets topic %s: %w", s.cfg.OffsetsTopic, err))
	}
	probe := r.Offset
	opts, err := s.cfg.clientOpts()
	if err != nil {
		return changefeed.Position{}, false, err
	}
	rd, err := kgo.NewClient(append(opts,
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{s.cfg.OffsetsTopic: {r.Partition: kgo.NewOffset().AtStart()}}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))...)
	if err != nil {
		return changefeed.Position{}, false, err
	}
	defer rd.Close()
	var last *kgo.Record
	for {
		fs := rd.PollFetches(ctx)
		if ctx.Err() != nil {
			return changefeed.Position{}, false, context.Cause(ctx)
		}
		if err := fs.Err0(); err != nil {
			return changefeed.Position{}, false, fmt.Errorf("kafkasink: reading the offsets topic %s: %w", s.cfg.OffsetsTopic, err)
		}
		done := false
		for _, rec := range fs.Records() {
			if string(rec.Key) == s.slot {
				last = rec
			}
			if rec.Offset >= probe {
				done = true
			}
		}
		if done {
			break
		}
	}
	if last == nil || last.Value == nil {
		return changefeed.Position{}, false, nil
	}
	var sp storedPosition
	if err := json.Unmarshal(last.Value, &sp); err != nil {
		return changefeed.Position{}, false, fmt.Errorf("%w: the offsets topic %s holds for slot %q at offset %d a record that is not a position: %v",
			changefeed.ErrStore, s.cfg.OffsetsTopic, s.slot, last.Offset, err)
	}
	end := sp.EndLSN
	pos := changefeed.Position{Slot: sp.Slot, SystemID: sp.SystemID, CopyDone: sp.CopyDone, EndLSN: end, State: sp.State,
		Tables: sp.Tables, Sync: sp.Sync}
	s.lastPos.Store(uint64(end))
	s.log.Info("kafka position", "slot", s.slot, "end_lsn", end, "copy_done", sp.CopyDone, "offset", last.Offset)
	return pos, true, nil
}

// Begin opens the unit of a batch: the Kafka transaction, begun if none is open. The initial
// copy's chunks, handled concurrently, share one transaction, committed with the copy's end. It
// is changefeed.Store's Begin.
func (s *Sink) Begin(ctx context.Context, worker int) (changefeed.Unit, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	if s.cl == nil {
		return nil, fmt.Errorf("%w: Begin before Load", ErrInvalidConfig)
	}
	if !s.inTxn {
		if err := s.cl.BeginTransaction(); err != nil {
			return nil, s.wrap(err)
		}
		s.inTxn = true
		s.newTxn()
		s.txCtx, s.txCancel = context.WithCancel(s.recCtx)
	}
	return &unit{s: s, worker: worker}, nil
}

// Grouping is changefeed.Grouper's: consecutive source transactions that the stream already
// holds share a Kafka transaction, within Config.Group.
func (s *Sink) Grouping() changefeed.Grouping { return s.cfg.Group }

// restart aborts the open transaction and begins another.
func (s *Sink) restart(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.abort(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	if err := s.cl.BeginTransaction(); err != nil {
		return s.wrap(err)
	}
	s.inTxn = true
	s.newTxn()
	s.txCtx, s.txCancel = context.WithCancel(s.recCtx)
	return nil
}

// Close aborts an open transaction and closes the clients. It is safe to call twice.
func (s *Sink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	defer s.recCancel()
	if s.cl != nil {
		if s.inTxn {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			s.abort(ctx)
			cancel()
		}
		s.cl.Close()
	}
	s.ac.Close()
	return nil
}

// errAborted is the failure of the records of a transaction that abort ended while batches
// still produced into it: another batch of it failed (the copy's chunks share one transaction,
// which the rollback of one aborts), or the sink was closed. It is a cancellation, the
// consequence of that failure and never its cause: it wraps context.Canceled, which gives way to
// the cause in snapshot.Session.Run.
var errAborted = fmt.Errorf("kafkasink: the Kafka transaction was aborted under this batch (another of its batches failed, or the sink was closed): %w", context.Canceled)

// abort ends the open transaction without committing it. s.mu is held. The records that fail
// from then on (for the cancelled context, outside a transaction, or for the abort) fail with
// errAborted, not with the client's error, which would pass for a cause: see fail.
func (s *Sink) abort(ctx context.Context) error {
	if !s.inTxn {
		return nil
	}
	s.inTxn = false
	s.failMu.Lock()
	s.aborted = true
	s.failMu.Unlock()
	s.txCancel()
	err := s.cl.AbortBufferedRecords(ctx)
	if eerr := s.cl.EndTransaction(ctx, kgo.TryAbort); err == nil {
		err = eerr
	}
	return s.wrap(err)
}

type unit struct {
	s      *Sink
	worker int
}

// Commit commits the Kafka transaction with pos written to the offsets topic in it; a copied
// chunk's unit (no position) leaves the copy's transaction open.
func (u *unit) Commit(ctx context.Context, pos *changefeed.Position) error {
	s := u.s
	if pos == nil && u.worker != changefeed.StreamWorker {
		return s.firstFailure()
	}
	start := time.Now()
	if pos != nil {
		v, err := json.Marshal(storedPosition{Slot: pos.Slot, SystemID: pos.SystemID, CopyDone: pos.CopyDone,
			EndLSN: pos.EndLSN, State: pos.State, Tables: pos.Tables, Sync: pos.Sync})
		if err != nil {
			return err
		}
		if err := s.produce(ctx, &kgo.Record{Topic: s.cfg.OffsetsTopic, Key: []byte(s.slot), Value: v}, "", nil); err != nil {
			return err
		}
	}
	if err := s.cl.Flush(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.firstFailure(); err != nil {
		return err
	}
	if !s.inTxn {
		return errors.New("kafkasink: commit without an open transaction")
	}
	err := s.cl.EndTransaction(ctx, kgo.TryCommit)
	s.inTxn = false
	s.txCancel()
	if err != nil {
		return s.wrap(fmt.Errorf("kafkasink: committing the Kafka transaction: %w", err))
	}
	d := time.Since(start)
	s.txns64.Add(1)
	s.commitNs.Add(int64(d))
	s.lastNs.Store(int64(d))
	if pos != nil {
		s.lastPos.Store(uint64(pos.EndLSN))
	}
	return nil
}

// Rollback aborts the Kafka transaction.
func (u *unit) Rollback(ctx context.Context) error {
	u.s.mu.Lock()
	defer u.s.mu.Unlock()
	return u.s.abort(ctx)
}

// wrap makes a fencing error ErrFenced, with what to do, and a refusal of the brokers
// ErrAuthentication or ErrAuthorization; those stop (internal/retry). Any other error of the
// brokers that does not say otherwise (a leader that moved, a coordinator that is loading, a
// timeout) is marked as worth another attempt: the changefeed's copy starts over after it.
func (s *Sink) wrap(err error) error {
	if err == nil {
		return nil
	}
	if err := s.classify(err); err != nil {
		return err
	}
	if errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) {
		return fmt.Errorf("%w %q (another pgreorder for slot %q started; this one stops, and its uncommitted events are aborted): %v",
			ErrFenced, s.txID, s.slot, err)
	}
	if retry.Decided(err) {
		return err
	}
	return retry.Mark(err, true)
}

// classify returns err marked ErrAuthentication or ErrAuthorization if it is the brokers' (or
// the TLS handshake's) refusal, or nil.
func (s *Sink) classify(err error) error {
	if errors.Is(err, ErrAuthentication) || errors.Is(err, ErrAuthorization) {
		return err
	}
	who := "without SASL"
	if s.cfg.SASL.Mechanism != SASLNone {
		who = fmt.Sprintf("as user %q (SASL %s)", s.cfg.SASL.User, s.cfg.SASL.Mechanism)
	}
	var verify *tls.CertificateVerificationError
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	var header tls.RecordHeaderError
	switch {
	case errors.Is(err, kerr.SaslAuthenticationFailed), errors.Is(err, kerr.UnsupportedSaslMechanism), errors.Is(err, kerr.IllegalSaslState):
		return fmt.Errorf("%w %s: %w", ErrAuthentication, who, err)
	case errors.As(err, &verify), errors.As(err, &unknown), errors.As(err, &host), errors.As(err, &invalid), errors.As(err, &header):
		return fmt.Errorf("%w (TLS): %w", ErrAuthentication, err)
	case errors.Is(err, kerr.TopicAuthorizationFailed), errors.Is(err, kerr.ClusterAuthorizationFailed),
		errors.Is(err, kerr.TransactionalIDAuthorizationFailed), errors.Is(err, kerr.GroupAuthorizationFailed):
		return fmt.Errorf("%w %s: %w", ErrAuthorization, who, err)
	}
	return nil
}

func (s *Sink) firstFailure() error {
	s.failMu.Lock()
	defer s.failMu.Unlock()
	return s.failed
}

// newTxn numbers a transaction that begins, with no failure yet. s.mu is held.
func (s *Sink) newTxn() {
	s.failMu.Lock()
	s.txn++
	s.failed, s.aborted = nil, false
	s.failMu.Unlock()
}

// fail records the first produce error of transaction txn while it is the open one; a late
// promise of an earlier transaction's record is ignored. That drops no failure a commit needs:
// a record that was buffered has its promise run before Commit's Flush returns, and one fails
// before it is buffered only when its transaction is ending without a commit (not in a
// transaction any more, or its context cancelled by abort or interrupt; the size limits are
// checked before Produce). A record that fails once its transaction is aborted fails for the
// abort: the transaction's failure is errAborted.
func (s *Sink) fail(txn uint64, err error) {
	s.failMu.Lock()
	if s.failed == nil && txn == s.txn {
		if s.aborted {
			s.failed = errAborted
		} else {
			s.failed = s.wrap(err)
		}
	}
	s.failMu.Unlock()
}

// produce buffers r in the open transaction (waiting for room in the producer's buffer), after
// checking its size against its topic's limit. table names r's table in errors ("" for none).
func (s *Sink) produce(ctx context.Context, r *kgo.Record, table string, key []byte) error {
	max, err := s.topic(ctx, r.Topic)
	if err != nil {
		return err
	}
	size := len(r.Key) + len(r.Value)
	if size+recordOverhead > s.cfg.MaxBufferedBytes {
		return fmt.Errorf("%w: %s, key %s: %d bytes, more than the producer's buffer of %d (raise Config.MaxBufferedBytes, -kafka-max-buffered)",
			ErrRecordTooLarge, describe(r.Topic, table), keyText(key), size+recordOverhead, s.cfg.MaxBufferedBytes)
	}
	if size+recordOverhead > max {
		what := "topic " + r.Topic
		if table != "" {
			what = "table " + table
		}
		return fmt.Errorf("%w: %s, key %s: %d bytes, and topic %s takes at most %d (raise its max.message.bytes, "+
			"and the brokers' message.max.bytes and replica.fetch.max.bytes)", ErrRecordTooLarge, what, keyText(key), size+recordOverhead, r.Topic, max)
	}
	s.mu.Lock()
	txCtx, txn := s.txCtx, s.txn
	s.mu.Unlock()
	if err := s.firstFailure(); err != nil {
		return err
	}
	// Counted as waiting before ctx is checked: an interrupt that comes after sees it.
	s.waiting.Add(1)
	defer s.waiting.Add(-1)
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	s.cl.Produce(txCtx, r, func(r *kgo.Record, err error) {
		if err != nil {
			if errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge) {
				err = fmt.Errorf("%w: topic %s, key %s: %d bytes: %v", ErrRecordTooLarge, r.Topic, keyText(r.Key), len(r.Key)+len(r.Value), err)
			}
			s.fail(txn, err)
		}
	})
	return nil
}

func describe(topic, table string) string {
	if table != "" {
		return "table " + table
	}
	return "topic " + topic
}

func keyText(k []byte) string {
	if k == nil {
		return "null"
	}
	if len(k) > 200 {
		return string(k[:200]) + "..."
	}
	return string(k)
}

// batchMaxBytes is the producer's batch limit for a topic: its max.message.bytes.
func (s *Sink) batchMaxBytes(topic string) int32 {
	s.topicMu.Lock()
	defer s.topicMu.Unlock()
	if m, ok := s.topics[topic]; ok {
		return int32(m)
	}
	return 1 << 20
}

// Handle produces the events of a batch into its unit's Kafka transaction: one record per change,
// truncated table and logical message, for a streamed transaction as for a copied chunk. It is
// the changefeed.Handler of the Sink.
func (s *Sink) Handle(ctx context.Context, b *changefeed.Batch) error {
	if s.cl == nil {
		return fmt.Errorf("%w: Handle before Load (run the Sink as the changefeed's Store)", ErrInvalidConfig)
	}
	stop := context.AfterFunc(ctx, s.interrupt)
	defer stop()
	switch b.Kind {
	case changefeed.Reset:
		// Nothing delivered before counts: a copy's transaction still open is aborted, and the
		// unit goes on in a new one.
		return s.restart(ctx)
	case changefeed.Resume, changefeed.TableReset:
		// Nothing to cut back: what an earlier run did not commit was aborted by Load, and the
		// copy of a table added to the publications commits whole, with its end (its chunks
		// leave the Kafka transaction open, and its last unit stores the position).
		return nil
	case changefeed.Snapshot:
		enc, err := s.encoder(ctx, b, b.Worker)
		if err != nil {
			return err
		}
		_, err = enc.Rows(ctx, b, func(e format.Event) error { return s.event(ctx, e) })
		return err
	case changefeed.Transaction:
		enc, err := s.encoder(ctx, b, changefeed.StreamWorker)
		if err != nil {
			return err
		}
		_, err = enc.Txn(ctx, b.Txn, func(e format.Event) error { return s.event(ctx, e) })
		return err
	}
	return fmt.Errorf("kafkasink: unexpected batch %v", b.Kind)
}

// interrupt fails the open transaction's records when a batch's context ended while a Produce
// waits for room: the wait ends, and the transaction is aborted.
func (s *Sink) interrupt() {
	if s.waiting.Load() == 0 {
		return
	}
	s.mu.Lock()
	if s.txCancel != nil {
		s.txCancel()
	}
	s.mu.Unlock()
}

// encoder returns the event encoder of a worker, made on first use with the batch's catalog
// where Config.Format has no Tables.
func (s *Sink) encoder(ctx context.Context, b *changefeed.Batch, worker int) (*format.Events, error) {
	s.evMu.Lock()
	e, ok := s.events[worker]
	s.evMu.Unlock()
	if ok {
		return e, nil
	}
	fc := s.cfg.Format
	if fc.Tables == nil || fc.Database == "" {
		cat, err := b.Catalog()
		if err != nil {
			return nil, err
		}
		if fc.Tables == nil {
			fc.Tables = cat
		}
		if fc.Database == "" {
			// Copy workers make their encoders at once: one reads the name, all wait for it.
			s.dbOnce.Do(func() { s.db, s.dbErr = cat.Database(ctx) })
			if s.dbErr != nil {
				return nil, fmt.Errorf("kafkasink: reading the source database's name: %w", s.dbErr)
			}
			fc.Database = s.db
		}
	}
	fc.KeySchema = s.cfg.KeyFormat == FormatJSONSchema
	fc.ValueSchema = s.cfg.ValueFormat == FormatJSONSchema
	fc.SchemaName = func(r *decoding.Relation) string { return s.names.name(tableOf(r)) }
	e = format.NewEvents(fc)
	s.evMu.Lock()
	s.events[worker] = e
	s.evMu.Unlock()
	return e, nil
}

// event produces one event (and its tombstone).
func (s *Sink) event(ctx context.Context, e format.Event) error {
	var topic, table string
	var tn catalog.TableName
	if e.Relation != nil {
		tn = tableOf(e.Relation)
		table = tn.String()
		var err error
		if topic, err = s.names.use(tn); err != nil {
			return err
		}
	} else {
		topic = s.cfg.TopicPrefix + ".message"
		if err := validTopic(topic); err != nil {
			return configerr.WithHint(ErrInvalidConfig, ": ", "the message topic: %v (choose a shorter %s)", err, field("TopicPrefix"))
		}
	}
	var key []byte
	if e.Key != nil {
		key = append([]byte(nil), e.Key...)
	}
	var headers []kgo.RecordHeader
	for _, h := range e.Headers {
		headers = append(headers, kgo.RecordHeader{Key: h.Key, Value: append([]byte(nil), h.Value...)})
	}
	r := &kgo.Record{Topic: topic, Key: key, Value: append([]byte(nil), e.Value...), Headers: headers}
	if err := s.produce(ctx, r, table, key); err != nil {
		if e.Relation != nil {
			err = collisionRefused(err, tn, topic)
		}
		return err
	}
	s.events64.Add(1)
	s.bytes64.Add(int64(len(r.Key) + len(r.Value)))
	if e.Op == 'd' && s.cfg.Tombstones && key != nil {
		if err := s.produce(ctx, &kgo.Record{Topic: topic, Key: key, Headers: headers}, table, key); err != nil {
			return err
		}
		s.events64.Add(1)
		s.bytes64.Add(int64(len(key)))
	}
	return nil
}

// topic makes sure topic exists (creating it when allowed) and returns its max.message.bytes.
func (s *Sink) topic(ctx context.Context, topic string) (int, error) {
	s.topicMu.Lock()
	m, ok := s.topics[topic]
	s.topicMu.Unlock()
	if ok {
		return m, nil
	}
	m, err := s.ensureTopic(ctx, topic, s.cfg.Partitions, s.cfg.ReplicationFactor, s.cfg.TopicConfigs)
	if err != nil {
		return 0, err
	}
	s.topicMu.Lock()
	s.topics[topic] = m
	s.topicMu.Unlock()
	return m, nil
}

func (s *Sink) ensureOffsetsTopic(ctx context.Context) error {
	m, conf, err := s.ensureTopicConfig(ctx, s.cfg.OffsetsTopic, 1, s.cfg.ReplicationFactor, map[string]string{"cleanup.policy": "compact"})
	if err != nil {
		return err
	}
	// Load reads the partition its probe went to: the positions must be there too.
	td, err := s.adm.ListTopics(ctx, s.cfg.OffsetsTopic)
	if err != nil {
		return fmt.Errorf("kafkasink: looking up topic %s: %w", s.cfg.OffsetsTopic, err)
	}
	if n := len(td[s.cfg.OffsetsTopic].Partitions); n != 1 {
		return fmt.Errorf("%w: the offsets topic %s has %d partitions; it needs exactly one (and cleanup.policy=compact)", ErrInvalidConfig, s.cfg.OffsetsTopic, n)
	}
	// A delete policy drops the position once retention passes: the next run would find none and
	// refuse the slot. Only compaction keeps the last record of every key for good.
	if p := conf["cleanup.policy"]; p != "compact" {
		return configerr.WithHint(ErrInvalidConfig, ": ", "the offsets topic %s has cleanup.policy=%s; it needs cleanup.policy=compact, or the position is lost "+
			"once retention passes (kafka-configs.sh --alter --entity-type topics --entity-name %s --add-config cleanup.policy=compact, "+
			"or name another topic with %s)", s.cfg.OffsetsTopic, p, s.cfg.OffsetsTopic, field("OffsetsTopic"))
	}
	s.topicMu.Lock()
	s.topics[s.cfg.OffsetsTopic] = m
	s.topicMu.Unlock()
	return nil
}

func (s *Sink) ensureTopic(ctx context.Context, topic string, partitions int32, rf int16, configs map[string]string) (int, error) {
	m, _, err := s.ensureTopicConfig(ctx, topic, partitions, rf, configs)
	return m, err
}

// ensureTopicConfig is ensureTopic, also returning the topic's configuration.
func (s *Sink) ensureTopicConfig(ctx context.Context, topic string, partitions int32, rf int16, configs map[string]string) (_ int, _ map[string]string, err error) {
	defer func() {
		if err != nil {
			if cerr := s.classify(err); cerr != nil {
				err = cerr
			}
		}
	}()
	td, err := s.adm.ListTopics(ctx, topic)
	if err != nil {
		return 0, nil, fmt.Errorf("kafkasink: looking up topic %s: %w", topic, err)
	}
	if !td.Has(topic) || errors.Is(td[topic].Err, kerr.UnknownTopicOrPartition) {
		if s.cfg.Topics == RequireTopics {
			return 0, nil, fmt.Errorf("%w: %s (create it, or let pgreorder create topics)", ErrTopicMissing, topic)
		}
		if partitions == 0 {
			partitions = -1
		}
		if rf == 0 {
			rf = -1
		}
		cfgs := map[string]*string{}
		for k, v := range configs {
			cfgs[k] = &v
		}
		_, err := s.adm.CreateTopic(ctx, partitions, rf, cfgs, topic)
		if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
			return 0, nil, fmt.Errorf("kafkasink: creating topic %s: %w", topic, err)
		}
		s.log.Info("created topic", "topic", topic, "partitions", partitions, "replication_factor", rf)
		if err := s.waitLeaders(ctx, topic); err != nil {
			return 0, nil, err
		}
		s.log.Debug("topic has leaders", "topic", topic)
	} else if err := td[topic].Err; err != nil {
		return 0, nil, fmt.Errorf("kafkasink: topic %s: %w", topic, err)
	}
	rc, err := s.adm.DescribeTopicConfigs(ctx, topic)
	if err != nil {
		return 0, nil, fmt.Errorf("kafkasink: reading the configuration of topic %s: %w", topic, err)
	}
	c, err := rc.On(topic, nil)
	if err != nil {
		return 0, nil, fmt.Errorf("kafkasink: reading the configuration of topic %s: %w", topic, err)
	}
	s.log.Debug("topic configuration read", "topic", topic)
	max := 1048588 // Kafka's default message.max.bytes
	got := map[string]string{}
	for _, kv := range c.Configs {
		if kv.Value != nil {
			got[kv.Key] = *kv.Value
		}
		if kv.Key == "max.message.bytes" && kv.Value != nil {
			if n, err := strconv.Atoi(*kv.Value); err == nil {
				max = n
			}
		}
	}
	return max, got, nil
}

// waitLeaders waits until every partition of a new topic has a leader.
func (s *Sink) waitLeaders(ctx context.Context, topic string) error {
	for {
		td, err := s.adm.ListTopics(ctx, topic)
		if err == nil && td.Has(topic) && td[topic].Err == nil && len(td[topic].Partitions) > 0 {
			ok := true
			for _, p := range td[topic].Partitions {
				ok = ok && p.Leader >= 0 && p.Err == nil
			}
			if ok {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
