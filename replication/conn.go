package replication

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/pgreorder/pgreorder/decoding"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgreorder/pgreorder/internal/configerr"
	"github.com/pgreorder/pgreorder/internal/pgsession"
	"github.com/pgreorder/pgreorder/reorderbuffer"
)

// SnapshotAction says what CREATE_REPLICATION_SLOT does with the snapshot of the slot's
// consistent point.
type SnapshotAction int

const (
	// NoSnapshot creates the slot without a snapshot.
	NoSnapshot SnapshotAction = iota
	// ExportSnapshot exports the snapshot of the slot's consistent point, for an initial copy of
	// the published tables: another connection that runs SET TRANSACTION SNAPSHOT with its name,
	// in a REPEATABLE READ transaction, sees exactly the transactions committed before the
	// consistent point; the stream sends exactly those committed after it.
	ExportSnapshot
)

// Snapshot is what Conn.CreateSlot returns.
type Snapshot struct {
	// Name is the exported snapshot's name for SET TRANSACTION SNAPSHOT ("" with NoSnapshot). It
	// stays valid while the Conn is open and has not started streaming.
	Name string
	// ConsistentPoint is the slot's starting point: transactions committed after it are streamed.
	ConsistentPoint decoding.LSN
	// Slot is the slot's name.
	Slot string
}

// SlotInfo describes a replication slot as pg_replication_slots shows it.
type SlotInfo struct {
	Name      string
	Plugin    string
	Database  string
	Temporary bool
	TwoPhase  bool
	// Failover reports that the slot is kept on standbys that synchronize slots
	// (pg_replication_slots.failover, PostgreSQL 17+; see Config.Failover).
	Failover bool
	// Synced reports that the slot is a copy a standby synchronized from its primary
	// (pg_replication_slots.synced, PostgreSQL 17+): on a server that was promoted, the copy it
	// kept of its former primary's slot.
	Synced bool
	// ConfirmedFlush is the position the server has confirmed for the slot: replication
	// restarts there, and transactions that committed before it are not sent again.
	ConfirmedFlush decoding.LSN
}

// Conn is a replication connection that has passed the pre-flight checks but does not stream
// yet. It lets the caller create the slot with an exported snapshot and copy the tables before
// streaming from the slot's consistent point on the same connection:
//
//	conn, err := replication.Connect(ctx, cfg)
//	snap, err := conn.CreateSlot(ctx, replication.ExportSnapshot)
//	// on another connection: BEGIN ISOLATION LEVEL REPEATABLE READ;
//	// SET TRANSACTION SNAPSHOT 'snap.Name'; copy the tables; COMMIT
//	stream, err := conn.StartStreaming(ctx)
//
// A Conn is used from one goroutine. StartStreaming hands the connection to the Stream; Close
// releases it otherwise.
type Conn struct {
	cfg   Config
	base  *pgconn.Config
	log   *slog.Logger
	sess  *session
	neg   Negotiated
	every time.Duration
}

// Connect opens a replication connection (replication=database, session settings pinned; see
// Config), runs IDENTIFY_SYSTEM and the pre-flight checks, and negotiates the pgoutput options.
// A failed check is a *CheckError naming what to fix: wal_level is not logical, a publication
// does not exist, the slot is not a pgoutput slot of this database or differs in two-phase
// decoding, Buffer.SkipThrough is beyond the server's WAL. Connect does not retry.
func Connect(ctx context.Context, cfg Config) (*Conn, error) {
	return connect(ctx, cfg, logAll)
}

// Reconnect is Connect for a consumer's later connections to the source it reached before: the
// same checks, but what the first connection logged (the published tables, the warnings about
// the failover settings) is not logged again. A consumer that runs its own retry loop connects
// with Connect once, and with Reconnect after that.
func Reconnect(ctx context.Context, cfg Config) (*Conn, error) {
	return connect(ctx, cfg, sessionLogs{})
}

// sessionLogs says which of its findings a new session logs: the published tables and the
// failover settings are logged by a consumer's first session, not again by each reconnection or
// each attempt of a Start that waits for its slot.
type sessionLogs struct {
	tables   bool
	failover bool
}

var logAll = sessionLogs{tables: true, failover: true}

func connect(ctx context.Context, cfg Config, logs sessionLogs) (_ *Conn, err error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	base, err := cfg.baseConnConfig()
	if err != nil {
		return nil, err
	}
	log := cfg.logger()
	sess, err := openSession(ctx, &cfg, base, log, logs)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			sess.close(ctx)
		}
	}()
	neg, err := cfg.Negotiate(sess.major)
	if err != nil {
		return nil, err
	}
	if err := checkSkip(cfg.Buffer, sess.sys); err != nil {
		return nil, err
	}
	every := cfg.StatusInterval
	if every <= 0 {
		every = DefaultStatusInterval
		if t := sess.settings.walSenderTimeout; t > 0 && t/4 < every {
			every = max(t/4, 10*time.Millisecond)
		}
	} else if t := sess.settings.walSenderTimeout; t > 0 && every >= t/2 {
		log.Warn("StatusInterval is not well under the server's wal_sender_timeout: the server may drop the connection",
			"status_interval", every, "wal_sender_timeout", t)
	}
	return &Conn{cfg: cfg, base: base, log: log, sess: sess, neg: neg, every: every}, nil
}

