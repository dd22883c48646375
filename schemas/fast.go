package schemas

// Hand-written codecs for the messages on the hot paths: decoding
// UsageEvent (dedup) and DedupedEvent (aggregator) written with the CURRENT
// schema, and encoding UsageEvent (producers, the HTTP ingest) and
// Aggregate. hamba/avro walks a reflected type per
// field; these walk the body directly and allocate once per message for all
// its strings. Every other schema — history versions and the other kinds —
// still goes through hamba.
//
// The contract is that they agree with hamba exactly: a body hamba decodes
// gives the deep-equal value here, a body hamba rejects is rejected here
// (ErrUndecodable), and an Aggregate encodes to the bytes hamba writes.
// fast_test.go checks this on random values and FuzzFastDecode on arbitrary
// bytes. Where hamba's reading rules are loose, these copy them rather than
// tighten them, so the two accept the same bytes:
//   - a long is at most 10 varint bytes, an int at most 5; the bits of the
//     last byte that do not fit are dropped, as hamba drops them;
//   - the byte size after a negative array block count is read but not
//     checked (the spec makes it a hint for skipping);
//   - an array may hold at most maxSliceAlloc items in total, a string at
//     most maxByteSlice bytes (the registry's hamba config).
//
// One deliberate difference: hamba v2.31.0 adds block counts without an
// overflow check, so a count of -2⁶³, or counts whose sum overflows int64,
// give it a slice of negative length — and a following block writes
// outside the slice. These decoders reject such counts (errCountOverflow),
// and so does Decode before hamba reads any other schema with arrays
// (checkBody, blockcheck.go).

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Avro varint limits, as hamba reads them.
const (
	maxLongBytes = 10
	maxIntBytes  = 5
)

// errCountOverflow is wrapped (with ErrUndecodable) when array block counts
// overflow int64 arithmetic: the one class of bodies where hamba does not
// fail cleanly (see the file comment). Tests use it to keep such bodies away
// from hamba.
var errCountOverflow = errors.New("array block count overflows")

// bodyDecoder reads an Avro binary body. The body is copied into one string
// up front and every decoded string is a substring of it: one allocation
// per message instead of one per field. A string kept keeps the whole body
// alive (a record is at most MaxEventBytes; hamba's reader similarly keeps
// a 1 KiB slab per message behind its strings).
type bodyDecoder struct {
	s string
	i int

	// The first failure: which field, why, and where. Decoding stops there.
	failed bool
	field  string
	why    string
	at     int
	cause  error
}

func (d *bodyDecoder) fail(field, why string) {
	if !d.failed {
		d.failed, d.field, d.why, d.at = true, field, why, d.i
	}
}

func (d *bodyDecoder) err(k Kind) error {
	if d.failed {
		if d.cause != nil {
			return fmt.Errorf("schemas: %w: %s: %s: %s at body offset %d: %w", ErrUndecodable, k, d.field, d.why, d.at, d.cause)
		}
		return fmt.Errorf("schemas: %w: %s: %s: %s at body offset %d", ErrUndecodable, k, d.field, d.why, d.at)
	}
	if d.i != len(d.s) {
		return fmt.Errorf("schemas: %w: %s: trailing bytes after the body (%d of %d used)", ErrUndecodable, k, d.i, len(d.s))
	}
	return nil
}

// long reads a zig-zag varint long.
func (d *bodyDecoder) long(field string) int64 {
	if d.failed {
		return 0
	}
	s, i := d.s, d.i
	if i < len(s) && s[i] < 0x80 { // one byte: most lengths and small numbers
		d.i = i + 1
		v := uint64(s[i])
		return int64(v>>1) ^ -int64(v&1)
	}
	var v uint64
	for n := 0; n < maxLongBytes; n++ {
		if i+n >= len(s) {
			d.fail(field, "truncated long")
			return 0
		}
		b := s[i+n]
		v |= uint64(b&0x7f) << (7 * n)
		if b < 0x80 {
			d.i = i + n + 1
			return int64(v>>1) ^ -int64(v&1)
		}
	}
	d.fail(field, "long longer than 10 bytes")
	return 0
}

// int reads a zig-zag varint int.
func (d *bodyDecoder) int(field string) int32 {
	if d.failed {
		return 0
	}
	s, i := d.s, d.i
	var v uint32
	for n := 0; n < maxIntBytes; n++ {
		if i+n >= len(s) {
			d.fail(field, "truncated int")
			return 0
		}
		b := s[i+n]
		v |= uint32(b&0x7f) << (7 * n)
		if b < 0x80 {
			d.i = i + n + 1
			return int32(v>>1) ^ -int32(v&1)
		}
	}
	d.fail(field, "int longer than 5 bytes")
	return 0
}

