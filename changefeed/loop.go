package changefeed

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/configerr"
	"github.com/pgreorder/pgreorder/internal/retry"
	"github.com/pgreorder/pgreorder/replication"
)

// DefaultStartTimeout is Config.StartTimeout's default: a typo in a host or port stops a service
// within half a minute, where its manager sees it.
const DefaultStartTimeout = 30 * time.Second

// resetAfter is how long an attempt runs before its end no longer counts as one more failure in a
// row, whatever it did.
const resetAfter = time.Minute

// Restarter is a Follower that takes part in each of Run's attempts beyond Follow: it prepares an
// attempt before the position is loaded, and hears how the attempt ended before Run decides on
// another. Package apply is one: Prepare connects to its target, fences off the connections of
// an earlier attempt and reads its progress row (which its Store's Load then returns), and
// Ended closes what Prepare opened, says that an attempt which caught up ends Run, and starts
// the next attempt at once when it ended to apply some transactions alone.
type Restarter interface {
	Follower
	// Prepare is called at the start of each attempt, before the Store's Load, with the attempt's
	// source and its copy of Config.Replication: it may change the reorder buffer's settings for
	// that attempt (Buffer.Incremental, WorkMem, MaxOpenFiles, SkipThrough), not the connection,
	// the slot or the publications. A Prepare that must know the source first (which system it
	// is, where the slot is) calls src.Identify. An error ends the attempt like any other.
	Prepare(ctx context.Context, src *Source, rcfg *replication.Config) error
	// Ended is called when an attempt that Prepare began has ended, whether or not Prepare
	// returned nil, after Run closed the attempt's stream, with Run's account of the attempt,
	// which it may change (see Outcome). It is called also when ctx ended.
	Ended(ctx context.Context, o *Outcome)
}

// Side names what an attempt was reaching when it failed.
type Side string

const (
	// SideStore is the Store (its Load, units and checks), and what a Restarter's Prepare
	// reaches unless it says otherwise (Outcome.Side).
	SideStore Side = "store"
	// SideSource is the source server: its replication connections and its catalog.
	SideSource Side = "source"
)

// Outcome is Run's account of an attempt that ended, on which it decides whether to make another
// and when. A Restarter's Ended may change any field.
type Outcome struct {
	// Err is what ended the attempt: nil only when the Follower's Follow returned nil, which
	// ends Run with nil. Ended may put an error that says more in its place, or nil to end Run
	// with nil.
	Err error
	// Side is what the attempt was reaching when it failed, for the NotStartedError of a run
	// that never reached both.
	Side Side
	// Reached says that the attempt reached both the store and the source (the store's Load
	// returned and a replication connection was made): from then on StartTimeout no longer
	// applies.
	Reached bool
	// Progress says that the attempt got somewhere: it acknowledged something to the source,
	// finished the initial copy, or ran for a minute. The next delay is then the shortest again,
	// and the attempt is not one more failure in a row.
	Progress bool
	// Now starts the next attempt at once, for a cause the attempt's end cured (the Restarter
	// set up the next attempt to avoid it): no delay, and the attempt is not counted as a
	// failure in a row. Err must still be one that another attempt can cure.
	Now bool
}

// ErrNotStarted is wrapped by a NotStartedError.
var ErrNotStarted = retry.Stop("changefeed: not started")

// NotStartedError is what Run stops with when its first attempts could not reach the store and
// the source within Config.StartTimeout. It wraps ErrNotStarted and the last attempt's error.
type NotStartedError struct {
	// Side is what the last attempt could not reach.
	Side Side
	// Tried is how long Run tried.
	Tried time.Duration
	// Err is the error of the last attempt.
	Err error
}

func (e *NotStartedError) Error() string {
	return fmt.Sprintf("%s: the %s could not be reached: %v", ErrNotStarted, e.Side, e.Err)
}

// Unwrap returns ErrNotStarted and Err.
func (e *NotStartedError) Unwrap() []error { return []error{ErrNotStarted, e.Err} }

// Retryable reports false: Run gave up.
func (e *NotStartedError) Retryable() bool { return false }

// attempt is what Run knows of the attempt in progress. Run's goroutine only.
type attempt struct {
	o   Outcome
	src *Source // for a Restarter
}