// checkSkip refuses a resume position beyond the server's WAL.
func checkSkip(b reorderbuffer.Config, sys systemInfo) error {
	if skip := b.SkipThrough; skip > sys.xlogPos {
		return &CheckError{Setting: "Buffer.SkipThrough", Err: ErrResumeAhead,
			Problem: fmt.Sprintf("resume position %s is beyond the server's current WAL position %s", skip, sys.xlogPos),
			Fix:     "pass the EndLSN of the last transaction the consumer handled from this server, or 0/0 to start at the slot's position"}
	}
	return nil
}

// SetBuffer replaces Config.Buffer, the reorder buffer settings of the Stream that StartStreaming
// starts, for a caller that learns them only once connected (where to resume, whether to hand out
// transactions in parts). It checks Buffer.SkipThrough against the server's WAL as Connect does
// (ErrResumeAhead); on an error the settings are left as they were.
func (c *Conn) SetBuffer(b reorderbuffer.Config) error {
	if c.sess == nil {
		return ErrClosed
	}
	if err := checkSkip(b, c.sess.sys); err != nil {
		return err
	}
	c.cfg.Buffer = b
	return nil
}

// Negotiated returns the pgoutput options negotiated with the server.
func (c *Conn) Negotiated() Negotiated { return c.neg }

// System returns what IDENTIFY_SYSTEM said about the server when the connection was made.
func (c *Conn) System() System {
	if c.sess == nil {
		return System{}
	}
	return c.sess.sys.export()
}

// Slot returns the slot as it was when the connection was checked (or as CreateSlot made it),
// and false if it does not exist.
func (c *Conn) Slot() (SlotInfo, bool) {
	if c.sess == nil || c.sess.slot == nil {
		return SlotInfo{}, false
	}
	return *c.sess.slot, true
}

// CreateSlot creates the slot named in Config (temporary if Config.TemporarySlot, with two-phase
// decoding if Config.TwoPhase), exporting a snapshot of its consistent point if asked. The slot
// must not exist yet (ErrSlotExists). With ExportSnapshot, run the initial copy before calling
// StartStreaming or Close: the snapshot lives only until then.
func (c *Conn) CreateSlot(ctx context.Context, action SnapshotAction) (Snapshot, error) {
	if c.sess == nil {
		return Snapshot{}, ErrClosed
	}
	if action != NoSnapshot && action != ExportSnapshot {
		return Snapshot{}, fmt.Errorf("%w: unknown SnapshotAction %d", ErrInvalidConfig, action)
	}
	if c.sess.slot != nil {
		return Snapshot{}, fmt.Errorf("%w: %q", ErrSlotExists, c.cfg.Slot)
	}
	st := c.sess.settings
	if st.slotsUsed >= st.maxSlots {
		return Snapshot{}, &CheckError{Setting: "max_replication_slots", Err: ErrServerConfig,
			Problem: fmt.Sprintf("all %d replication slots are in use, no room for slot %q", st.maxSlots, c.cfg.Slot),
			Fix:     "drop an unused slot with pg_drop_replication_slot, or raise max_replication_slots (needs a server restart)"}
	}
	if st.walSendersUsed >= st.maxWalSenders {
		c.log.Warn("every walsender is in use: a reconnection will be refused until one exits; consider raising max_wal_senders",
			"max_wal_senders", st.maxWalSenders)
	}
	snap, err := createSlot(ctx, c.sess.conn, c.sess.major, &c.cfg, action)
	if err != nil {
		return Snapshot{}, err
	}
	c.sess.slot = &SlotInfo{Name: c.cfg.Slot, Plugin: "pgoutput", Database: c.sess.sys.dbName,
		Temporary: c.cfg.TemporarySlot, TwoPhase: c.cfg.TwoPhase, Failover: c.cfg.Failover, ConfirmedFlush: snap.ConsistentPoint}
	c.log.Info("created slot", "slot", c.cfg.Slot, "consistent_point", snap.ConsistentPoint,
		"snapshot", snap.Name, "temporary", c.cfg.TemporarySlot, "two_phase", c.cfg.TwoPhase, "failover", c.cfg.Failover)
	return snap, nil
}

