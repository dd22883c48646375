package sink

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/ClickHouse/clickhouse-go/v2/lib/proto"
	"go.uber.org/zap"
)

// ClickHouse availability and back-off (docs/design.md, The ClickHouse
// ledger, "Refused blocks": tell an unreachable server apart from a refused
// block).
//
// Guarantee kept here: while ClickHouse cannot take rows (unreachable,
// or unable to take any block), fetching is paused, the sink backs off,
// nothing is committed and nothing is parked, and /readyz says why; an
// INSERT error code the sink does not know is retried the same way for at
// most UnknownErrorLimit, then the sink stops rather than park rows that
// may be fine.

// connect dials ClickHouse (retrying while it is unreachable, not when it
// refuses the login or the TLS session) and checks
// that the server runs in UTC, that the migrations are applied and that
// no rebuild of the derived tables is unfinished.
func (w *Writer) connect(ctx context.Context) error {
	conn := w.cfg.Conn
	dropped := 0 // consecutive TLS sessions the server closed at the hello
	for attempt := 0; conn == nil; attempt++ {
		c, err := w.cfg.ClickHouseServer.Dial(ctx, w.cfg.Database, false)
		if err == nil {
			conn = c
			break
		}
		// A server that closes every TLS session at the client's hello
		// refuses its certificate (TLS 1.3 sends no alert before): after
		// droppedTLSLimit in a row, as refused; fewer may be a restart.
		if dropped++; !errors.Is(err, errTLSDropped) {
			dropped = 0
		} else if dropped >= droppedTLSLimit {
			return err
		}
		if ex := (*proto.Exception)(nil); errors.As(err, &ex) && ex.Code == 81 { // UNKNOWN_DATABASE
			return fmt.Errorf("%w (run `meterline migrate --database %s`)", err, w.cfg.Database)
		}
		// A refused user or password, a failed TLS handshake, a port
		// that speaks only TLS: no retry makes them right (CheckLogin).
		if errors.Is(err, ErrAuthentication) || errors.Is(err, errSpeaksTLS) || isTLSErr(err) {
			return err
		}
		w.lastUp.Store(err.Error())
		if attempt == 0 {
			w.log.Warn("clickhouse not reachable; retrying", zap.String("addr", w.cfg.ClickHouse), zap.Error(err))
		}
		if err := sleep(ctx, w.backoff(attempt)); err != nil {
			return err
		}
	}
	w.connMu.Lock()
	w.conn = conn
	w.connMu.Unlock()
	checks := []struct {
		what  string
		check func(context.Context, driver.Conn) error
		fatal []error
	}{
		// The tables' months and days are the server's: it must run in UTC.
		{"reading the server's time zone", CheckTimeZone, []error{ErrServerTimeZone}},
		{"checking migrations", CheckMigrations, []error{ErrMigrationsPending, ErrMigrationChanged}},
		// A rebuild of the derived tables swaps whole months: rows the
		// views wrote meanwhile would be lost, so no sink starts until it
		// finished.
		{"checking for unfinished rebuilds", CheckRebuilds, []error{ErrRebuildUnfinished}},
	}
	for _, c := range checks {
		for attempt := 0; ; attempt++ {
			err := c.check(ctx, conn)
			if err == nil {
				break
			}
			for _, f := range c.fatal {
				if errors.Is(err, f) {
					return err
				}
			}
			w.log.Warn(c.what+" failed; retrying", zap.Error(err))
			if err := sleep(ctx, w.backoff(attempt)); err != nil {
				return err
			}
		}
	}
	w.up.Store(true)
	w.m.up.Set(1)
	return nil
}

// minPingTimeout is the least time pingLoop gives a ping to be answered:
// a ping every PingInterval, each given the interval or this, whichever
// is longer, so that a short interval does not take a ClickHouse a little
// slow to answer (a loaded machine, a busy server) for one that stopped
// answering, and the sink not ready.
const minPingTimeout = time.Second

func (w *Writer) pingLoop(ctx context.Context) {
	t := time.NewTicker(w.cfg.PingInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, max(w.cfg.PingInterval, minPingTimeout))
		err := w.getConn().Ping(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		w.setUp(err)
	}
}