// str reads a length-prefixed string; no UTF-8 check, as hamba.
func (d *bodyDecoder) str(field string) string {
	n := d.long(field)
	switch {
	case d.failed:
		return ""
	case n < 0:
		d.fail(field, fmt.Sprintf("negative string length %d", n))
		return ""
	case n > maxByteSlice:
		d.fail(field, fmt.Sprintf("string length %d over the limit %d", n, maxByteSlice))
		return ""
	case n > int64(len(d.s)-d.i):
		d.fail(field, fmt.Sprintf("string length %d beyond the %d bytes left", n, len(d.s)-d.i))
		return ""
	}
	v := d.s[d.i : d.i+int(n)]
	d.i += int(n)
	return v
}

// properties reads the array of Property of the field "properties", in
// Avro block encoding: blocks of a count and that many items, ended by a
// count of 0; a negative count is followed by the block's byte size. An
// empty array decodes as an empty, non-nil slice, as hamba decodes it into a
// nil field.
func (d *bodyDecoder) properties() []Property {
	const field = "properties"
	var ps []Property
	total := int64(0)
	for {
		c := d.blockCount(field, total)
		if d.failed {
			return nil
		}
		if c == 0 {
			break
		}
		total += c
		if ps == nil {
			// An item takes at least 2 bytes; a count larger than the bytes
			// left fails below, so do not allocate for it.
			ps = make([]Property, 0, min(c, int64(len(d.s)-d.i)/2))
		}
		for ; c > 0; c-- {
			name := d.str("properties.name")
			value := d.str("properties.value")
			if d.failed {
				return nil
			}
			ps = append(ps, Property{Name: name, Value: value})
		}
	}
	if ps == nil {
		ps = []Property{}
	}
	return ps
}

// blockCount reads the header of the next block of an array of which
// total items were read before it: its count of items, 0 at the end of
// the array, or when reading failed (d.failed). A negative count is
// followed by the block's byte size; the counts of an array may add up to
// maxSliceAlloc.
func (d *bodyDecoder) blockCount(field string, total int64) int64 {
	c := d.long(field)
	if d.failed || c == 0 {
		return 0
	}
	if c < 0 {
		c = -c
		d.long(field) // the block's byte size: a hint for skipping, unchecked
		if d.failed {
			return 0
		}
	}
	if c < 0 || c > math.MaxInt64-total {
		d.fail(field, "block count")
		d.cause = errCountOverflow
		return 0
	}
	if c > maxSliceAlloc-total {
		d.fail(field, fmt.Sprintf("%d items, more than the limit %d", total+c, maxSliceAlloc))
		return 0
	}
	return c
}

// usageFields reads the fields UsageEvent and DedupedEvent begin with.
func (d *bodyDecoder) usageFields(e *UsageEvent) {
	e.EventID = d.str("event_id")
	e.CustomerID = d.str("customer_id")
	e.Meter = d.str("meter")
	e.Quantity = d.long("quantity")
	e.EventTime = d.long("event_time")
	e.Source = d.str("source")
	e.Properties = d.properties()
}

// decodeUsageEvent decodes a body written with the current UsageEvent
// schema into e, replacing all of e. On error e is unspecified.
func decodeUsageEvent(body []byte, e *UsageEvent) error {
	d := bodyDecoder{s: string(body)}
	d.usageFields(e)
	return d.err(KindUsageEvent)
}

// DecodeUsageOr decodes b as Decode does, except that a UsageEvent written
// with the current schema (nearly every record dedup reads) is decoded into
// e, which is returned, instead of a new value: a reused e saves an
// allocation per record. It replaces all of e; e is untouched when b is
// another message, which is then returned as Decode returns it. Errors are
// Decode's.
func DecodeUsageOr(b []byte, e *UsageEvent) (Message, error) {
	r, err := load()
	if err != nil {
		return nil, err
	}
	if w, err := header(r, b); err == nil && w.kind == KindUsageEvent && w.current {
		if err := decodeUsageEvent(b[headerSize:], e); err != nil {
			return nil, err
		}
		return e, nil
	}
	return Decode(b) // another message or a bad header: Decode's answer
}