// StartStreaming starts streaming from the slot's confirmed position (START_REPLICATION ... 0/0)
// and returns the Stream, which owns the connection from now on. Config.Buffer.SkipThrough
// filters what the server sends again. An exported snapshot ends here. The Conn cannot be used
// afterwards, whether StartStreaming succeeds or not.
func (c *Conn) StartStreaming(ctx context.Context) (_ *Stream, err error) {
	if c.sess == nil {
		return nil, ErrClosed
	}
	sess := c.sess
	c.sess = nil
	defer func() {
		if err != nil {
			sess.close(ctx)
		}
	}()
	if sess.slot == nil {
		return nil, slotNotFound(&c.cfg, sess.sys)
	}
	if skip := c.cfg.Buffer.SkipThrough; skip != 0 && skip < sess.slot.ConfirmedFlush && c.cfg.Buffer.HandOutAdvances {
		return nil, &CheckError{Setting: "Buffer.SkipThrough", Err: ErrSlotAhead,
			Problem: fmt.Sprintf("the slot's confirmed position %s is ahead of the resume position %s: the transactions that "+
				"committed in between were acknowledged and the server will not send them again, yet the consumer does not have them",
				sess.slot.ConfirmedFlush, skip),
			Fix: "restore the consumer's data to a state at or after the slot's position, or resynchronize it from a new slot; " +
				"to continue anyway, accepting the loss, start with Buffer.SkipThrough 0"}
	}
	if skip := c.cfg.Buffer.SkipThrough; skip != 0 && skip < sess.slot.ConfirmedFlush {
		c.log.Warn("the resume position is behind the slot's confirmed position: transactions that committed between the two "+
			"are not sent again (harmless if the consumer had them, as after the slot advanced over WAL with nothing published)",
			"skip_through", skip, "confirmed_flush_lsn", sess.slot.ConfirmedFlush)
	}
	if err := enableFailover(ctx, sess, &c.cfg, c.log); err != nil {
		return nil, err
	}
	bcfg := c.cfg.Buffer
	bcfg.Decoding = c.neg.decodingOptions()
	buf, err := reorderbuffer.New(bcfg)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			buf.Close()
		}
	}()
	if err := startReplication(ctx, sess.conn, c.cfg.Slot, c.neg.PluginArgs); err != nil {
		return nil, err
	}
	w, err := newWire(ctx, sess.conn)
	if err != nil {
		return nil, err
	}
	c.log.Info("streaming", "slot", c.cfg.Slot, "start", sess.slot.ConfirmedFlush, "skip_through", bcfg.SkipThrough,
		"proto_version", c.neg.ProtoVersion, "streaming", c.neg.Streaming, "options", strings.Join(c.neg.PluginArgs, ", "),
		"status_interval", c.every)
	return newStream(c, sess, w, buf), nil
}

// Close closes the connection (and ends an exported snapshot). It is safe to call twice, and
// after StartStreaming.
func (c *Conn) Close(ctx context.Context) error {
	if c.sess == nil {
		return nil
	}
	sess := c.sess
	c.sess = nil
	return sess.close(ctx)
}

// Start connects, runs the pre-flight checks, creates the slot if asked and it does not exist,
// and starts streaming from the slot's confirmed position. While the slot is in use by another
// connection (ErrSlotActive: typically the walsender of a consumer that just died), it retries
// according to Config.Reconnect; any other error is returned at once. The connection is closed
// again if anything fails.
func Start(ctx context.Context, cfg Config) (*Stream, error) {
	since := time.Now()
	logs := logAll
	for attempt := 1; ; attempt++ {
		s, err := start(ctx, cfg, logs)
		if err == nil || !errors.Is(err, ErrSlotActive) {
			return s, err
		}
		if err := WaitForSlot(ctx, cfg, err, attempt, since); err != nil {
			return nil, err
		}
		logs.failover = false // once per Start: its settings' warnings are logged
	}
}

// WaitForSlot is what Start does when the slot is in use (err wraps ErrSlotActive: another
// connection streams from it, such as the walsender of a consumer that just died), for a caller
// that connects by itself: it logs the holder (at Warn the first time) and waits the policy's
// backoff before attempt+1, or returns an error: err itself when Reconnect is Disabled or
// MaxAttempts is reached, err as a *SlotActiveError saying how long it waited once
// Reconnect.SlotWait has passed since since (the first refusal), or ctx's error.
func WaitForSlot(ctx context.Context, cfg Config, err error, attempt int, since time.Time) error {
	if cfg.Reconnect.Disabled || (cfg.Reconnect.MaxAttempts > 0 && attempt >= cfg.Reconnect.MaxAttempts) {
		return err
	}
	wait := cfg.Reconnect.slotWait()
	d, gave := slotWaitOver(err, since, cfg.Reconnect.backoff().Delay(attempt), wait)
	if gave != nil {
		return gave
	}
	logSlotActive(cfg.logger(), err, attempt, d, wait)
	t := time.NewTimer(d)
	select {
	case <-ctx.Done():
		t.Stop()
		return fmt.Errorf("%w (while waiting: %w)", ctx.Err(), err)
	case <-t.C:
		return nil
	}
}

// slotWaitOver returns err, marked with how long it was waited for, if the slot has been in use
// since since for wait (negative: no limit) or longer; otherwise the delay before the next
// attempt, d cut to what is left of wait.
func slotWaitOver(err error, since time.Time, d, wait time.Duration) (time.Duration, error) {
	waited := time.Since(since)
	if wait < 0 {
		return d, nil
	}
	if waited < wait {
		return min(d, wait-waited), nil
	}
	var sa *SlotActiveError
	if errors.As(err, &sa) {
		cp := *sa
		cp.Waited = max(waited, time.Millisecond)
		return 0, &cp
	}
	return 0, err
}

