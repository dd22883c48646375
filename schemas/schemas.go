// Package schemas holds Meterline's wire contract: the Avro schemas of every
// topic (embedded *.avsc files, the single source of truth), their Go types,
// the single-object codec, the canonical event identity key and the Kafka
// partitioner that places every copy of an event in one partition.
//
// It is imported by services that produce usage, so it is not internal.
package schemas

import (
	"bytes"
	"embed"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"
	"sync"

	"github.com/hamba/avro/v2"
)

//go:embed *.avsc history/*.avsc
var files embed.FS

// Kind names one message type.
type Kind uint8

// The message kinds, one per .avsc file.
const (
	KindUsageEvent Kind = iota + 1
	KindTick
	KindDedupedEvent
	KindWatermark
	KindDuplicate
	KindRejected
	KindAggregate
	KindAdjustment
	KindEntitlements
	KindRateCard
	KindBalance
)

var kindNames = [...]string{
	KindUsageEvent:   "UsageEvent",
	KindTick:         "Tick",
	KindDedupedEvent: "DedupedEvent",
	KindWatermark:    "Watermark",
	KindDuplicate:    "Duplicate",
	KindRejected:     "Rejected",
	KindAggregate:    "Aggregate",
	KindAdjustment:   "Adjustment",
	KindEntitlements: "Entitlements",
	KindRateCard:     "RateCard",
	KindBalance:      "Balance",
}

func (k Kind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// schemaFiles lists the current schemas in parse order: a file may use a
// named type (Property, OnLimit) that an earlier file defines.
var schemaFiles = []struct {
	kind Kind
	file string
}{
	{KindUsageEvent, "usage_event.avsc"},
	{KindTick, "tick.avsc"},
	{KindDedupedEvent, "deduped_event.avsc"},
	{KindWatermark, "watermark.avsc"},
	{KindDuplicate, "duplicate.avsc"},
	{KindRejected, "rejected.avsc"},
	{KindAggregate, "aggregate.avsc"},
	{KindAdjustment, "adjustment.avsc"},
	{KindEntitlements, "entitlements.avsc"},
	{KindRateCard, "rate_card.avsc"},
	{KindBalance, "balance.avsc"}, // uses OnLimit and OverdraftPolicy of entitlements.avsc
}

// historyFiles lists schemas that were once written and may still be on a
// topic. Each is resolved against the current schema of its kind, following
// Avro's schema-resolution rules, so old messages keep decoding.
var historyFiles = []struct {
	kind Kind
	file string
}{
	{KindUsageEvent, "history/usage_event.v0.avsc"},
	{KindWatermark, "history/watermark.v0.avsc"},
	{KindWatermark, "history/watermark.v1.avsc"},
	{KindRejected, "history/rejected.v0.avsc"},
	{KindBalance, "history/balance.v0.avsc"},
}

// Single-object encoding (Avro spec): the two marker bytes, then the
// writer schema's CRC-64-AVRO fingerprint, little-endian, then the body.
const (
	magic0     = 0xC3
	magic1     = 0x01
	headerSize = 10
)

// Decoding limits. A UsageEvent is far smaller than these; they only stop a
// hostile or corrupt message from allocating without bound.
const (
	maxByteSlice  = 1 << 20
	maxSliceAlloc = 1 << 16
)

// ErrUndecodable is returned (wrapped) when bytes are not a single-object
// encoded Avro message, or its body does not decode with its schema. It maps
// to the rejection reason "undecodable".
var ErrUndecodable = errors.New("undecodable")

// ErrUnknownSchema is returned (wrapped) when a message is single-object
// encoded but its fingerprint names no schema this binary knows. It maps to
// the rejection reason "unknown_schema".
var ErrUnknownSchema = errors.New("unknown schema")

type writerSchema struct {
	kind   Kind
	schema avro.Schema // resolved against the current reader schema when historical
	fp     uint64
	// current is set for the current schema of a kind (not a history
	// version): the hand-written decoders in fast.go read only those.
	current bool
	// writer is the schema as written (schema is resolved from it), which
	// checkBody reads a body by before hamba/avro does.
	writer avro.Schema
}

type registry struct {
	current [len(kindNames)]avro.Schema
	headers [len(kindNames)][headerSize]byte
	writers map[uint64]writerSchema
	api     avro.API
}

var (
	regOnce sync.Once
	reg     *registry
	regErr  error
)

func load() (*registry, error) {
	regOnce.Do(func() { reg, regErr = build() })
	return reg, regErr
}

func mustLoad() *registry {
	r, err := load()
	if err != nil {
		// The schemas are embedded and covered by tests; a failure here is a
		// build defect, not a runtime condition.
		panic(err)
	}
	return r
}

func fingerprint(s avro.Schema) (uint64, error) {
	fp, err := s.FingerprintUsing(avro.CRC64AvroLE)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(fp), nil
}

func build() (*registry, error) {
	r := &registry{
		writers: make(map[uint64]writerSchema),
		api: avro.Config{
			MaxByteSliceSize:  maxByteSlice,
			MaxSliceAllocSize: maxSliceAlloc,
		}.Freeze(),
	}
	cache := &avro.SchemaCache{}
	for _, f := range schemaFiles {
		s, err := parseFile(f.file, cache)
		if err != nil {
			return nil, err
		}
		fp, err := fingerprint(s)
		if err != nil {
			return nil, fmt.Errorf("schemas: fingerprint %s: %w", f.file, err)
		}
		if prev, dup := r.writers[fp]; dup {
			return nil, fmt.Errorf("schemas: %s has the fingerprint of %s", f.file, prev.kind)
		}
		r.current[f.kind] = s
		h := &r.headers[f.kind]
		h[0], h[1] = magic0, magic1
		binary.LittleEndian.PutUint64(h[2:], fp)
		r.writers[fp] = writerSchema{kind: f.kind, schema: s, fp: fp, current: true, writer: s}
	}
	compat := avro.NewSchemaCompatibility()
	for _, f := range historyFiles {
		old, err := parseFile(f.file, &avro.SchemaCache{})
		if err != nil {
			return nil, err
		}
		fp, err := fingerprint(old)
		if err != nil {
			return nil, fmt.Errorf("schemas: fingerprint %s: %w", f.file, err)
		}
		resolved, err := compat.Resolve(r.current[f.kind], old)
		if err != nil {
			return nil, fmt.Errorf("schemas: current %s cannot read %s: %w", f.kind, f.file, err)
		}
		if _, dup := r.writers[fp]; dup {
			return nil, fmt.Errorf("schemas: %s repeats a known fingerprint", f.file)
		}
		r.writers[fp] = writerSchema{kind: f.kind, schema: resolved, fp: fp, writer: old}
	}
	return r, nil
}

func parseFile(name string, cache *avro.SchemaCache) (avro.Schema, error) {
	b, err := files.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("schemas: %w", err)
	}
	s, err := avro.ParseBytesWithCache(b, "", cache)
	if err != nil {
		return nil, fmt.Errorf("schemas: parse %s: %w", name, err)
	}
	return s, nil
}

