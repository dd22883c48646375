package aggregator

import (
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/internal/topics"
)

// With entitlements, New checks that usage.entitlements and usage.deduped
// use LogAppendTime (Config.AllowCreateTime): their record timestamps are
// the broker times at which entitlements take effect and which bound an
// event's time. A record's own timestamp type tells whether the setting
// still holds: once a partition of a topic has given a LogAppendTime
// record, a CreateTime record of it means the setting was changed since,
// and its timestamp is its producer's choice, never an arrival. The stage
// then stops before the record is gated, decided or applied, as dedup does
// (docs/operations.md, Arrival time).

// keyLogAppend: with entitlements, the topics of this partition that have
// given a record with a LogAppendTime timestamp (a byte of
// logAppendDeduped and logAppendEntitlements bits). A CreateTime record of
// a topic whose bit is set stops the stage (checkArrival), after a restart
// too.
var keyLogAppend = []byte("L")

const (
	logAppendDeduped byte = 1 << iota
	logAppendEntitlements
)

// checkArrival sets, for each record of recs stamped LogAppendTime, its
// topic's bit in the partition's keyLogAppend (written in tx when it
// changes), and returns a *topics.TimestampTypeError naming the first
// record stamped CreateTime whose topic's bit is set. Without entitlements
// or with AllowCreateTime it checks nothing, as New does.
func (pt *partition) checkArrival(tx *stream.Tx, recs []*kgo.Record) error {
	if pt.ent == nil || pt.pr.cfg.AllowCreateTime {
		return nil
	}
	was := pt.ent.logAppend
	deduped := pt.pr.cfg.Topics.DedupedTopic()
	for _, r := range recs {
		bit := logAppendEntitlements
		if r.Topic == deduped {
			bit = logAppendDeduped
		}
		if r.Attrs.TimestampType() == 1 {
			pt.ent.logAppend |= bit
		} else if pt.ent.logAppend&bit != 0 {
			return &topics.TimestampTypeError{Stage: "aggregator", Topic: r.Topic, Have: "CreateTime",
				Record: fmt.Sprintf("partition %d offset %d", r.Partition, r.Offset)}
		}
	}
	if pt.ent.logAppend != was {
		tx.Put(keyLogAppend, []byte{pt.ent.logAppend})
	}
	return nil
}

// loadLogAppend reads keyLogAppend from the state (absent: no bit).
func (e *entPart) loadLogAppend(st stateReader) error {
	v, ok, err := st.Get(keyLogAppend)
	if err != nil {
		return err
	}
	e.logAppend = 0
	if ok && len(v) == 1 {
		e.logAppend = v[0]
	}
	return nil
}