// logSlotActive logs a refusal of the slot: at Warn, with the holder, the first time.
func logSlotActive(log *slog.Logger, err error, attempt int, d, wait time.Duration) {
	var sa *SlotActiveError
	if !errors.As(err, &sa) {
		log.Info("slot in use, retrying", "attempt", attempt, "delay", d, "err", err)
		return
	}
	level := slog.LevelInfo
	if attempt == 1 {
		level = slog.LevelWarn
	}
	limit := "no limit"
	if wait >= 0 {
		limit = wait.String()
	}
	log.Log(context.Background(), level, "slot in use by another connection, waiting for it to end", "slot", sa.Slot,
		"holder", sa.Holder.String(), "attempt", attempt, "delay", d.Round(time.Millisecond), "wait_limit", limit)
}

func start(ctx context.Context, cfg Config, logs sessionLogs) (_ *Stream, err error) {
	c, err := connect(ctx, cfg, logs)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			c.Close(ctx)
		}
	}()
	if _, ok := c.Slot(); !ok {
		if !cfg.CreateSlot {
			return nil, slotNotFound(&cfg, c.sess.sys)
		}
		if _, err := c.CreateSlot(ctx, NoSnapshot); err != nil {
			return nil, err
		}
	}
	return c.StartStreaming(ctx)
}

// slotNotFound is the error for a missing slot on the server sys. A server on a timeline after
// the first may be a promoted standby, which keeps only the slots made for failover: the error
// says so when Config.Failover is off.
func slotNotFound(cfg *Config, sys systemInfo) error {
	if sys.timeline > 1 && !cfg.Failover {
		return checkError(&CheckError{Setting: "slot", Err: ErrSlotNotFound,
			Problem: fmt.Sprintf("replication slot %q does not exist; the server is on timeline %d: if it is a promoted standby, "+
				"the slot was not created for failover and the standby kept no copy of it", cfg.Slot, sys.timeline)},
			configerr.Words("let %s create it, or create it in database %q with SELECT pg_create_logical_replication_slot('%s', 'pgoutput'); "+
				"set %s so that a slot survives the promotion of a standby", field("CreateSlot"), sys.dbName, cfg.Slot, field("Failover")))
	}
	return checkError(&CheckError{Setting: "slot", Err: ErrSlotNotFound,
		Problem: fmt.Sprintf("replication slot %q does not exist", cfg.Slot)},
		configerr.Words("let %s create it, or create it in database %q with SELECT pg_create_logical_replication_slot('%s', 'pgoutput')",
			field("CreateSlot"), sys.dbName, cfg.Slot))
}

func (c *Config) logger() *slog.Logger {
	if c.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return c.Logger
}

// baseConnConfig returns the configuration every connection attempt starts from (a copy of it).
func (c *Config) baseConnConfig() (*pgconn.Config, error) {
	switch {
	case c.ConnConfig != nil && c.ConnString != "":
		return nil, configerr.New(ErrInvalidConfig, field("ConnString"), "is set, and so is %s: set one of them", field("ConnConfig"))
	case c.ConnConfig == nil && c.ConnString == "":
		return nil, configerr.New(ErrInvalidConfig, field("ConnString"), "is required (or %s)", field("ConnConfig"))
	}
	pc, err := pgsession.ConnConfig(c.ConnConfig, c.ConnString)
	if err != nil {
		return nil, &ConfigError{Field: field("ConnString"), Reason: configerr.Words("is not a connection string"), Err: ErrInvalidConfig, Cause: err}
	}
	return pc, nil
}

// sessionOptions describes the replication connection to pgsession, which opens it.
func (c *Config) sessionOptions(base *pgconn.Config, log *slog.Logger) pgsession.Options {
	return pgsession.Options{Kind: pgsession.Replication, Config: base, BeforeConnect: c.BeforeConnect,
		ApplicationName: "pgreorder", Logger: log}
}

// connConfig returns the configuration of one connection attempt (pgsession.Prepare): a copy of
// base, passed to BeforeConnect, with replication=database, the pinned parameters, the notice
// logger and a context watcher that never sends cancel requests (a deadline ends every wait for
// the next message; a cancel request would hit the walsender).
func (c *Config) connConfig(ctx context.Context, base *pgconn.Config, log *slog.Logger) (*pgconn.Config, error) {
	pc, err := pgsession.Prepare(ctx, c.sessionOptions(base, log))
	if err != nil {
		return nil, fmt.Errorf("replication: %w", err)
	}
	return pc, nil
}

