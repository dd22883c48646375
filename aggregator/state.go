package aggregator

import (
	"encoding/binary"
	"errors"
	"strconv"

	"github.com/meterline/meterline/schemas"
)

// State keys: what the aggregator keeps in its Pebble state and its
// changelog, encoded here (the period markers, 'F', in finalize.go). P is
// a period start (8 bytes big-endian, so keys sort by period); K is the
// aggregate key: the framed customer, meter and group name/value pairs.
//
//	'a' P K          open aggregate (aggState)
//	'f' P K          final aggregate's working state, kept until end + W + B + S
//	'u' P framed(K) framed(value)  a value UNIQUE_COUNT has seen in P
//	'p' P seq        an event of P queued behind P's FINAL revisions (late
//	                 by arrival while P was open, or processed while its
//	                 FINALs were going out), booked as an adjustment after
//	                 them, in seq order
//	'r' P seq        the charge (entitlements.Decision.AppendCharge) of the
//	                 event queued as 'p' P seq, when entitlements are on
//	                 (also a charge of nothing): refunded and counted if
//	                 its booking refuses it, deleted when it is booked
//	't' P seq        the record of usage.deduped that the event queued as
//	                 'p' P seq came from (queuedSource: its offset,
//	                 timestamp and key), written with it and deleted when
//	                 it is booked: a rejection at its booking names that
//	                 record, as one of an event processed at once does;
//	                 absent from state written before it was kept (such a
//	                 rejection names none)
//	'l' P K          an adjustment was booked into P for aggregate key K:
//	                 P's FINAL emission gives K a FINAL revision (value 0)
//	                 unless K has one of its own, so that every invoice
//	                 line of P turns final in the partition that books
//	                 into it (finalize.go); deleted when P expires
//	'F' P            P is final in this partition: periodState, the phase
//	                 of its chunked work and its cursor (finalize.go);
//	                 empty when done
//	'w' source       latest watermark from a dedup source partition
//	'n'              obsolete: the number of dedup source partitions as
//	                 watermark records once claimed it; never read (the
//	                 count comes from the cluster's metadata)
//	'c'              sequence counter for 'p' keys
//	's'              the key scheme of usage.deduped this state was built
//	                 from, schemas.DedupedKeyScheme (processor.go
//	                 checkKeyScheme); absent only from new state
//	'm'              entModeOn when the state was built with
//	                 entitlements on (processor.go checkEntMode)
//	'N'              the partition count of usage.deduped, then, with
//	                 entitlements on, of usage.entitlements (4 bytes
//	                 big-endian each); refused when the cluster's differ
//	                 (processor.go checkPartitionCounts)
//	'P'              the billing period (Config.Period: month, day or
//	                 hour) the state was built with; refused when the
//	                 configured one differs (processor.go checkPeriod);
//	                 absent only from new state or state built before it
//	                 was recorded
//	'M' P meter      the definition (meterDef, JSON) the state of meter in
//	                 P was built with, written with its first state key
//	                 there, deleted when P expires; refused when the
//	                 meters file defines the meter otherwise
//	                 (meterdef.go)
//	'd'              present once the state records the definitions of
//	                 its meters (meterdef.go); absent from new state and
//	                 state built before they were recorded
//	'k'              the number of 'a' and 'f' keys (8 bytes big-endian),
//	                 written in every transaction that changes it
//	                 (processor.go saveKeyCount) and read when a
//	                 partition opens instead of scanning them; absent
//	                 from state that never had such a key, or built
//	                 before the count was kept (counted once then)
const (
	pfxOpen    = 'a'
	pfxFinal   = 'f'
	pfxUnique  = 'u'
	pfxPending = 'p'
	pfxLine    = 'l'
	pfxCharge  = 'r'
	// pfxQueuedSource: the record a queued event came from.
	pfxQueuedSource = 't'
	pfxMarker       = 'F'
	pfxSource       = 'w'
	// pfxMeterDef: the definition of a meter's state in a period
	// (meterdef.go).
	pfxMeterDef = 'M'
)

