package sink

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/proto"
	"go.uber.org/zap"
)

// INSERT attempts whose outcome is unknown (DESIGN §7, "Exactly-once").
//
// An INSERT that fails without an answer from the server (the sink's
// deadline passed, the connection broke) may still be running there, and
// write its rows after the sink gave up on it. The resume rule is correct
// only if such an attempt has ended before it looks up which rows are in
// the table: otherwise the lookup misses rows that land just after it, and
// the retry writes them a second time (plain count() and the rollups then
// count them twice until a merge, or verify).
//
// Guarantee kept here: every INSERT carries a query_id of its own; an
// attempt with an unknown outcome is waited for, holding insertMu (so a
// revoke, and the next owner's lookup, wait for it too) until the server
// no longer lists it in system.processes, at most until settleDeadline; one
// that outlasts that wait is remembered, and no resume lookup runs until
// the server no longer lists it. (A user that may not read
// system.processes loses this wait: see cannotTell.)

// insertIDs numbers the INSERTs of this process.
var insertIDs atomic.Uint64

// processStart tells this process's query IDs from an earlier one's.
var processStart = time.Now().UnixNano()

// unsettled are the query IDs of INSERT attempts with an unknown outcome
// that the server may still run.
type unsettled struct {
	mu  sync.Mutex
	ids []string
}

func (w *Writer) newInsertID() string {
	return fmt.Sprintf("meterline-sink-%s-%d-%d", w.cfg.InstanceID, processStart, insertIDs.Add(1))
}

// answered reports whether err is the server's answer to the query (an
// exception): the query has ended there.
func answered(err error) bool {
	var ex *proto.Exception
	return errors.As(err, &ex)
}

// settleDeadline bounds how long a failed INSERT, begun at start, waits
// for its attempt to end on the server, while holding insertMu: a revoke
// waits for it, and must end within the rebalance timeout with room to
// rejoin the group. The wait lasts at most InsertTimeout, and the attempt
// and its wait together end a tenth of RebalanceTimeout before it.
func (w *Writer) settleDeadline(start time.Time) time.Time {
	r := w.cfg.RebalanceTimeout
	d := time.Now().Add(w.cfg.InsertTimeout)
	if end := start.Add(r - r/10); end.Before(d) {
		return end
	}
	return d
}

// settleInsert waits until the server no longer runs the INSERT id, begun
// at start, whose outcome is unknown, until settleDeadline (no query runs
// past it); if it may still run then, it is remembered for awaitSettled.
func (w *Writer) settleInsert(ctx context.Context, id string, start time.Time) {
	deadline := w.settleDeadline(start)
	var err error
	for {
		left := time.Until(deadline)
		if left <= 0 || ctx.Err() != nil {
			w.log.Warn("an INSERT whose outcome is unknown may still run on the server: no resume lookup until it has ended",
				zap.String("query_id", id), zap.Error(err))
			w.unsettled.mu.Lock()
			w.unsettled.ids = append(w.unsettled.ids, id)
			w.unsettled.mu.Unlock()
			return
		}
		var running []string
		running, err = w.stillRunning(ctx, []string{id}, min(w.cfg.QueryTimeout, left))
		if err == nil && len(running) == 0 {
			return
		}
		if answered(err) {
			w.cannotTell(err, id)
			return
		}
		_ = sleep(ctx, min(50*time.Millisecond, max(time.Until(deadline), 0)))
	}
}

// awaitSettled returns nil once no INSERT attempt with an unknown outcome
// may still run on the server, and an error (the lookup is then retried
// after a back-off, as when ClickHouse is unavailable) while one does.
func (w *Writer) awaitSettled(ctx context.Context) error {
	w.unsettled.mu.Lock()
	defer w.unsettled.mu.Unlock()
	if len(w.unsettled.ids) == 0 {
		return nil
	}
	running, err := w.stillRunning(ctx, w.unsettled.ids, w.cfg.QueryTimeout)
	if answered(err) {
		w.cannotTell(err, w.unsettled.ids...)
		w.unsettled.ids = nil
		return nil
	}
	if err != nil {
		return fmt.Errorf("sink: is an earlier INSERT still running: %w", err)
	}
	w.unsettled.ids = running
	if len(running) > 0 {
		return fmt.Errorf("sink: an earlier INSERT whose outcome is unknown still runs on the server (query_id %s): the resume lookup waits for it", running[0])
	}
	return nil
}

// stillRunning returns those of ids that the server still runs, asking
// it for at most timeout.
func (w *Writer) stillRunning(ctx context.Context, ids []string, timeout time.Duration) ([]string, error) {
	qs := make([]string, len(ids))
	for i, id := range ids {
		qs[i] = quote(id)
	}
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	rows, err := w.getConn().Query(qctx, "SELECT query_id FROM system.processes WHERE query_id IN ("+strings.Join(qs, ", ")+")")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, rows.Err()
}

// cannotTell logs that the server refused to say whether INSERTs still
// run (a user that may not read system.processes): the resume lookup then
// runs without waiting for them, and the ledger's ReplacingMergeTree
// collapses a row they write after it (a backstop, as for a zombie).
func (w *Writer) cannotTell(err error, ids ...string) {
	w.log.Error("cannot read system.processes: not waiting for INSERT attempts whose outcome is unknown; a row they write after the resume lookup may be in the ledger twice until a merge",
		zap.Strings("query_ids", ids), zap.Error(err))
}