// dial makes one connection attempt. It returns the attempt's handlers of notices and errors
// too: the stream calls them for what arrives while streaming, which pgconn does not see.
func (c *Config) dial(ctx context.Context, base *pgconn.Config, log *slog.Logger) (conn *pgconn.PgConn, nh noticeHandlers, err error) {
	pc, err := c.connConfig(ctx, base, log)
	if err != nil {
		return nil, nh, err
	}
	nh = noticeHandlers{onNotice: pc.OnNotice, onPgError: pc.OnPgError}
	conn, err = pgsession.Open(ctx, pc, c.sessionOptions(base, log))
	if errors.Is(err, pgsession.ErrNotParsed) {
		return nil, nh, configerr.New(ErrInvalidConfig, field("ConnConfig"), "must be made by pgconn.ParseConfig")
	}
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == pgsession.TooManyConnections && strings.Contains(pgErr.Message, "max_wal_senders") {
			return nil, nh, &CheckError{Setting: "max_wal_senders", Err: ErrServerConfig, Cause: err,
				Problem: "the server has no walsender left for this connection",
				Fix:     "raise max_wal_senders (needs a server restart) or stop other replication connections"}
		}
		return nil, nh, fmt.Errorf("replication: connect: %w", err)
	}
	return conn, nh, nil
}

// session is one replication connection after IDENTIFY_SYSTEM and the pre-flight checks.
type session struct {
	conn     *pgconn.PgConn
	notice   noticeHandlers
	major    int
	sys      systemInfo
	settings serverSettings
	slot     *SlotInfo // nil if the slot does not exist
}

func (s *session) close(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	return s.conn.Close(ctx)
}

// openSession connects and checks that the server, the publications and the slot (if it
// exists) can serve cfg, logging what logs asks for.
func openSession(ctx context.Context, cfg *Config, base *pgconn.Config, log *slog.Logger, logs sessionLogs) (_ *session, err error) {
	conn, nh, err := cfg.dial(ctx, base, log)
	if err != nil {
		return nil, err
	}
	s := &session{conn: conn, notice: nh}
	defer func() {
		if err != nil {
			s.close(ctx)
		}
	}()
	if s.major, err = parseMajor(conn.ParameterStatus("server_version")); err != nil {
		return nil, err
	}
	if err := checkFailoverVersion(cfg, s.major); err != nil {
		return nil, err
	}
	if s.sys, err = identifySystem(ctx, conn); err != nil {
		return nil, err
	}
	if s.sys.dbName == "" {
		return nil, fmt.Errorf("%w: the connection is not bound to a database", ErrInvalidConfig)
	}
	log.Info("connected", "server_major", s.major, "system_id", s.sys.systemID, "timeline", s.sys.timeline,
		"xlogpos", s.sys.xlogPos, "database", s.sys.dbName, "pid", conn.PID())
	if s.settings, err = readSettings(ctx, conn); err != nil {
		return nil, err
	}
	if s.settings.walLevel != "logical" {
		return nil, &CheckError{Setting: "wal_level", Err: ErrServerConfig,
			Problem: fmt.Sprintf("wal_level is %q; logical decoding needs \"logical\"", s.settings.walLevel),
			Fix:     "ALTER SYSTEM SET wal_level = logical, then restart the server"}
	}
	if err := checkPublications(ctx, conn, s.major, cfg.Publications, s.sys.dbName, log, logs.tables); err != nil {
		return nil, err
	}
	if s.slot, err = readSlot(ctx, conn, s.major, cfg, s.sys.dbName); err != nil {
		return nil, err
	}
	if logs.failover && cfg.Failover {
		failoverWarnings(ctx, conn, cfg, s.slot, log)
	}
	return s, nil
}

type systemInfo struct {
	systemID string
	timeline int
	xlogPos  decoding.LSN
	dbName   string
}

// System identifies the server a connection reached, as IDENTIFY_SYSTEM reports it. A consumer
// that persists its position can store ID (and Timeline) with it, to tell a rebuilt or different
// server with the same slot name from the one the position came from: positions of another
// system mean nothing.
type System struct {
	// ID is the database system identifier (pg_control_system().system_identifier), in decimal:
	// set by initdb, kept by physical standbys and restored backups.
	ID string
	// Timeline is the server's current timeline; it grows when a standby is promoted.
	Timeline int
	// XLogPos is the server's current WAL flush position when the connection was made.
	XLogPos decoding.LSN
	// Database is the database the connection is bound to.
	Database string
}

func (s systemInfo) export() System {
	return System{ID: s.systemID, Timeline: s.timeline, XLogPos: s.xlogPos, Database: s.dbName}
}

func identifySystem(ctx context.Context, conn *pgconn.PgConn) (systemInfo, error) {
	row, err := queryRow(ctx, conn, "IDENTIFY_SYSTEM", 4)
	if err != nil {
		return systemInfo{}, fmt.Errorf("replication: IDENTIFY_SYSTEM: %w", err)
	}
	sys := systemInfo{systemID: row[0], dbName: row[3]}
	if sys.timeline, err = strconv.Atoi(row[1]); err == nil {
		err = sys.xlogPos.UnmarshalText([]byte(row[2]))
	}
	if err != nil {
		return systemInfo{}, &ProtocolError{Msg: "IDENTIFY_SYSTEM result", Err: err}
	}
	return sys, nil
}

