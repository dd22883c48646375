package sink

import (
	"errors"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/schemas"
)

// FuzzRowDecode feeds arbitrary record values to every table's decoder, as
// the sink reads them from its six topics (usage.rejected is writable by
// any client that the ACLs let in). A decoder must never panic; a value
// that does not decode fails with ErrUndecodable or ErrUnknownSchema (the
// reason it is parked or quarantined with); a decoded row yields every
// column's value, and so does its usage_quarantine row.
func FuzzRowDecode(f *testing.F) {
	ts := base
	for _, m := range []schemas.Message{
		&schemas.DedupedEvent{EventID: "e", CustomerID: "c", Meter: "m", Quantity: 1, EventTime: 1, Properties: []schemas.Property{{Name: "a", Value: "b"}}},
		&schemas.Watermark{SourcePartition: 1, SourcePartitions: 2, Watermark: 3},
		&schemas.Aggregate{CustomerID: "c", Meter: "m", Group: []schemas.Property{{Name: "region", Value: "eu\""}}, Status: schemas.StatusOpen},
		&schemas.Adjustment{EventID: "e", CustomerID: "c", Meter: "m", Delta: -1},
		&schemas.Duplicate{EventID: "e", CustomerID: "c", Meter: "m", Conflict: true},
		&schemas.Rejected{Reason: schemas.ReasonInvalid, RawKey: []byte{0xff}, RawValue: []byte("x")},
		&schemas.Balance{CustomerID: "c", Meters: []schemas.MeterBalance{{Meter: "m", Usage: 1, Limit: 2, OnLimit: schemas.OnLimitReject}},
			Grants: []schemas.GrantBalance{{ID: "g", Amount: 3, ExpiresAt: 4}}, OverdraftPolicy: schemas.OverdraftDeny},
	} {
		b := schemas.MustEncode(m)
		f.Add(b)
		f.Add(b[:len(b)-1])
	}
	f.Add([]byte("not avro"))
	f.Add([]byte{0xC3, 0x01, 1, 2, 3, 4, 5, 6, 7, 8, 0})
	tables := newTables(testTopics())
	quarantine := newQuarantine(testTopics())
	f.Fuzz(func(t *testing.T, v []byte) {
		rec := &kgo.Record{Key: v, Value: v, Timestamp: ts, Headers: []kgo.RecordHeader{{Key: "h", Value: v}}}
		for _, tb := range tables {
			rec.Topic = tb.topic
			r, err := tb.buildRow(rec)
			if err != nil {
				if !errors.Is(err, schemas.ErrUndecodable) && !errors.Is(err, schemas.ErrUnknownSchema) {
					t.Fatalf("%s: error of an unexpected class: %v", tb.name, err)
				}
				if got := decodeReason(err); got != schemas.ReasonUndecodable && got != schemas.ReasonUnknownSchema {
					t.Fatalf("%s: reason %q", tb.name, got)
				}
				q := quarantineRow(rec, decodeReason(err), err.Error())
				if got := len(quarantine.values(q)); got != len(quarantine.columns) {
					t.Fatalf("quarantine row has %d values", got)
				}
				continue
			}
			if r == nil {
				continue // a watermark: not a row
			}
			if got := len(tb.values(r)); got != len(tb.columns) {
				t.Fatalf("%s: %d values for %d columns", tb.name, got, len(tb.columns))
			}
			for _, c := range tb.columns {
				_ = c.slice([]*row{r})
			}
		}
	})
}
