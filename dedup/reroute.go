package dedup

import (
	"bytes"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/schemas"
)

// Headers of a re-routed record (docs/design.md, Event identity and keys).
// They are trusted only with a valid HeaderAuth signature (auth.go), or,
// for records re-routed before signatures existed, below the partition's
// upgrade offset.
const (
	// HeaderRerouted marks a record dedup re-produced to its canonical
	// partition. Value: "<partition>/<offset>" of the misrouted original.
	HeaderRerouted = "meterline-rerouted"
	// HeaderArrival carries the misrouted original's arrival time (epoch
	// ms), which stays the event's arrival time, within
	// [broker timestamp − W, broker timestamp].
	HeaderArrival = "meterline-arrival"
)

// Punctuate appends a signed tick to the partition's usage.events
// partition. Its broker timestamp, when read back, advances the watermark
// (docs/design.md, Time).
func (pt *partition) Punctuate(tx *stream.Tx) error {
	if err := pt.begin(tx); err != nil {
		return err
	}
	tx.Emit(&kgo.Record{
		Topic:     pt.pr.eventsTopic,
		Partition: pt.p,
		Value:     pt.pr.tickValue,
		Headers:   pt.tickHeaders,
	})
	pt.noteSigned(tx)
	if pt.wm > 0 {
		pt.pr.m.wmDelay.WithLabelValues(pt.pl).Set(pt.pr.now().Sub(time.UnixMilli(pt.wm)).Seconds())
	}
	return nil
}

// arrivalOf returns an event record's arrival time and whether its
// re-route headers are proven (docs/design.md, Event identity and keys). A
// record without dedup's headers arrived at its broker timestamp ts. A
// re-routed record keeps the original's arrival, carried in a header, when
// its signature verifies (or, unsigned, when it lies below the upgrade
// offset); that arrival is clamped to [ts − W, ts]. Headers that fail are
// counted and change nothing: the record is an ordinary producer record.
func (pt *partition) arrivalOf(r *kgo.Record, h *dedupHeaders, ts int64) (arrival int64, proven bool) {
	if !h.any {
		return ts, false
	}
	var rr rerouted
	var why string
	if !h.hasAuth && r.Offset < pt.upgrade {
		// Re-routed before dedup signed its headers.
		var ok bool
		if rr, ok = parseRerouted(h); !ok {
			why = "malformed or repeated re-route headers"
		}
	} else {
		rr, why = pt.pr.keys.verifyReroute(pt.pr.eventsTopic, r, h)
	}
	if why != "" {
		pt.forged(r, why)
		return ts, false
	}
	return min(max(rr.arrival, ts-pt.pr.cfg.Window.Milliseconds()), ts), true
}

// forged counts and logs a record whose dedup headers are not proven.
func (pt *partition) forged(r *kgo.Record, why string) {
	pt.txc.Inc(pt.pr.m.forged)
	pt.pr.log.Warn("dedup headers not proven; handled as an ordinary producer record", zap.String("why", why),
		zap.Int32("partition", r.Partition), zap.Int64("offset", r.Offset), zap.ByteString("key", boundLogKey(r.Key)))
}

// boundLogKey keeps at most 256 bytes of a key for a log line.
func boundLogKey(k []byte) []byte {
	if len(k) > 256 {
		return k[:256]
	}
	return k
}

// tick forwards the watermark on a tick that dedup signed (or, unsigned,
// one below the upgrade offset), at most once per WatermarkEvery of broker
// time: a producer's ticks, or a flood of replayed ones, fan out nothing
// more (docs/design.md, Time). Every tick's timestamp has already advanced
// the watermark, as any record's does.
func (pt *partition) tick(tx *stream.Tx, r *kgo.Record, m *schemas.Tick, h *dedupHeaders, ts int64) error {
	if h.hasAuth || r.Offset >= pt.upgrade {
		if why := pt.pr.keys.verifyTick(pt.pr.eventsTopic, r, h); why != "" {
			if h.any {
				pt.forged(r, why)
			}
			pt.txc.Inc(pt.pr.m.unauthTicks)
			// The instance the tick names tells a producer's ticks from a
			// dedup instance's signed with another key ring.
			pt.pr.log.Warn("tick not authenticated; it forwards no watermark", zap.String("why", why),
				zap.ByteString("tick_instance", boundLogKey([]byte(m.InstanceID))),
				zap.Int32("partition", r.Partition), zap.Int64("offset", r.Offset))
			return nil
		}
	}
	if pt.lastForward != 0 && ts < pt.lastForward+pt.pr.cfg.WatermarkEvery.Milliseconds() {
		pt.txc.Inc(pt.pr.m.throttledTicks)
		return nil
	}
	pt.lastForward = ts
	return pt.forwardWatermark(tx)
}

// forwardWatermark sends the partition watermark to every usage.deduped
// partition; the aggregator takes the minimum over all sources.
func (pt *partition) forwardWatermark(tx *stream.Tx) error {
	c := pt.pr.counts
	// Each record states W, B and S: the aggregator keeps state by them and
	// refuses to run with shorter ones (docs/design.md, Time).
	cfg := &pt.pr.cfg
	v, err := schemas.Encode(&schemas.Watermark{SourcePartition: pt.p, SourcePartitions: c.events, Watermark: pt.wm,
		WindowMs: cfg.Window.Milliseconds(), BucketMs: cfg.Bucket.Milliseconds(), SkewMs: cfg.Skew.Milliseconds()})
	if err != nil {
		return fmt.Errorf("dedup: partition %d: encode watermark: %w", pt.p, err)
	}
	for i := int32(0); i < c.deduped; i++ {
		tx.Emit(&kgo.Record{Topic: pt.pr.dedupedTopic, Partition: i, Value: v})
	}
	return nil
}

// reroute re-produces a misrouted event to its canonical partition with
// its canonical key, carrying the original's coordinates and arrival in
// signed headers.
func (pt *partition) reroute(tx *stream.Tx, r *kgo.Record, canon []byte, e *schemas.UsageEvent, arrival int64) error {
	to := schemas.Partition(canon, pt.pr.counts.events)
	key := bytes.Clone(canon)
	ok, err := pt.emitDerived(tx, r, e, &kgo.Record{
		Topic:     pt.pr.eventsTopic,
		Partition: to,
		Key:       key,
		Value:     r.Value,
		Headers: pt.pr.keys.rerouteHeaders(pt.pr.eventsTopic, to, key, r.Value,
			rerouted{origPartition: r.Partition, origOffset: r.Offset, arrival: arrival}),
	}, "re-routed")
	if !ok {
		return err
	}
	pt.noteSigned(tx)
	pt.txc.Inc(pt.pr.m.rerouted)
	pt.pr.log.Info("misrouted record re-routed", zap.ByteString("key", boundLogKey(r.Key)), zap.ByteString("canonical_key", canon),
		zap.Int32("partition", r.Partition), zap.Int64("offset", r.Offset), zap.Int32("to_partition", to))
	return nil
}