type serverSettings struct {
	walLevel         string
	walSenderTimeout time.Duration // 0 = disabled
	maxSlots         int
	maxWalSenders    int
	slotsUsed        int
	walSendersUsed   int // this connection included
}

func readSettings(ctx context.Context, conn *pgconn.PgConn) (serverSettings, error) {
	row, err := queryRow(ctx, conn, `SELECT pg_catalog.current_setting('wal_level'),
		(SELECT setting FROM pg_catalog.pg_settings WHERE name = 'wal_sender_timeout'),
		pg_catalog.current_setting('max_replication_slots'), pg_catalog.current_setting('max_wal_senders'),
		(SELECT pg_catalog.count(*) FROM pg_catalog.pg_replication_slots),
		(SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_activity WHERE backend_type = 'walsender')`, 6)
	if err != nil {
		return serverSettings{}, fmt.Errorf("replication: reading server settings: %w", err)
	}
	st := serverSettings{walLevel: row[0]}
	ints := make([]int, 5)
	for i := range ints {
		if ints[i], err = strconv.Atoi(row[i+1]); err != nil {
			return serverSettings{}, fmt.Errorf("replication: reading server settings: %w", err)
		}
	}
	st.walSenderTimeout = time.Duration(ints[0]) * time.Millisecond
	st.maxSlots, st.maxWalSenders, st.slotsUsed, st.walSendersUsed = ints[1], ints[2], ints[3], ints[4]
	return st, nil
}

// checkPublications checks that every publication exists and logs what each publishes.
func checkPublications(ctx context.Context, conn *pgconn.PgConn, major int, pubs []string, db string, log *slog.Logger, logTables bool) error {
	lits := make([]string, len(pubs))
	for i, p := range pubs {
		lits[i] = pgsession.QuoteLiteral(p)
	}
	in := strings.Join(lits, ", ")
	res, err := query(ctx, conn, "SELECT pubname, puballtables::text FROM pg_catalog.pg_publication WHERE pubname IN ("+in+")")
	if err != nil {
		return fmt.Errorf("replication: reading publications: %w", err)
	}
	found := map[string]bool{}
	for _, row := range res {
		found[row[0]] = row[1] == "true"
	}
	var missing []string
	for _, p := range pubs {
		if _, ok := found[p]; !ok {
			missing = append(missing, strconv.Quote(p))
		}
	}
	if len(missing) > 0 {
		what := "publication " + missing[0] + " does not exist"
		if len(missing) > 1 {
			what = "publications " + strings.Join(missing, ", ") + " do not exist"
		}
		return checkError(&CheckError{Setting: "publication", Err: ErrPublicationNotFound,
			Problem: fmt.Sprintf("%s in database %q", what, db)},
			configerr.Words("create it with CREATE PUBLICATION ... FOR TABLE ..., or correct %s", field("Publications")))
	}
	if !logTables {
		return nil
	}
	// Plain catalog scans, not the pg_publication_tables view: its function looks the publications
	// up through the system caches of this backend, the walsender, under the current snapshot,
	// and pgoutput would then find those cache entries while decoding under historic snapshots
	// (a publication created after the slot's position would seem to exist before it).
	sql := "SELECT p.pubname, pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.relname) " +
		"FROM pg_catalog.pg_publication p JOIN pg_catalog.pg_publication_rel r ON r.prpubid = p.oid " +
		"JOIN pg_catalog.pg_class c ON c.oid = r.prrelid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace " +
		"WHERE p.pubname IN (" + in + ")"
	if major >= 15 {
		sql += " UNION ALL SELECT p.pubname, pg_catalog.quote_ident(n.nspname) || '.*' " +
			"FROM pg_catalog.pg_publication p JOIN pg_catalog.pg_publication_namespace s ON s.pnpubid = p.oid " +
			"JOIN pg_catalog.pg_namespace n ON n.oid = s.pnnspid WHERE p.pubname IN (" + in + ")"
	}
	res, err = query(ctx, conn, sql+" ORDER BY 1, 2")
	if err != nil {
		return fmt.Errorf("replication: reading published tables: %w", err)
	}
	tables := map[string][]string{}
	for _, row := range res {
		tables[row[0]] = append(tables[row[0]], row[1])
	}
	const show = 50
	for _, p := range pubs {
		t := tables[p]
		if found[p] {
			log.Info("publication", "publication", p, "all_tables", true)
			continue
		}
		if len(t) == 0 {
			log.Warn("publication publishes no table yet", "publication", p)
			continue
		}
		list := strings.Join(t[:min(len(t), show)], ", ")
		if len(t) > show {
			list += fmt.Sprintf(", ... (%d more)", len(t)-show)
		}
		log.Info("publication", "publication", p, "table_count", len(t), "tables", list)
	}
	return nil
}