func (w *Writer) setUp(err error) {
	if err != nil {
		w.lastUp.Store(err.Error())
		w.zoneUnchecked.Store(true)
		if w.up.Swap(false) {
			w.log.Warn("clickhouse stopped answering", zap.String("addr", w.cfg.ClickHouse), zap.Error(err))
		}
		if isAuthErr(err) {
			if !w.loginRefused.Swap(true) {
				w.log.Error(fmt.Sprintf("clickhouse refuses the sink's user %q: the sink stops (when idle at once, else at its next write); it reads its password at start only: restart it with the current one",
					w.cfg.ClickHouseServer.user()), zap.String("addr", w.cfg.ClickHouse), zap.Error(err))
			}
			w.wakeIdlePoll()
		}
		w.m.up.Set(0)
		return
	}
	w.loginRefused.Store(false)
	if !w.up.Swap(true) {
		w.log.Info("clickhouse answers again", zap.String("addr", w.cfg.ClickHouse))
	}
	w.m.up.Set(1)
}

// idleCtx is the context of a poll with no record in hand: the health
// check's refusal of the login ends it (setUp), so that an idle sink
// stops within a ping interval, not at its next write (refusedIdle). The
// returned func must be called once the poll returned.
func (w *Writer) idleCtx(ctx context.Context) (context.Context, func()) {
	pctx, cancel := context.WithCancel(ctx)
	w.wakeMu.Lock()
	w.wakeIdle = cancel
	w.wakeMu.Unlock()
	if w.loginRefused.Load() { // refused since refusedIdle looked
		cancel()
	}
	return pctx, func() {
		w.wakeMu.Lock()
		w.wakeIdle = nil
		w.wakeMu.Unlock()
		cancel()
	}
}

func (w *Writer) wakeIdlePoll() {
	w.wakeMu.Lock()
	defer w.wakeMu.Unlock()
	if w.wakeIdle != nil {
		w.wakeIdle()
	}
}

// refusedIdle is the error that stops a sink with no record in hand once
// the health check found its login refused (setUp). With nothing in hand
// no write is in flight or due (every INSERT of the last window was
// waited for, and its transaction ended), so stopping here leaves the
// group as a shutdown does, and the resume rule has nothing to settle. A
// sink with records in hand goes on to write them: that write stops it
// (unknownSpell), or, on a connection the server still takes, commits.
func (w *Writer) refusedIdle() error {
	if !w.loginRefused.Load() {
		return nil
	}
	s := w.cfg.ClickHouseServer
	reason, _ := w.lastUp.Load().(string)
	return fmt.Errorf("%w: %s refused user %q while the sink runs (health check, nothing in hand): %s; the password is read at start only: restart the sink with the current one",
		ErrAuthentication, s.Addr, s.user(), reason)
}

// unknownSpell handles an INSERT failure of t. A refused login stops the
// sink (ErrAuthentication). For an error code the sink
// does not know (classUnknown) it starts or continues the spell of such
// failures, and returns an error wrapping ErrUnknownServerError once the
// spell has lasted UnknownErrorLimit; otherwise it returns nil and the
// caller backs off as when ClickHouse is unavailable.
//
// Why stop rather than park: the rows may be fine (a dictionary or a
// setting missing on the server fails every block alike), and parking
// moves billing rows out of the ledger; nor back off forever behind a
// "blocked" gauge: an error nobody classified needs a person, and a
// stopped sink (non-zero exit, /readyz down, its lag growing) is what
// alerts one. Nothing is lost: no offset was committed past these rows,
// and the restart's resume rule skips any that did land.
func (w *Writer) unknownSpell(t *table, err error) error {
	// A login the server refuses now, having taken it at start (a
	// password changed on the server): no back-off makes the sink's
	// password right, as it reads it at start only.
	if isAuthErr(err) {
		s := w.cfg.ClickHouseServer
		return fmt.Errorf("%w: %s refused user %q while the sink runs (writing %s): %v; the password is read at start only: restart the sink with the current one",
			ErrAuthentication, s.Addr, s.user(), t.name, err)
	}
	if classify(err) != classUnknown {
		return nil
	}
	var ex *proto.Exception
	errors.As(err, &ex)
	now := time.Now()
	if w.unknownSince.IsZero() {
		w.unknownSince = now
		w.log.Error("clickhouse fails with an error code the sink does not know: not an unavailable server, and not a refusal of the rows (they may be fine, so none is parked); backing off, committing nothing, and stopping after stop_after unless it clears",
			zap.String("table", t.name), zap.Int32("code", ex.Code), zap.String("code_name", codeName(ex.Code)),
			zap.Duration("stop_after", w.cfg.UnknownErrorLimit),
			zap.String("action", "fix what the server says (a dictionary, a column expression, a setting); the sink resumes by itself if it clears in time, else start it again (docs/operations.md, Outages)"),
			zap.Error(err))
	}
	if spell := now.Sub(w.unknownSince); spell >= w.cfg.UnknownErrorLimit {
		return fmt.Errorf("sink: %w: INSERTs into %s failing for %s, now with code %d (%s): %v; stopping rather than parking rows that may be fine: nothing is committed past them. Fix the server or the table (or, if the rows are at fault, add the code to the sink's refusal codes) and restart",
			ErrUnknownServerError, t.name, spell.Round(time.Second), ex.Code, codeName(ex.Code), ex.Message)
	}
	return nil
}

