package ingest

import (
	"bytes"
	"fmt"
	"hash/maphash"
	"math/bits"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/schemas"
)

// copySeed hashes record keys for conflictingCopies' table.
var copySeed = maphash.MakeSeed()

// conflictingCopies names each event of the request that has the
// identity of an earlier one (the same record key: customer, meter and
// event ID) with other content (another record value: quantity, time,
// properties). Both would be written, and dedup would count the first and
// file the other in usage.duplicates as a conflicting copy, while the
// request is answered with success. An exact copy is a copy as a retry
// is, and passes. The records of events with an error (errs, in the order
// of their indexes) are not compared; each event is named once.
//
// The records are found by their keys in an open-addressing table of
// record indexes, reused from request to request (buffers.seen): no
// allocation for a request without conflicts.
func conflictingCopies(req *request, recs []*kgo.Record, errs []EventError) []EventError {
	if len(recs) < 2 {
		return nil
	}
	size := 1 << bits.Len(uint(2*len(recs))) // a power of two, more than twice the records
	table := req.bufs.seen[:0]
	if cap(table) < size {
		table = make([]int32, 0, size)
	}
	table = table[:size]
	for i := range table {
		table[i] = -1
	}
	req.bufs.seen = table
	mask := uint64(size - 1)
	var out []EventError
	e, named := 0, -1
	for k, r := range recs {
		u := &req.usages[k]
		for e < len(errs) && errs[e].Index < u.input {
			e++
		}
		if r == nil || e < len(errs) && errs[e].Index == u.input || u.input == named {
			continue
		}
		for i := maphash.Bytes(copySeed, r.Key) & mask; ; i = (i + 1) & mask {
			j := table[i]
			if j < 0 {
				table[i] = int32(k)
				break
			}
			if !bytes.Equal(recs[j].Key, r.Key) {
				continue
			}
			if first := req.usages[j].input; first != u.input && !bytes.Equal(recs[j].Value, r.Value) {
				named = u.input
				field := u.mm.field("event_id")
				out = append(out, EventError{Index: u.input, Field: field, Code: schemas.ReasonInvalid,
					Reason: fmt.Sprintf("has the identity of event %d of this request (the same %s, meter %s) with other content: dedup would count the first and file this one as a conflicting copy, never counted; give each event its own %s",
						first, identityFields(u.mm), clip(u.ue.Meter), field)})
			}
			break
		}
	}
	return out
}

// identityFields names the fields of a request's event that make its
// identity, for conflictingCopies.
func identityFields(mm *meterMap) string {
	if mm == nil {
		return "event_id, customer_id and meter"
	}
	return "source, id and subject"
}