// decodeDedupedEvent decodes a body written with the current DedupedEvent
// schema into e, replacing all of e. On error e is unspecified.
func decodeDedupedEvent(body []byte, e *DedupedEvent) error {
	d := bodyDecoder{s: string(body)}
	var u UsageEvent
	d.usageFields(&u)
	ingest := d.long("ingest_time")
	partition := d.int("source_partition")
	offset := d.long("source_offset")
	*e = DedupedEvent{
		EventID: u.EventID, CustomerID: u.CustomerID, Meter: u.Meter, Quantity: u.Quantity,
		EventTime: u.EventTime, Source: u.Source, Properties: u.Properties,
		IngestTime: ingest, SourcePartition: partition, SourceOffset: offset,
	}
	return d.err(KindDedupedEvent)
}

// hambaBlockLength is the number of items hamba writes per array block
// (its Config.BlockLength default, which the registry does not change).
const hambaBlockLength = 100

// appendAggregateBody appends the Avro body of a, byte for byte what hamba
// writes. An unknown Status is an error, as in hamba; dst is then returned
// unchanged.
func appendAggregateBody(dst []byte, a *Aggregate) ([]byte, error) {
	if _, err := aggregateStatus(a.Status); err != nil {
		return dst, err
	}
	out, err := appendAggregateTail(appendAggregateHeadFields(dst, a), a)
	if err != nil {
		return dst, err
	}
	return out, nil
}

func aggregateStatus(s AggregateStatus) (int64, error) {
	switch s {
	case StatusOpen:
		return 0, nil
	case StatusFinal:
		return 1, nil
	}
	return 0, fmt.Errorf("schemas: encode %s: status: unknown enum symbol %q", KindAggregate, s)
}

// appendAggregateHeadFields appends the fields of an Aggregate body that
// name the aggregate and its period: customer_id … period_end.
func appendAggregateHeadFields(dst []byte, a *Aggregate) []byte {
	dst = appendString(dst, a.CustomerID)
	dst = appendString(dst, a.Meter)
	dst = appendProperties(dst, a.Group)
	dst = appendString(dst, a.Aggregation)
	dst = binary.AppendVarint(dst, a.PeriodStart)
	return binary.AppendVarint(dst, a.PeriodEnd)
}

// appendAggregateTail appends the fields that change from one revision to
// the next: revision … updated_at. On error dst is returned unchanged.
func appendAggregateTail(dst []byte, a *Aggregate) ([]byte, error) {
	status, err := aggregateStatus(a.Status)
	if err != nil {
		return dst, err
	}
	dst = binary.AppendVarint(dst, a.Revision)
	dst = binary.AppendVarint(dst, status)
	dst = binary.AppendVarint(dst, a.Value)
	dst = binary.AppendVarint(dst, a.EventCount)
	dst = binary.AppendVarint(dst, a.FirstEventTime)
	dst = binary.AppendVarint(dst, a.LastEventTime)
	return binary.AppendVarint(dst, a.UpdatedAt), nil
}

// AppendAggregateHead appends the start of a's single-object encoding: the
// header and the fields that stay the same across an aggregate's revisions
// (customer_id, meter, group, aggregation, period_start, period_end).
// AppendAggregateTail completes it. A stage that emits many revisions of
// one aggregate encodes the head once and copies it:
//
//	head := AppendAggregateHead(nil, a)
//	msg, err := AppendAggregateTail(append(buf, head...), a)
//
// gives the bytes Encode(a) gives, for any a whose head fields equal those
// the head was made from.
func AppendAggregateHead(dst []byte, a *Aggregate) []byte {
	dst = append(dst, mustLoad().headers[KindAggregate][:]...)
	return appendAggregateHeadFields(dst, a)
}

// AppendAggregateTail appends the fields of a that follow its head
// (revision, status, value, event_count, first_event_time, last_event_time,
// updated_at). An unknown Status is an error, as in Encode; dst is then
// returned unchanged.
func AppendAggregateTail(dst []byte, a *Aggregate) ([]byte, error) {
	return appendAggregateTail(dst, a)
}

// AggregateTailMax is the most bytes AppendAggregateTail appends.
const AggregateTailMax = 7 * maxLongBytes

