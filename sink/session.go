package sink

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/session"
)

// Session lifecycle: one Kafka session of the sink at a time
// (internal/session: a consumer-group member and a transactional
// producer, rebuilt with the same transactional ID after a commit with an
// unknown outcome; docs/design.md, Exactly-once, "One Kafka session"), its
// assignment and its revokes.
//
// Guarantees kept here (docs/design.md, The ClickHouse ledger, "Exactly
// once into ClickHouse"): every partition assigned starts dirty, so that
// the resume rule (lookup.go) checks its rows against the table before any
// is inserted, whoever wrote them; and a revoke returns only once no
// ClickHouse write of this instance can still be in flight, so that the
// next owner's lookup sees every row this instance wrote.

// fetchOptions bound what the client fetches ahead of the sink's batches
// (Config.MaxBatchBytes). kgo keeps a partition's fetched data until it
// is polled, and with its defaults (1 MiB a partition, 50 MiB a fetch,
// compressed) a burst on many partitions sat in its buffers beside the
// sink's batches: a month end of 400,000 records of about 300 bytes on
// 32 partitions had 397,500 records (56 MB) buffered, most of the burst.
// A fetch of a 16th of MaxBatchBytes (4 MiB at the default) and 256 KiB a
// partition keep it within a fraction of one batch (Kafka still returns
// a larger first batch whole). Config.ClientOptions can override both.
func fetchOptions(maxBatchBytes int64) []kgo.Opt {
	fetch := min(max(maxBatchBytes/16, 64<<10), 50<<20)
	return []kgo.Opt{kgo.FetchMaxBytes(int32(fetch)), kgo.FetchMaxPartitionBytes(int32(min(fetch/4, 256<<10)))}
}

// runSession runs one Kafka session: the group member and transactional
// producer of internal/session, and the inserter goroutine, until ctx
// ends or the session fails; closing the session leaves the group.
func (w *Writer) runSession(ctx context.Context) error {
	sess, err := w.loop.Open(w.topicNames(), session.Hooks{Assigned: w.adjustOffsets, Revoked: w.onRevoked}, fetchOptions(w.cfg.MaxBatchBytes)...)
	if err != nil {
		return fmt.Errorf("sink: %w", err)
	}
	w.sess = sess
	// The transactional ID is initialised before any window: a principal
	// without Write on it stops the sink here, as it stops dedup and the
	// aggregator, not at the first transaction, which an idle sink may
	// reach hours later; and a previous incarnation is fenced at once.
	if err := w.loop.InitProducerID(ctx, sess.Client()); err != nil {
		w.loop.Close(sess)
		w.clearParts()
		return fmt.Errorf("sink: %w", err)
	}
	w.revoked.Store(false)
	w.joined.Store(true)
	ins := w.startInserter(ctx)
	defer func() {
		ins.close()
		w.joined.Store(false)
		w.resumeFetching()
		w.loop.Close(sess)
		w.clearParts()
	}()
	w.log.Info("sink started", zap.String("group", w.cfg.Group), zap.Strings("topics", w.topicNames()),
		zap.String("transactional_id", w.cfg.TransactionalID()), zap.String("database", w.cfg.Database))
	return w.runWindows(ctx, ins)
}

// adjustOffsets runs on kgo's group goroutine once the group's committed
// offsets of newly assigned partitions are fetched (stable: no transaction
// of a previous owner is pending). Every assigned partition starts dirty:
// a previous owner may have inserted rows past its last commit.
func (w *Writer) adjustOffsets(_ context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.anyUnchecked() {
		w.checkSince, w.checkErr = time.Now(), ""
	}
	assigned := map[string][]string{}
	for topic, parts := range offsets {
		for p, o := range parts {
			committed := o.EpochOffset().Offset
			if committed < 0 {
				// A first start reads from the earliest offset. The table
				// may still hold rows (a crash before the first commit):
				// the lookup then starts at the first row consumed (see
				// filterPresent). When the group's offsets were lost
				// instead, checkAssigned stops the sink first
				// (progress.go).
				committed = -1
				parts[p] = kgo.NoResetOffset().AtStart()
			}
			w.parts[tp{topic, p}] = &pstate{committed: committed, dirty: true, fromCommitted: committed >= 0}
			assigned[topic] = append(assigned[topic], fmt.Sprintf("%d@%d", p, committed))
		}
	}
	w.log.Info("partitions assigned (partition@committed offset); each is checked against its table before its rows are inserted",
		zap.Any("partitions", assigned))
	w.m.owned.Set(float64(len(w.parts)))
	return offsets, nil
}

// onRevoked runs on kgo's group goroutine for revoked and lost partitions.
// The GroupTransactSession has already marked the open window as unable to
// commit. Here the run loop is told to abandon its window, and the revoke
// waits for a ClickHouse write in flight, so that the next owner's resume
// lookup sees every row this instance wrote.
func (w *Writer) onRevoked(_ context.Context, _ *kgo.Client, revoked map[string][]int32) {
	w.revoked.Store(true)
	w.insertMu.Lock()
	//lint:ignore SA2001 an empty critical section: wait for the write in flight
	w.insertMu.Unlock()
	w.mu.Lock()
	for topic, ps := range revoked {
		for _, p := range ps {
			delete(w.parts, tp{topic, p})
		}
	}
	w.m.owned.Set(float64(len(w.parts)))
	w.mu.Unlock()
	w.log.Info("partitions revoked", zap.Any("partitions", revoked))
}

func (w *Writer) clearParts() {
	w.mu.Lock()
	w.parts = map[tp]*pstate{}
	w.m.owned.Set(0)
	w.mu.Unlock()
}

func (w *Writer) poll(ctx context.Context, d time.Duration, max int) kgo.Fetches {
	if d <= 0 {
		d = time.Millisecond
	}
	if max < 1 {
		max = 1
	}
	pctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return w.sess.PollRecords(pctx, max)
}