var (
	keySeq       = []byte("c")
	keyKeyScheme = []byte("s")
	keyEntMode   = []byte("m")
	keyKeyCount  = []byte("k")
	// keyPartitionCounts: the partition counts the state was built with
	// (processor.go checkPartitionCounts).
	keyPartitionCounts = []byte("N")
	// keyPeriod: the billing period the state was built with
	// (processor.go checkPeriod).
	keyPeriod = []byte("P")
	// keyMeterDefs: the state records its meters' definitions
	// (meterdef.go).
	keyMeterDefs = []byte("d")
)

// entModeOn is keyEntMode's value: entitlements on, and the Ledger's
// state in its layout of one Account per customer. Any other value (the
// earlier "entitlements": a key per grant state, per meter and period and
// per overdraft) is refused (checkEntMode).
const entModeOn = "entitlements:accounts"

func periodKey(prefix byte, start int64, rest ...[]byte) []byte {
	k := make([]byte, 9, 9+32)
	k[0] = prefix
	binary.BigEndian.PutUint64(k[1:], uint64(start))
	for _, r := range rest {
		k = append(k, r...)
	}
	return k
}

// aggState is an aggregate's working state.
type aggState struct {
	Revision int64
	Value    int64
	Count    int64
	FirstET  int64
	LastET   int64
	LatestET int64  // LATEST: event_time of Value
	LatestID string // LATEST: tie-break between equal event times
}

func (s *aggState) encode() []byte { return s.appendTo(make([]byte, 0, 48+len(s.LatestID))) }

// appendTo appends the encoded state to b.
func (s *aggState) appendTo(b []byte) []byte {
	b = binary.AppendVarint(b, s.Revision)
	b = binary.AppendVarint(b, s.Value)
	b = binary.AppendVarint(b, s.Count)
	b = binary.AppendVarint(b, s.FirstET)
	b = binary.AppendVarint(b, s.LastET)
	b = binary.AppendVarint(b, s.LatestET)
	return append(b, s.LatestID...)
}

func decodeState(b []byte) (*aggState, error) {
	var vals [6]int64
	b, ok := readVarints(b, vals[:])
	if !ok {
		return nil, errors.New("aggregator: corrupt aggregate state")
	}
	return &aggState{Revision: vals[0], Value: vals[1], Count: vals[2], FirstET: vals[3], LastET: vals[4],
		LatestET: vals[5], LatestID: string(b)}, nil
}

// readVarints decodes len(vals) varints from the front of b into vals and
// returns the rest of b; ok is false if b ends early or holds a bad varint.
func readVarints(b []byte, vals []int64) (rest []byte, ok bool) {
	for i := range vals {
		v, n := binary.Varint(b)
		if n <= 0 {
			return b, false
		}
		vals[i], b = v, b[n:]
	}
	return b, true
}

// appendAggKey appends the aggregate key K of e: the framed customer,
// meter and group name/value pairs (a property given twice groups under its
// last value; a missing one under "").
func appendAggKey(dst []byte, e *schemas.DedupedEvent, m *Meter) []byte {
	dst = appendFramed(dst, e.CustomerID)
	dst = appendFramed(dst, e.Meter)
	for _, g := range m.GroupBy {
		v := ""
		for _, p := range e.Properties {
			if p.Name == g {
				v = p.Value
			}
		}
		dst = appendFramed(dst, g)
		dst = appendFramed(dst, v)
	}
	return dst
}

// appendFramed is schemas.AppendFramed of one part, for a part in a string
// or in bytes.
func appendFramed[T string | []byte](dst []byte, part T) []byte {
	dst = strconv.AppendInt(dst, int64(len(part)), 10)
	dst = append(dst, ':')
	return append(dst, part...)
}

func groupOf(parts []string) []schemas.Property {
	var g []schemas.Property
	for i := 2; i+1 < len(parts); i += 2 {
		g = append(g, schemas.Property{Name: parts[i], Value: parts[i+1]})
	}
	return g
}