// readSlot returns the slot, nil if it does not exist, or a *CheckError if it cannot serve cfg.
func readSlot(ctx context.Context, conn *pgconn.PgConn, major int, cfg *Config, db string) (*SlotInfo, error) {
	twoPhase, walStatus := "two_phase::text", "coalesce(wal_status, '')"
	failover := "'false', 'false', ''" // failover, synced, invalidation_reason: PostgreSQL 17+
	if major < 14 {
		twoPhase = "'false'"
	}
	if major < 13 {
		walStatus = "''"
	}
	if major >= 17 {
		failover = "failover::text, synced::text, coalesce(invalidation_reason, '')"
	}
	res, err := query(ctx, conn, "SELECT slot_type, coalesce(plugin, ''), coalesce(database::text, ''), "+
		"coalesce(confirmed_flush_lsn::text, '0/0'), temporary::text, "+twoPhase+", "+walStatus+", "+failover+
		" FROM pg_catalog.pg_replication_slots WHERE slot_name = "+pgsession.QuoteLiteral(cfg.Slot))
	if err != nil {
		return nil, fmt.Errorf("replication: reading slot %q: %w", cfg.Slot, err)
	}
	if len(res) == 0 {
		return nil, nil
	}
	row := res[0]
	if len(row) != 10 {
		return nil, &ProtocolError{Msg: fmt.Sprintf("pg_replication_slots row with %d columns", len(row))}
	}
	slot := &SlotInfo{Name: cfg.Slot, Plugin: row[1], Database: row[2], Temporary: row[4] == "true", TwoPhase: row[5] == "true",
		Failover: row[7] == "true", Synced: row[8] == "true"}
	if err := slot.ConfirmedFlush.UnmarshalText([]byte(row[3])); err != nil {
		return nil, &ProtocolError{Msg: "confirmed_flush_lsn", Err: err}
	}
	mismatch := func(setting, problem string, fix configerr.Text) error {
		return checkError(&CheckError{Setting: setting, Err: ErrSlotMismatch, Problem: problem}, fix)
	}
	recreate := configerr.Words("use another slot name, or drop it (SELECT pg_drop_replication_slot('%s')) and let %s make it again",
		cfg.Slot, field("CreateSlot"))
	switch {
	case row[0] != "logical":
		return nil, mismatch("slot", fmt.Sprintf("slot %q is a %s slot, not a logical one", cfg.Slot, row[0]), recreate)
	case slot.Plugin != "pgoutput":
		return nil, mismatch("slot", fmt.Sprintf("slot %q uses the output plugin %q, not pgoutput", cfg.Slot, slot.Plugin), recreate)
	case slot.Database != db:
		return nil, mismatch("slot", fmt.Sprintf("slot %q belongs to database %q, the connection is to %q", cfg.Slot, slot.Database, db),
			configerr.Words("connect to database %q, or use another slot name", slot.Database))
	case row[6] == "lost":
		return nil, mismatch("slot", fmt.Sprintf("slot %q has lost WAL it needed (wal_status lost): changes are missing", cfg.Slot),
			configerr.Words("drop the slot and start again from a fresh copy of the tables"))
	case row[9] != "":
		return nil, mismatch("slot", fmt.Sprintf("slot %q was invalidated (%s): the server no longer decodes changes from it", cfg.Slot, row[9]),
			configerr.Words("drop the slot and start again from a fresh copy of the tables"))
	case slot.TwoPhase && !cfg.TwoPhase:
		return nil, mismatch("two_phase", fmt.Sprintf("slot %q decodes prepared transactions at PREPARE (two_phase), but Config.TwoPhase is off", cfg.Slot),
			configerr.Words("set %s, or use a slot created without two-phase decoding", field("TwoPhase")))
	case !slot.TwoPhase && cfg.TwoPhase:
		return nil, mismatch("two_phase", fmt.Sprintf("slot %q was created without two_phase, but Config.TwoPhase is on: reading it so would turn two-phase decoding on for this slot for good", cfg.Slot),
			configerr.Words("turn %s off, or use a slot created with two-phase decoding (%s with %s)", field("TwoPhase"), field("CreateSlot"), field("TwoPhase")))
	}
	return slot, nil
}