// Schema returns the current Avro schema of a kind.
func Schema(k Kind) avro.Schema { return mustLoad().current[k] }

// Fingerprint returns the CRC-64-AVRO fingerprint of the current schema of
// a kind, as written in the single-object header.
func Fingerprint(k Kind) uint64 {
	return binary.LittleEndian.Uint64(mustLoad().headers[k][2:])
}

// SchemaFiles returns the embedded .avsc sources by file name, the current
// ones and those under history/.
func SchemaFiles() map[string][]byte {
	out := make(map[string][]byte)
	_ = fsWalk(".", func(name string) {
		b, _ := files.ReadFile(name)
		out[name] = b
	})
	return out
}

func fsWalk(dir string, fn func(string)) error {
	ents, err := files.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		p := path.Join(dir, e.Name())
		if e.IsDir() {
			if err := fsWalk(p, fn); err != nil {
				return err
			}
			continue
		}
		fn(p)
	}
	return nil
}

// Message is implemented by the Go type of each schema.
type Message interface {
	Kind() Kind
}

// Encode returns m in single-object encoding.
func Encode(m Message) ([]byte, error) { return AppendEncode(nil, m) }

// AppendEncode appends m in single-object encoding to dst.
func AppendEncode(dst []byte, m Message) ([]byte, error) {
	r, err := load()
	if err != nil {
		return dst, err
	}
	k := m.Kind()
	if k == 0 || int(k) >= len(kindNames) {
		return dst, fmt.Errorf("schemas: encode: unknown kind %d", k)
	}
	if e, ok := m.(*UsageEvent); ok && e != nil {
		// Hand-written, byte-identical to hamba (fast.go).
		if dst == nil {
			dst = make([]byte, 0, UsageEventSizeMax(e))
		}
		return appendUsageEventBody(append(dst, r.headers[k][:]...), e), nil
	}
	if a, ok := m.(*Aggregate); ok {
		// Hand-written, byte-identical to hamba (fast.go).
		out := dst
		if out == nil {
			out = make([]byte, 0, aggregateSizeHint(a))
		}
		out, err := appendAggregateBody(append(out, r.headers[k][:]...), a)
		if err != nil {
			return dst, err
		}
		return out, nil
	}
	if b, ok := m.(*Balance); ok && b != nil && balanceEncodable(b) {
		// Hand-written, byte-identical to hamba (balance.go).
		if dst == nil {
			dst = make([]byte, 0, balanceSizeHint(b))
		}
		return appendBalanceBody(append(dst, r.headers[k][:]...), b), nil
	}
	body, err := r.api.Marshal(r.current[k], m)
	if err != nil {
		return dst, fmt.Errorf("schemas: encode %s: %w", k, err)
	}
	dst = append(dst, r.headers[k][:]...)
	return append(dst, body...), nil
}

