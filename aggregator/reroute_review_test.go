package aggregator

import (
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestStaleCopyRestatesTheValueInEffect: the last record of a customer's
// key on its canonical partition (what compaction keeps, and all that an
// aggregator reading the compacted topic from the start applies) must
// carry the value in effect. A copy that claims the origin of the last
// record applied but carries another value is skipped; it must then
// restate the value in effect, or it would be what compaction keeps. It
// happens without any forged header (a restated record read back after a
// record written on the canonical partition with a broker time that
// stepped back: the origin stays, the value changed), and with one (a
// client copying the headers of the last record onto another value:
// producers set headers too, DESIGN §2). A copy carrying the value in
// effect at the same origin is skipped and restates nothing (no loop).
func TestStaleCopyRestatesTheValueInEffect(t *testing.T) {
	rec := func(off, ts int64, value string, hdr ...string) *kgo.Record {
		r := &kgo.Record{Partition: 1, Offset: off, Timestamp: time.UnixMilli(ts)}
		if value != "" {
			r.Value = []byte(value)
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: hdr[i], Value: []byte(hdr[i+1])})
		}
		return r
	}
	copyOf := func(off, ts int64, value, from string, arrival int64) *kgo.Record {
		return rec(off, ts, value, HeaderRerouted, from, HeaderArrival, fmt.Sprint(arrival))
	}
	// want per record: "applied", "skipped", or "restates <value>"
	// ("restates <nil>": a tombstone).
	for _, tc := range []struct {
		name string
		recs []*kgo.Record
		want []string
	}{
		{"restated record read back after a clock stepped back", []*kgo.Record{
			rec(1, 3000, "v1"),
			copyOf(2, 9000, "old", "0/7", 1000), // a stale copy: restates v1, origin 1/1@3000
			rec(3, 2500, "v3"),                  // broker time behind: applied, origin stays 1/1@3000
			copyOf(4, 9001, "v1", "1/1", 3000),  // the restated record: same origin, not the value in effect
		}, []string{"applied", "restates v1", "applied", "restates v3"}},
		{"the value in effect restated again is skipped", []*kgo.Record{
			rec(1, 3000, "v1"), rec(3, 2500, "v3"), copyOf(4, 9001, "v3", "1/1", 3000),
		}, []string{"applied", "applied", "skipped"}},
		{"headers of the last record copied onto another value", []*kgo.Record{
			rec(1, 3000, "v1"), copyOf(2, 9000, "forged", "1/1", 3000),
		}, []string{"applied", "restates v1"}},
		{"a tombstone at the origin of a value", []*kgo.Record{
			rec(1, 3000, "v1"), copyOf(2, 9000, "", "1/1", 3000),
		}, []string{"applied", "restates v1"}},
		{"a value at the origin of a tombstone", []*kgo.Record{
			rec(1, 3000, ""), copyOf(2, 9000, "v2", "1/1", 3000),
		}, []string{"applied", "restates <nil>"}},
		{"two aggregators' copies of one original", []*kgo.Record{
			copyOf(0, 2000, "m", "0/7", 1000), copyOf(1, 2001, "m", "0/7", 1000),
		}, []string{"applied", "skipped"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pt := &partition{p: 1, pr: &processor{now: time.Now}}
			st := mapState{}
			for i, r := range tc.recs {
				o, stale, restate, err := pt.staleCopy(st, r, "acme")
				if err != nil {
					t.Fatal(err)
				}
				got := "applied"
				switch {
				case !stale:
					st[string(originKey("acme"))] = o.encodeWith(r.Value)
				case restate != nil:
					v := string(restate.Value)
					if restate.Value == nil {
						v = "<nil>"
					}
					got = "restates " + v
					if ro, copied := OriginOf(restate); !copied || ro != o || restate.Partition != pt.p {
						t.Errorf("record %d: restated to partition %d with origin %+v (a copy: %v), want partition %d, origin %+v",
							i, restate.Partition, ro, copied, pt.p, o)
					}
				default:
					got = "skipped"
				}
				if got != tc.want[i] {
					t.Errorf("record %d (offset %d): %s, want %s", i, r.Offset, got, tc.want[i])
				}
			}
		})
	}
}