// createSlot runs CREATE_REPLICATION_SLOT.
func createSlot(ctx context.Context, conn *pgconn.PgConn, major int, cfg *Config, action SnapshotAction) (Snapshot, error) {
	var b strings.Builder
	b.WriteString("CREATE_REPLICATION_SLOT " + cfg.Slot)
	if cfg.TemporarySlot {
		b.WriteString(" TEMPORARY")
	}
	b.WriteString(" LOGICAL pgoutput")
	switch {
	case major >= 15:
		if action == ExportSnapshot {
			b.WriteString(" (SNAPSHOT 'export'")
		} else {
			b.WriteString(" (SNAPSHOT 'nothing'")
		}
		if cfg.TwoPhase {
			b.WriteString(", TWO_PHASE true")
		}
		if cfg.Failover { // PostgreSQL 17+, checked when connecting
			b.WriteString(", FAILOVER true")
		}
		b.WriteString(")")
	case cfg.TwoPhase:
		return Snapshot{}, &OptionError{Option: "two_phase", Value: "true", ServerMajor: major, Err: ErrUnsupported}
	case action == ExportSnapshot:
		b.WriteString(" EXPORT_SNAPSHOT")
	default:
		b.WriteString(" NOEXPORT_SNAPSHOT")
	}
	row, err := queryRow(ctx, conn, b.String(), 4)
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			switch pgErr.Code {
			case pgsession.DuplicateObject:
				return Snapshot{}, fmt.Errorf("%w: %q: %w", ErrSlotExists, cfg.Slot, err)
			case pgsession.ConfigurationLimitExceeded:
				return Snapshot{}, &CheckError{Setting: "max_replication_slots", Err: ErrServerConfig, Cause: err,
					Problem: "all replication slots are in use",
					Fix:     "drop an unused slot with pg_drop_replication_slot, or raise max_replication_slots (needs a server restart)"}
			}
		}
		return Snapshot{}, fmt.Errorf("replication: CREATE_REPLICATION_SLOT: %w", err)
	}
	snap := Snapshot{Slot: row[0], Name: row[2]}
	if err := snap.ConsistentPoint.UnmarshalText([]byte(row[1])); err != nil {
		return Snapshot{}, &ProtocolError{Msg: "CREATE_REPLICATION_SLOT consistent_point", Err: err}
	}
	return snap, nil
}

// startReplication sends START_REPLICATION from the slot's confirmed position and waits for
// the server to switch to copy-both mode.
//
// The start position is always 0/0, never the consumer's resume position: the server then sends
// every transaction that commits after the slot's confirmed position, including the PREPARE of a
// prepared transaction the consumer has not acknowledged yet. Starting later would make the
// server skip that PREPARE and send a bare COMMIT PREPARED. The reorder buffer drops what the
// consumer already has (Config.SkipThrough).
func startReplication(ctx context.Context, conn *pgconn.PgConn, slot string, args []string) error {
	cmd := "START_REPLICATION SLOT " + slot + " LOGICAL 0/0 (" + strings.Join(args, ", ") + ")"
	conn.Frontend().SendQuery(&pgproto3.Query{String: cmd})
	if err := conn.Frontend().Flush(); err != nil {
		return fmt.Errorf("replication: sending START_REPLICATION: %w", err)
	}
	for {
		msg, err := conn.ReceiveMessage(ctx)
		if err != nil {
			return fmt.Errorf("replication: START_REPLICATION: %w", err)
		}
		switch msg := msg.(type) {
		case *pgproto3.CopyBothResponse:
			return nil
		case *pgproto3.ErrorResponse:
			err := pgconn.ErrorResponseToPgError(msg)
			if err.Code == pgsession.ObjectInUse {
				return slotActive(ctx, conn, slot, err)
			}
			return fmt.Errorf("replication: START_REPLICATION: %w", err)
		case *pgproto3.NoticeResponse, *pgproto3.ParameterStatus:
			// Notices were logged by the OnNotice handler.
		default:
			return &ProtocolError{Msg: fmt.Sprintf("unexpected %T in reply to START_REPLICATION", msg)}
		}
	}
}

// slotActive returns the *SlotActiveError for START_REPLICATION's refusal cause, naming the
// connection that holds the slot when the server says: after the error it is ready for a query.
func slotActive(ctx context.Context, conn *pgconn.PgConn, slot string, cause error) error {
	e := &SlotActiveError{Slot: slot, Cause: cause}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for {
		msg, err := conn.ReceiveMessage(ctx)
		if err != nil {
			return e
		}
		if _, ok := msg.(*pgproto3.ReadyForQuery); ok {
			break
		}
	}
	rows, err := query(ctx, conn, "SELECT "+pgsession.BackendColumns+" FROM pg_catalog.pg_replication_slots s "+
		"JOIN pg_catalog.pg_stat_activity a ON a.pid = s.active_pid WHERE s.slot_name = "+pgsession.QuoteLiteral(slot))
	if err == nil && len(rows) == 1 {
		e.Holder, _ = pgsession.ScanBackend(rows[0])
	}
	return e
}

// query runs a simple-protocol command and returns its rows as text.
func query(ctx context.Context, conn *pgconn.PgConn, sql string) ([][]string, error) {
	results, err := conn.Exec(ctx, sql).ReadAll()
	if err != nil {
		return nil, err
	}
	var rows [][]string
	for _, r := range results {
		for _, row := range r.Rows {
			vals := make([]string, len(row))
			for i, v := range row {
				vals[i] = string(v)
			}
			rows = append(rows, vals)
		}
	}
	return rows, nil
}

// queryRow runs a command that returns exactly one row of n columns.
func queryRow(ctx context.Context, conn *pgconn.PgConn, sql string, n int) ([]string, error) {
	rows, err := query(ctx, conn, sql)
	if err != nil {
		return nil, err
	}
	if len(rows) != 1 || len(rows[0]) != n {
		return nil, &ProtocolError{Msg: fmt.Sprintf("expected one row of %d columns, got %d rows", n, len(rows))}
	}
	return rows[0], nil
}