// Source is the source server as one attempt reaches it, handed to a Restarter's Prepare.
// Identify makes the attempt's replication connection, and the attempt streams on that same
// connection when it resumes or starts a stream, so that a Restarter that must know the source
// before it prepares costs the source no connection of its own. (An attempt that copies closes it
// and makes the copy's.) A Source is used on Prepare's goroutine, and not after Prepare returns.
type Source struct {
	f    *Feed
	rcfg *replication.Config // the attempt's, which Prepare changes
	conn *replication.Conn   // made by Identify; nil once the attempt took or closed it
}

// Identify connects to the source with the attempt's settings (replication.Connect: the
// pre-flight checks included) unless an earlier call did, and returns what the server said of
// itself and the slot as it was then, nil if it does not exist. Its error is Connect's.
func (s *Source) Identify(ctx context.Context) (replication.System, *replication.SlotInfo, error) {
	if s == nil || s.rcfg == nil {
		return replication.System{}, nil, fmt.Errorf("%w: Source.Identify called outside the Prepare it was given to", ErrInvalidConfig)
	}
	if s.conn == nil {
		conn, err := s.f.connectSource(ctx, streamConfig(*s.rcfg))
		if err != nil {
			return replication.System{}, nil, err
		}
		s.f.reachedSource()
		s.conn = conn
	}
	if slot, ok := s.conn.Slot(); ok {
		return s.conn.System(), &slot, nil
	}
	return s.conn.System(), nil, nil
}

// take hands the connection Identify made, if any, to the caller.
func (s *Source) take() *replication.Conn {
	if s == nil {
		return nil
	}
	c := s.conn
	s.conn = nil
	return c
}

// close closes the connection Identify made, unless the attempt took it.
func (s *Source) close(ctx context.Context) {
	if c := s.take(); c != nil {
		c.Close(context.WithoutCancel(ctx))
	}
}

// Run runs the consumer until ctx ends or an error that another attempt cannot cure, and closes
// the store when it returns.
//
// Each attempt loads the position from the store, checks the source against it, and copies or
// resumes: with no position stored for the slot, or that of a copy cut short, it copies the
// published tables (after a Reset batch) and stores the copy's end; with a complete copy stored,
// it resumes the stream after the stored position (after a Resume batch). It then hands the
// stream's transactions to the handler (or the stream to the Follower) until something fails.
//
// When an attempt fails for a reason another attempt can cure (replication.Retryable, the
// library's one rule: a lost connection, a server restart, a snapshot no longer exported...), Run
// waits and makes another,
// from the stored position: a copy cut short is discarded and made again, a stream is resumed.
// The delays follow Replication.Reconnect: from MinDelay, doubling for each failure in a row up
// to MaxDelay, with ±20% jitter, the shortest again after an attempt that got somewhere (see
// Outcome.Progress); MaxAttempts failures in a row give up, and Disabled makes no second
// attempt. The streams Run starts do not reconnect by themselves: a lost connection ends the
// attempt, and the next one resumes after the stored position, so that there is one loop. A
// connection to a temporary slot (Replication.TemporarySlot) that was lost took the slot with
// it: Run stops. Until an attempt has reached both the store and the source, Run retries within
// Config.StartTimeout only (see NotStartedError).
//
// A handler's error stops Run, which returns it (for a copied chunk, inside the
// *snapshot.ChunkError that names the chunk), unless it is a lost connection (a server error of
// class 08, a FATAL one, a network error, an unexpected end of file), such as a handler passes
// on from a chunk's rows or from a database it writes to: the attempt is then made again. When
// ctx ends, Run returns its error (context.Cause). With Config.Follower, the started stream goes
// to the Follower; Follow returning nil ends Run with nil. A Feed runs once.
func (f *Feed) Run(ctx context.Context) (err error) {
	f.mu.Lock()
	if f.running {
		f.mu.Unlock()
		return fmt.Errorf("%w: a Feed runs once", ErrInvalidConfig)
	}
	f.running = true
	f.mu.Unlock()
	defer func() {
		if cerr := f.store.Close(); err == nil {
			err = cerr
		}
		f.mu.Lock()
		cat := f.cat
		f.mu.Unlock()
		if cat != nil {
			cat.Close()
		}
	}()
	policy := f.cfg.Replication.Reconnect
	b := f.backoff()
	limit := f.cfg.StartTimeout
	if limit == 0 {
		limit = DefaultStartTimeout
	}
	began := time.Now()
	reached := false
	n := 1 // the failure in a row that the next delay is for
	for {
		o := f.attempt(ctx)
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		if o.Err == nil {
			return nil
		}
		reached = reached || o.Reached
		if policy.Disabled || !again(o.Err) {
			return unwrapStop(o.Err)
		}
		if o.Now {
			f.log.Info("starting again at once", "slot", f.cfg.Replication.Slot, "err", o.Err)
			continue
		}
		if o.Progress {
			n = 1
		}
		if policy.MaxAttempts > 0 && n >= policy.MaxAttempts {
			return fmt.Errorf("changefeed: giving up after %d failed attempts in a row: %w", n, unwrapStop(o.Err))
		}
		if !reached && limit >= 0 {
			if left := limit - time.Since(began); left <= 0 || b.Base(n) >= left {
				side := o.Side
				if side == "" {
					side = SideStore
				}
				return configerr.WithHint(&NotStartedError{Side: side, Tried: time.Since(began), Err: unwrapStop(o.Err)}, " ",
					"(tried for %s: %s)", time.Since(began).Round(time.Second), field("StartTimeout"))
			}
		}
		f.log.Warn("replication interrupted; resuming", "slot", f.cfg.Replication.Slot, "err", o.Err, "after", b.Base(n))
		if err := b.Wait(ctx, n); err != nil {
			return err
		}
		n++
	}
}