// MustEncode is Encode for values built by the program itself (tests,
// generators), where a failure is a programming error.
func MustEncode(m Message) []byte {
	b, err := Encode(m)
	if err != nil {
		panic(err)
	}
	return b
}

// PeekKind reports the kind of a single-object encoded message from its
// header alone, without decoding the body. It returns ErrUndecodable or
// ErrUnknownSchema (wrapped) when the header is not one of ours.
func PeekKind(b []byte) (Kind, error) {
	w, err := header(mustLoad(), b)
	if err != nil {
		return 0, err
	}
	return w.kind, nil
}

func header(r *registry, b []byte) (writerSchema, error) {
	if len(b) < headerSize {
		return writerSchema{}, fmt.Errorf("schemas: %w: %d bytes, shorter than the single-object header", ErrUndecodable, len(b))
	}
	if b[0] != magic0 || b[1] != magic1 {
		return writerSchema{}, fmt.Errorf("schemas: %w: no single-object marker (got %#02x %#02x)", ErrUndecodable, b[0], b[1])
	}
	fp := binary.LittleEndian.Uint64(b[2:headerSize])
	w, ok := r.writers[fp]
	if !ok {
		return writerSchema{}, fmt.Errorf("schemas: %w: fingerprint %016x", ErrUnknownSchema, fp)
	}
	return w, nil
}

// Decode decodes a single-object encoded message into a new value of its
// Go type (*UsageEvent, *Tick, …). Messages written with a historical
// schema are resolved to the current one. Trailing bytes after the body
// are an error. Decode never panics on arbitrary input.
//
// UsageEvent and DedupedEvent written with the current schema are read by
// hand-written decoders (fast.go) that give what hamba/avro gives, faster;
// every other schema is read by hamba/avro.
func Decode(b []byte) (Message, error) {
	r, err := load()
	if err != nil {
		return nil, err
	}
	w, err := header(r, b)
	if err != nil {
		return nil, err
	}
	m := newMessage(w.kind)
	if err := decodeBody(r, w, b[headerSize:], m); err != nil {
		return nil, err
	}
	return m, nil
}

// DecodeInto decodes b into m, which must be a pointer to the Go type of the
// message's kind. A message of another kind is ErrUndecodable. Decode into
// a zero value: a UsageEvent or DedupedEvent of the current schema replaces
// all of m, but hamba/avro (every other schema) reuses m's slices and keeps
// a slice the message leaves empty. On error m is unspecified.
func DecodeInto(b []byte, m Message) error {
	r, err := load()
	if err != nil {
		return err
	}
	w, err := header(r, b)
	if err != nil {
		return err
	}
	if w.kind != m.Kind() {
		return fmt.Errorf("schemas: %w: message is a %s, want %s", ErrUndecodable, w.kind, m.Kind())
	}
	return decodeBody(r, w, b[headerSize:], m)
}

func decodeBody(r *registry, w writerSchema, body []byte, m Message) error {
	if w.current {
		switch v := m.(type) {
		case *UsageEvent:
			return decodeUsageEvent(body, v)
		case *DedupedEvent:
			return decodeDedupedEvent(body, v)
		}
	}
	return decodeBodyHamba(r, w, body, m)
}