// AppendDuplicate appends the single-object encoding of d to dst, byte for
// byte what Encode writes (hamba), without reflection: dedup writes one per
// dropped copy.
func AppendDuplicate(dst []byte, d *Duplicate) []byte {
	if dst == nil {
		dst = make([]byte, 0, headerSize+len(d.EventID)+len(d.CustomerID)+len(d.Meter)+len(d.Source)+4+1+8*maxLongBytes)
	}
	dst = append(dst, mustLoad().headers[KindDuplicate][:]...)
	dst = appendString(dst, d.EventID)
	dst = appendString(dst, d.CustomerID)
	dst = appendString(dst, d.Meter)
	dst = appendString(dst, d.Source)
	dst = appendBool(dst, d.Conflict)
	dst = binary.AppendVarint(dst, d.Quantity)
	dst = binary.AppendVarint(dst, d.EventTime)
	dst = binary.AppendVarint(dst, int64(d.OriginalPartition))
	dst = binary.AppendVarint(dst, d.OriginalOffset)
	dst = binary.AppendVarint(dst, d.OriginalArrival)
	dst = binary.AppendVarint(dst, int64(d.DuplicatePartition))
	dst = binary.AppendVarint(dst, d.DuplicateOffset)
	return binary.AppendVarint(dst, d.DuplicateArrival)
}

// aggregateSizeHint is a capacity that holds a typical Aggregate message in
// one allocation.
func aggregateSizeHint(a *Aggregate) int {
	n := headerSize + 3*maxLongBytes + len(a.CustomerID) + len(a.Meter) + len(a.Aggregation) + 10*maxLongBytes
	for _, p := range a.Group {
		n += 4 + len(p.Name) + len(p.Value)
	}
	return n
}

// AppendUsageEvent appends the single-object encoding of e to dst, byte for
// byte what Encode writes (hamba), without reflection: every producer and
// the HTTP ingest write one per usage event. It does not validate e.
func AppendUsageEvent(dst []byte, e *UsageEvent) []byte {
	if dst == nil {
		dst = make([]byte, 0, UsageEventSizeMax(e))
	}
	dst = append(dst, mustLoad().headers[KindUsageEvent][:]...)
	return appendUsageEventBody(dst, e)
}

// appendUsageEventBody appends the Avro body of e.
func appendUsageEventBody(dst []byte, e *UsageEvent) []byte {
	dst = appendString(dst, e.EventID)
	dst = appendString(dst, e.CustomerID)
	dst = appendString(dst, e.Meter)
	dst = binary.AppendVarint(dst, e.Quantity)
	dst = binary.AppendVarint(dst, e.EventTime)
	dst = appendString(dst, e.Source)
	return appendProperties(dst, e.Properties)
}

// UsageEventSizeMax is the most bytes AppendUsageEvent appends for e: a
// capacity that holds its encoding in one allocation.
func UsageEventSizeMax(e *UsageEvent) int {
	n := headerSize + 6*maxLongBytes + len(e.EventID) + len(e.CustomerID) + len(e.Meter) + len(e.Source)
	for _, p := range e.Properties {
		n += 2*maxLongBytes + len(p.Name) + len(p.Value)
	}
	// Each block of hambaBlockLength items adds a count and a byte size.
	return n + (len(e.Properties)/hambaBlockLength+1)*2*maxLongBytes
}

// appendBool appends an Avro boolean: one byte, 1 or 0.
func appendBool(dst []byte, b bool) []byte {
	if b {
		return append(dst, 1)
	}
	return append(dst, 0)
}

// appendString appends an Avro string: its length as a long, then its bytes.
func appendString(dst []byte, s string) []byte {
	dst = binary.AppendVarint(dst, int64(len(s)))
	return append(dst, s...)
}

// appendProperties appends an array of Property as hamba does: blocks of
// hambaBlockLength items, each headed by the negated count and the block's
// byte size, then a count of 0.
func appendProperties(dst []byte, ps []Property) []byte {
	for len(ps) > 0 {
		block := ps[:min(len(ps), hambaBlockLength)]
		ps = ps[len(block):]
		size := 0
		for _, p := range block {
			size += varintLen(int64(len(p.Name))) + len(p.Name) + varintLen(int64(len(p.Value))) + len(p.Value)
		}
		dst = binary.AppendVarint(dst, -int64(len(block)))
		dst = binary.AppendVarint(dst, int64(size))
		for _, p := range block {
			dst = appendString(dst, p.Name)
			dst = appendString(dst, p.Value)
		}
	}
	return append(dst, 0)
}

// varintLen is the length of the zig-zag varint encoding of v.
func varintLen(v int64) int {
	u := uint64(v<<1) ^ uint64(v>>63)
	n := 1
	for u >= 0x80 {
		u >>= 7
		n++
	}
	return n
}