// endUnknownSpell: an INSERT succeeded, or the resume lookup found every
// row of the INSERT in the table already.
func (w *Writer) endUnknownSpell() {
	if !w.unknownSince.IsZero() {
		w.log.Info("clickhouse takes INSERTs again after an unknown error", zap.Duration("after", time.Since(w.unknownSince)))
		w.unknownSince = time.Time{}
	}
}

// checkZoneAgain checks the server's time zone again when ClickHouse went
// away since it was last checked (zoneUnchecked): a server restarted with
// another zone would have the views compute the rows' days and months in
// it. It returns an error wrapping ErrServerTimeZone, which stops the sink
// before it writes a row (nothing of the window is committed; a restart
// refuses the server at start), or another error when it cannot tell (the
// caller backs off as when ClickHouse is unavailable).
func (w *Writer) checkZoneAgain(ctx context.Context) error {
	if !w.zoneUnchecked.Load() {
		return nil
	}
	w.zoneUnchecked.Store(false)
	if err := CheckTimeZone(ctx, w.getConn()); err != nil {
		if !errors.Is(err, ErrServerTimeZone) {
			w.zoneUnchecked.Store(true)
		}
		return err
	}
	return nil
}

func (w *Writer) unavailable(t *table, err error, what string) {
	if errors.Is(err, errInsertRunning) {
		// ClickHouse answers: counted and logged by awaitInserts.
		w.setBlocked(fmt.Sprintf("cannot look up the rows of %s: %v; fetching paused, backing off, committing nothing", t.name, err))
		return
	}
	unknown := classify(err) == classUnknown
	kind := errUnavailable
	if unknown {
		kind = errUnknown
	}
	w.m.insertErrors.WithLabelValues(t.name, kind).Inc()
	if isNetErr(err) {
		w.setUp(err)
	}
	reason := fmt.Sprintf("clickhouse cannot take rows of %s (%s): %v; fetching paused, backing off, committing nothing", t.name, what, err)
	// An unknown code was logged as such by unknownSpell: it is no
	// unavailable server.
	if w.blocked.Load().(string) == "" && !unknown {
		fields := []zap.Field{zap.String("table", t.name), zap.String("during", what)}
		if ex := (*proto.Exception)(nil); errors.As(err, &ex) {
			fields = append(fields, zap.Int32("code", ex.Code), zap.String("code_name", codeName(ex.Code)))
		}
		fields = append(fields, zap.String("action", operatorAction(err)), zap.Error(err))
		w.log.Warn("clickhouse unavailable: pausing fetching and backing off; no offset is committed until the rows are written", fields...)
	}
	w.setBlocked(reason)
}

func (w *Writer) setBlocked(reason string) {
	w.blocked.Store(reason)
	w.m.blocked.Set(1)
	if !w.paused.Swap(true) {
		w.sess.Client().PauseFetchTopics(w.topicNames()...)
	}
}

func (w *Writer) clearBlocked() {
	if w.blocked.Load().(string) != "" {
		w.log.Info("clickhouse takes rows again; resuming")
	}
	w.blocked.Store("")
	w.m.blocked.Set(0)
}

func (w *Writer) resumeFetching() {
	if w.paused.Swap(false) {
		w.sess.Client().ResumeFetchTopics(w.topicNames()...)
	}
}

// droppedTLSLimit is how many TLS sessions in a row the server may close
// at the hello before connect stops as at a refused TLS handshake.
const droppedTLSLimit = 3

func (w *Writer) backoff(attempt int) time.Duration {
	d := w.cfg.BackoffMin
	for i := 0; i < attempt && d < w.cfg.BackoffMax; i++ {
		d *= 2
	}
	if d > w.cfg.BackoffMax {
		d = w.cfg.BackoffMax
	}
	return d
}

// backoffSleep waits before a retry. It returns errAbandon when the process
// is stopping or the partitions were revoked: the window cannot commit.
func (w *Writer) backoffSleep(ctx context.Context, attempt int) error {
	if w.revoked.Load() {
		return errAbandon
	}
	if err := sleep(ctx, w.backoff(attempt)); err != nil {
		return errAbandon
	}
	if w.revoked.Load() {
		return errAbandon
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