// backoff returns the delays between attempts: Replication.Reconnect's MinDelay and MaxDelay
// (replication's defaults when 0), with ±20% jitter.
func (f *Feed) backoff() retry.Backoff {
	p := f.cfg.Replication.Reconnect
	lo, hi := p.MinDelay, p.MaxDelay
	if lo <= 0 {
		lo = replication.DefaultMinReconnectDelay
	}
	if hi <= 0 {
		hi = replication.DefaultMaxReconnectDelay
	}
	return retry.Backoff{Min: lo, Max: hi, Jitter: 0.2}
}

// again reports whether an attempt that failed with err can succeed when made again, as the
// errors say (internal/retry): not when the handler stopped it (unless its connection was lost:
// see stopError), nor for what the configuration, the publications or the store decide; a
// snapshot that is no longer exported or publications that changed are, as a new slot has a new
// snapshot.
func again(err error) bool { return retry.Retryable(err) }

// attempt makes one attempt and returns its account, once its stream is closed and the
// Restarter, if any, has heard of it.
func (f *Feed) attempt(ctx context.Context) Outcome {
	a := &attempt{o: Outcome{Side: SideStore}}
	f.mu.Lock()
	f.try = a
	f.mu.Unlock()
	began := time.Now()
	rcfg := f.cfg.Replication
	r, _ := f.cfg.Follower.(Restarter)
	if r != nil {
		a.src = &Source{f: f, rcfg: &rcfg}
		err := r.Prepare(ctx, a.src, &rcfg)
		a.src.rcfg = nil
		if err != nil {
			a.src.close(ctx)
			a.o.Err = err
			r.Ended(ctx, &a.o)
			return a.o
		}
	}
	a.o.Err = f.once(ctx, rcfg, a)
	a.src.close(ctx) // not taken: the attempt failed before it streamed
	if time.Since(began) >= resetAfter {
		a.o.Progress = true
	}
	if r != nil {
		r.Ended(ctx, &a.o)
	}
	return a.o
}