// decodeBodyHamba decodes body with hamba/avro: the decoder for every
// schema without a hand-written one, and the reference those are tested
// against.
func decodeBodyHamba(r *registry, w writerSchema, body []byte, m Message) error {
	if err := checkBody(w.kind, w.writer, body); err != nil {
		return err
	}
	return readHamba(r, w, body, m)
}

// readHamba is decodeBodyHamba without checkBody.
func readHamba(r *registry, w writerSchema, body []byte, m Message) (err error) {
	defer func() {
		// hamba/avro does not panic on bad input that we know of; this is a
		// last line of defence so a stage never crashes on a record.
		if p := recover(); p != nil {
			err = fmt.Errorf("schemas: %w: %s: decoder panic: %v", ErrUndecodable, w.kind, p)
		}
	}()
	rd := avro.NewReader(nil, 0, avro.WithReaderConfig(r.api))
	rd.Reset(body)
	rd.ReadVal(w.schema, m)
	if rd.Error != nil {
		return fmt.Errorf("schemas: %w: %s: %v", ErrUndecodable, w.kind, rd.Error)
	}
	var one [1]byte
	rd.Read(one[:])
	if rd.Error == nil {
		return fmt.Errorf("schemas: %w: %s: trailing bytes after the body", ErrUndecodable, w.kind)
	}
	if !errors.Is(rd.Error, io.ErrUnexpectedEOF) && !errors.Is(rd.Error, io.EOF) {
		return fmt.Errorf("schemas: %w: %s: %v", ErrUndecodable, w.kind, rd.Error)
	}
	return nil
}

func newMessage(k Kind) Message {
	switch k {
	case KindUsageEvent:
		return new(UsageEvent)
	case KindTick:
		return new(Tick)
	case KindDedupedEvent:
		return new(DedupedEvent)
	case KindWatermark:
		return new(Watermark)
	case KindDuplicate:
		return new(Duplicate)
	case KindRejected:
		return new(Rejected)
	case KindAggregate:
		return new(Aggregate)
	case KindAdjustment:
		return new(Adjustment)
	case KindEntitlements:
		return new(Entitlements)
	case KindRateCard:
		return new(RateCard)
	case KindBalance:
		return new(Balance)
	}
	return nil
}

// IsSingleObject reports whether b starts with the single-object marker.
func IsSingleObject(b []byte) bool {
	return len(b) >= headerSize && bytes.Equal(b[:2], []byte{magic0, magic1})
}

// Properties converts a map to the sorted Property list the schemas carry.
// A map iterates in random order; the sorted list makes encodings
// byte-identical on every replay. It returns nil for an empty map.
func Properties(m map[string]string) []Property {
	if len(m) == 0 {
		return nil
	}
	out := make([]Property, 0, len(m))
	for k, v := range m {
		out = append(out, Property{Name: k, Value: v})
	}
	slices.SortFunc(out, func(a, b Property) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// PropertyMap converts a Property list back to a map.
func PropertyMap(ps []Property) map[string]string {
	if len(ps) == 0 {
		return nil
	}
	m := make(map[string]string, len(ps))
	for _, p := range ps {
		m[p.Name] = p.Value
	}
	return m
}

// AppendDedupedFromRaw appends the single-object encoding of the
// DedupedEvent made from a UsageEvent message raw and the three fields dedup
// adds, without decoding and re-encoding: DedupedEvent's fields are
// UsageEvent's followed by ingest_time, source_partition and source_offset,
// and an Avro record is its fields' encodings in order (long and int are
// zig-zag varints, as encoding/binary's AppendVarint). It reports false when
// raw was not written with the current UsageEvent schema; encode the value
// instead then.
func AppendDedupedFromRaw(dst, raw []byte, ingestTime int64, partition int32, offset int64) ([]byte, bool) {
	r := mustLoad()
	if len(raw) < headerSize || [headerSize]byte(raw[:headerSize]) != r.headers[KindUsageEvent] {
		return dst, false
	}
	dst = append(dst, r.headers[KindDedupedEvent][:]...)
	dst = append(dst, raw[headerSize:]...)
	dst = binary.AppendVarint(dst, ingestTime)
	dst = binary.AppendVarint(dst, int64(partition))
	return binary.AppendVarint(dst, offset), true
}
