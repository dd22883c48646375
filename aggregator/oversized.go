package aggregator

import (
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/schemas"
)

// RejectBatch implements stream.BatchRejecter: a batch of usage.deduped or
// of usage.entitlements that decompresses past the bound (a decompression
// bomb, docs/design.md, Bad input) is rejected as oversized, one rejection
// at its first offset naming its topic and offsets, as dedup does; the
// runtime moves the partition's input past it in the same transaction.
// None of its records is decoded: an event in it is never counted, an
// entitlements record in it never applies, and the partition's read time
// of usage.entitlements moves on with the next record or tick after it.
func (pt *partition) RejectBatch(tx *stream.Tx, b stream.RejectedBatch) error {
	// What Process does before a batch of records: the reload after an
	// abort, the state's first writes, the FINALs the loaded state left due.
	if err := pt.Process(tx, nil); err != nil {
		return err
	}
	if pt.ent != nil {
		// The transaction commits the partition's input offset, as with
		// records (Process).
		pt.ent.fenced = true
	}
	// The source record carries the batch's coordinates and a timestamp
	// of 0 (no record of it is read); no key or value, so no raw bytes.
	src := &kgo.Record{Topic: b.Topic, Partition: b.Partition, Offset: b.From, Timestamp: time.UnixMilli(0)}
	if err := pt.reject(tx, src, nil, schemas.ReasonOversized, b.Detail()); err != nil {
		return err
	}
	pt.publish()
	return nil
}