// once runs the attempt a: it loads the position, checks, copies or resumes, and follows the
// stream until it fails. It returns with the stream closed.
func (f *Feed) once(ctx context.Context, rcfg replication.Config, a *attempt) (err error) {
	slot := rcfg.Slot
	pos, ok, err := f.store.Load(ctx, slot)
	if err != nil {
		return err
	}
	if ok && pos.Slot != slot {
		return fmt.Errorf("%w: it holds the position of slot %q, not %q", ErrStore, pos.Slot, slot)
	}
	// Before a slot is made, and before a stream resumes: what the store refuses stops the run
	// with nothing done.
	if err := f.checkTables(ctx); err != nil {
		return err
	}
	f.side(SideSource)
	var stream *replication.Stream
	switch {
	case ok && pos.CopyDone:
		stream, err = f.resume(ctx, rcfg, pos)
	case f.cfg.Start == StartStream && ok:
		return fmt.Errorf("%w: it records an initial copy of slot %q that did not finish, and Start is StartStream: "+
			"run with StartCopy to copy again, or remove the stored position (and the consumer's output)", ErrStore, slot)
	case f.cfg.Start == StartStream:
		stream, err = f.start(ctx, rcfg)
	default:
		a.src.close(ctx) // the copy makes the slot on a connection of its own
		stream, err = f.copy(ctx, rcfg, pos, ok)
	}
	if err != nil {
		return err
	}
	f.mu.Lock()
	if f.streams > 0 {
		f.restarts++
	}
	f.streams++
	f.stream = stream
	f.mu.Unlock()
	defer func() {
		if cerr := stream.Close(context.WithoutCancel(ctx)); err == nil && cerr != nil && !errors.Is(cerr, replication.ErrClosed) {
			err = cerr
		}
		act := stream.Activity()
		f.mu.Lock()
		f.acked = max(f.acked, stream.Progress().Acked)
		f.past.add(stream)
		f.stream = nil
		f.mu.Unlock()
		if act.Acked > 0 {
			a.o.Progress = true
		}
		if err != nil && ctx.Err() == nil && rcfg.TemporarySlot && again(err) {
			err = retry.Mark(fmt.Errorf("changefeed: the connection to the temporary slot %q was lost, and the slot with it: %w", slot, err), false)
		}
	}()
	defer f.watchPublications(ctx)()
	if f.cfg.Follower != nil {
		return f.cfg.Follower.Follow(ctx, stream)
	}
	err = f.follow(ctx, stream)
	if err == nil { // follow returns only on an error; never end Run with nil for it
		err = errors.New("changefeed: the stream ended")
	}
	return err
}

// reachedSource records that the attempt made a replication connection, after the store's Load.
func (f *Feed) reachedSource() {
	f.mu.Lock()
	f.connected = true
	if f.try != nil {
		f.try.o.Reached = true
	}
	f.mu.Unlock()
}

// connectSource makes a replication connection to the source: with replication.Connect until
// the Feed has reached the source once, then with replication.Reconnect, so that what a
// connection logs once for good (the published tables, the failover settings' warnings) is not
// logged again by each attempt.
func (f *Feed) connectSource(ctx context.Context, rcfg replication.Config) (*replication.Conn, error) {
	f.mu.Lock()
	again := f.connected
	f.mu.Unlock()
	if again {
		return replication.Reconnect(ctx, rcfg)
	}
	return replication.Connect(ctx, rcfg)
}

// side records what the attempt is reaching.
func (f *Feed) side(s Side) {
	f.mu.Lock()
	if f.try != nil {
		f.try.o.Side = s
	}
	f.mu.Unlock()
}

// copied records that the attempt stored the end of the initial copy.
func (f *Feed) copied() {
	f.mu.Lock()
	if f.try != nil {
		f.try.o.Progress = true
	}
	f.mu.Unlock()
}

// streamConfig returns rcfg for the streams the Feed starts: they do not reconnect by themselves
// (Run makes another attempt instead).
func streamConfig(rcfg replication.Config) replication.Config {
	rcfg.Reconnect.Disabled = true
	return rcfg
}

// copy runs the initial copy, once: a copy that fails is started over by Run's next attempt.
func (f *Feed) copy(ctx context.Context, rcfg replication.Config, pos Position, begun bool) (*replication.Stream, error) {
	var c Copier = (*feedCopier)(f)
	if f.cfg.Copier != nil {
		c = &trackedCopier{Copier: f.cfg.Copier, f: f}
	}
	stream, _, err := InitialCopy(ctx, CopyConfig{Replication: streamConfig(rcfg), Snapshot: f.cfg.Copy,
		Begun: begun, SystemID: pos.SystemID}, c)
	return stream, err
}

// trackedCopier is Config.Copier, with what Run's account of the attempt needs to know: that
// the source was reached (Begin is called once InitialCopy connected) and that the copy is done.
type trackedCopier struct {
	Copier
	f *Feed
}

func (c *trackedCopier) Begin(ctx context.Context, systemID string) error {
	c.f.reachedSource()
	return c.Copier.Begin(ctx, systemID)
}

func (c *trackedCopier) Done(ctx context.Context, cp decoding.LSN) error {
	if err := c.Copier.Done(ctx, cp); err != nil {
		return err
	}
	c.f.copied()
	return nil
}

// Interface check.
var _ Copier = (*trackedCopier)(nil)
