package schemas

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/kgo"
)

var update = flag.Bool("update", false, "rewrite golden files in testdata/")

// samples has one fully populated value of every kind. The golden files in
// testdata/golden pin their encodings.
func samples() map[string]Message {
	props := []Property{{Name: "model", Value: "m1"}, {Name: "region", Value: "eu-west-1"}}
	return map[string]Message{
		"usage_event": &UsageEvent{EventID: "req-42", CustomerID: "acme", Meter: "api_calls", Quantity: 3,
			EventTime: 1795003200250, Source: "api-gateway", Properties: props},
		"tick": &Tick{InstanceID: "meterline-dedup-a"},
		"deduped_event": &DedupedEvent{EventID: "req-42", CustomerID: "acme", Meter: "api_calls", Quantity: 3,
			EventTime: 1795003200250, Source: "api-gateway", Properties: props, IngestTime: 1795003201000,
			SourcePartition: 7, SourceOffset: 123456},
		"watermark": &Watermark{SourcePartition: 3, SourcePartitions: 16, Watermark: 1795003205000, WindowMs: 3024000000,
			BucketMs: 86400000, SkewMs: 3600000},
		"duplicate": &Duplicate{EventID: "req-42", CustomerID: "acme", Meter: "api_calls", Source: "api-gateway",
			Conflict: true, Quantity: 4, EventTime: 1795003200250, OriginalPartition: 7, OriginalOffset: 123456,
			OriginalArrival: 1795003201000, DuplicatePartition: 7, DuplicateOffset: 123999, DuplicateArrival: 1795003260000},
		"rejected": &Rejected{Reason: ReasonInvalid, Detail: "quantity: negative (-1)", Stage: "dedup",
			SourceTopic: "usage.events", SourcePartition: 2, SourceOffset: 99, SourceTimestamp: 1795003201000,
			CustomerID: "acme", Meter: "api_calls", EventID: "req-43", RawKey: []byte("4:acme9:api_calls6:req-43"),
			RawValue: []byte{0xC3, 0x01, 0xff}, RawKeyLength: 25, RawKeySHA256: sha256Of("4:acme9:api_calls6:req-43"),
			RawValueLength: 3, RawValueSHA256: sha256Of("\xC3\x01\xff")},
		"aggregate": &Aggregate{CustomerID: "acme", Meter: "api_calls", Group: []Property{{Name: "model", Value: "m1"}},
			Aggregation: "SUM", PeriodStart: 1793491200000, PeriodEnd: 1796083200000, Revision: 12, Status: StatusFinal,
			Value: 1000, EventCount: 42, FirstEventTime: 1793491200000, LastEventTime: 1796083199999, UpdatedAt: 1796256000001},
		"adjustment": &Adjustment{EventID: "req-9", CustomerID: "acme", Meter: "api_calls", Group: []Property{{Name: "model", Value: "m2"}}, Aggregation: "SUM",
			OriginalPeriodStart: 1793491200000, OriginalPeriodEnd: 1796083200000, BookedPeriodStart: 1796083200000,
			BookedPeriodEnd: 1798761600000, Delta: 5, Quantity: 5, EventTime: 1796083100000, IngestTime: 1796400000000},
		"entitlements": &Entitlements{CustomerID: "acme", Plan: "free", EffectiveFrom: 1795003200000, Unmetered: false,
			Caps: []Cap{{Meter: "api_calls", Limit: 1000, OnLimit: OnLimitReject}, {Meter: "tokens", Limit: 5_000_000, OnLimit: OnLimitAllow}},
			Grants: []Grant{{ID: "promo", Amount: 2_000_000, Priority: 1, EffectiveFrom: 1793491200000, ExpiresAt: 1796083200000},
				{ID: "welcome", Amount: 500_000, Priority: 2}},
			Overdraft: Overdraft{Policy: OverdraftAllow, Limit: 1_000_000}},
		"rate_card": &RateCard{Versions: []RateVersion{
			{EffectiveFrom: 1793491200000, Rates: []Rate{{Meter: "api_calls", MicroCredits: 1000, PerUnits: 1}, {Meter: "tokens", MicroCredits: 15, PerUnits: 1000}}},
			{EffectiveFrom: 1794700800000, Rates: []Rate{{Meter: "api_calls", MicroCredits: 1200, PerUnits: 1}}}}},
		"balance": &Balance{CustomerID: "acme", Plan: "free", Revision: 7, UpdatedAt: 1795003260000,
			PeriodStart: 1793491200000, PeriodEnd: 1796083200000,
			Meters: []MeterBalance{{Meter: "api_calls", Usage: 812, Limit: 1000, OnLimit: OnLimitReject}},
			Grants: []GrantBalance{{ID: "promo", Priority: 1, EffectiveFrom: 1793491200000, ExpiresAt: 1796083200000,
				Amount: 2_000_000, Consumed: 812_000, Remaining: 1_188_000}},
			OverdraftPolicy: OverdraftDeny, Overdrawn: 0, CapsUntil: 1795010400000},
	}
}

func TestRoundTrip(t *testing.T) {
	for name, m := range samples() {
		t.Run(name, func(t *testing.T) {
			b, err := Encode(m)
			if err != nil {
				t.Fatal(err)
			}
			if !IsSingleObject(b) {
				t.Fatalf("no single-object marker: % x", b[:4])
			}
			if got := binary.LittleEndian.Uint64(b[2:10]); got != Fingerprint(m.Kind()) {
				t.Fatalf("header fingerprint %x, want %x", got, Fingerprint(m.Kind()))
			}
			k, err := PeekKind(b)
			if err != nil || k != m.Kind() {
				t.Fatalf("PeekKind = %v, %v; want %v", k, err, m.Kind())
			}
			got, err := Decode(b)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, m) {
				t.Fatalf("round trip:\n got %#v\nwant %#v", got, m)
			}
			into := newMessage(m.Kind())
			if err := DecodeInto(b, into); err != nil || !reflect.DeepEqual(into, m) {
				t.Fatalf("DecodeInto = %#v, %v", into, err)
			}
			again, _ := Encode(got)
			if !bytes.Equal(again, b) {
				t.Fatal("re-encoding a decoded message changed its bytes")
			}
		})
	}
}

func TestGoldenBytes(t *testing.T) {
	for name, m := range samples() {
		t.Run(name, func(t *testing.T) {
			b := MustEncode(m)
			path := filepath.Join("testdata", "golden", name+".hex")
			if *update {
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(hex.EncodeToString(b)+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./schemas -update once to create it)", err)
			}
			if got := hex.EncodeToString(b); got != string(bytes.TrimSpace(want)) {
				t.Fatalf("encoding of %s changed; a wire-format change needs a new schema version\n got %s\nwant %s", name, got, want)
			}
		})
	}
}

// TestOldSchemaFixture reads a message written with the first UsageEvent
// schema (history/usage_event.v0.avsc, no source and no properties) with
// the current one: the new fields take their defaults.
func TestOldSchemaFixture(t *testing.T) {
	path := filepath.Join("testdata", "usage_event.v0.hex")
	if *update {
		writeOldFixture(t, "history/usage_event.v0.avsc", path, map[string]any{"event_id": "req-1", "customer_id": "acme",
			"meter": "api_calls", "quantity": int64(7), "event_time": int64(1795003200000)})
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b, err := hex.DecodeString(string(bytes.TrimSpace(raw)))
	if err != nil {
		t.Fatal(err)
	}
	if binary.LittleEndian.Uint64(b[2:10]) == Fingerprint(KindUsageEvent) {
		t.Fatal("fixture carries the current fingerprint; it must be written with the old schema")
	}
	m, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	want := &UsageEvent{EventID: "req-1", CustomerID: "acme", Meter: "api_calls", Quantity: 7, EventTime: 1795003200000}
	got := m.(*UsageEvent)
	if len(got.Properties) == 0 {
		got.Properties = nil // the default [] decodes as an empty slice
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("old fixture:\n got %#v\nwant %#v", got, want)
	}
}

// TestOldWatermarkFixture reads Watermarks written with the earlier
// schemas with the current one: the fields added since are 0, not stated.
// v0 (history/watermark.v0.avsc) is from before window_ms, v1
// (history/watermark.v1.avsc) from before bucket_ms and skew_ms.
func TestOldWatermarkFixture(t *testing.T) {
	for _, c := range []struct {
		version string
		fields  map[string]any
		want    *Watermark
	}{
		{"v0", map[string]any{"source_partition": int32(3), "source_partitions": int32(16), "watermark": int64(1795003205000)},
			&Watermark{SourcePartition: 3, SourcePartitions: 16, Watermark: 1795003205000}},
		{"v1", map[string]any{"source_partition": int32(3), "source_partitions": int32(16), "watermark": int64(1795003205000),
			"window_ms": int64(3024000000)},
			&Watermark{SourcePartition: 3, SourcePartitions: 16, Watermark: 1795003205000, WindowMs: 3024000000}},
	} {
		t.Run(c.version, func(t *testing.T) {
			path := filepath.Join("testdata", "watermark."+c.version+".hex")
			if *update {
				writeOldFixture(t, "history/watermark."+c.version+".avsc", path, c.fields)
			}
			b, err := hex.DecodeString(strings.TrimSpace(string(mustReadFile(t, path))))
			if err != nil {
				t.Fatal(err)
			}
			if binary.LittleEndian.Uint64(b[2:10]) == Fingerprint(KindWatermark) {
				t.Fatal("fixture carries the current fingerprint; it must be written with the old schema")
			}
			if k, err := PeekKind(b); err != nil || k != KindWatermark {
				t.Fatalf("PeekKind = %v, %v; want Watermark (the sink skips watermark records of every version)", k, err)
			}
			for name, dec := range map[string]func() (Message, error){
				"Decode":     func() (Message, error) { return Decode(b) },
				"DecodeInto": func() (Message, error) { var w Watermark; return &w, DecodeInto(b, &w) },
			} {
				m, err := dec()
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				if !reflect.DeepEqual(m, c.want) {
					t.Fatalf("%s of the old fixture:\n got %#v\nwant %#v", name, m, c.want)
				}
			}
		})
	}
}

// writeOldFixture writes to path, in hex, the single-object encoding of
// fields with the history schema file (go test ./schemas -update).
func writeOldFixture(t *testing.T, schemaFile, path string, fields map[string]any) {
	t.Helper()
	old, err := avro.ParseBytes(mustRead(t, schemaFile))
	if err != nil {
		t.Fatal(err)
	}
	body, err := avro.Marshal(old, fields)
	if err != nil {
		t.Fatal(err)
	}
	fp, _ := old.FingerprintUsing(avro.CRC64AvroLE)
	msg := append(append([]byte{0xC3, 0x01}, fp...), body...)
	if err := os.WriteFile(path, []byte(hex.EncodeToString(msg)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func mustRead(t *testing.T, name string) []byte {
	t.Helper()
	b, err := files.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDecodeErrors(t *testing.T) {
	good := MustEncode(&Tick{InstanceID: "x"})
	unknown := append([]byte{}, good...)
	unknown[5] ^= 0xff
	cases := []struct {
		name string
		b    []byte
		want error
	}{
		{"empty", nil, ErrUndecodable},
		{"json", []byte(`{"event_id":"x","customer_id":"a","meter":"m","quantity":1}`), ErrUndecodable},
		{"short header", good[:5], ErrUndecodable},
		{"unknown fingerprint", unknown, ErrUnknownSchema},
		{"truncated body", MustEncode(&UsageEvent{EventID: "e", CustomerID: "c", Meter: "m"})[:12], ErrUndecodable},
		{"trailing bytes", append(append([]byte{}, good...), 0), ErrUndecodable},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Decode(c.b)
			if !errors.Is(err, c.want) {
				t.Fatalf("Decode = %v, want %v", err, c.want)
			}
		})
	}
	if err := DecodeInto(good, new(UsageEvent)); !errors.Is(err, ErrUndecodable) {
		t.Fatalf("DecodeInto of another kind = %v", err)
	}
}

func TestSchemasParseAndAreDistinct(t *testing.T) {
	seen := map[uint64]Kind{}
	for k := KindUsageEvent; int(k) < len(kindNames); k++ {
		if Schema(k) == nil {
			t.Fatalf("%v has no schema", k)
		}
		fp := Fingerprint(k)
		if other, dup := seen[fp]; dup {
			t.Fatalf("%v and %v share fingerprint %x", k, other, fp)
		}
		seen[fp] = k
	}
	if len(SchemaFiles()) != len(schemaFiles)+len(historyFiles) {
		t.Fatalf("SchemaFiles lists %d files", len(SchemaFiles()))
	}
}

type vectors struct {
	Murmur2 map[string]int32 `json:"murmur2_kafka_vectors"`
	Keys    []struct {
		CustomerID  string `json:"customer_id"`
		Meter       string `json:"meter"`
		EventID     string `json:"event_id"`
		Key         string `json:"key"`
		Murmur2     int32  `json:"murmur2"`
		Partition3  int32  `json:"partition_3"`
		Partition16 int32  `json:"partition_16"`
	} `json:"keys"`
	EventIDs []struct {
		Parts   []string `json:"parts"`
		Framed  string   `json:"framed"`
		EventID string   `json:"event_id"`
	} `json:"event_ids"`
}

func loadVectors(t testing.TB) vectors {
	b, err := os.ReadFile(filepath.Join("testdata", "identity_vectors.json"))
	if err != nil {
		t.Fatal(err)
	}
	var v vectors
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func TestIdentityVectors(t *testing.T) {
	v := loadVectors(t)
	for in, want := range v.Murmur2 {
		if got := Murmur2([]byte(in)); got != want {
			t.Errorf("Murmur2(%q) = %d, want %d (Kafka's value)", in, got, want)
		}
	}
	// franz-go's default partitioner must agree with Partition, since
	// producers use it and dedup checks placement with Partition.
	part := kgo.StickyKeyPartitioner(nil)
	for _, k := range v.Keys {
		id := Identity{CustomerID: k.CustomerID, Meter: k.Meter, EventID: k.EventID}
		if got := string(id.Key()); got != k.Key {
			t.Errorf("Key(%v) = %q, want %q", id, got, k.Key)
		}
		back, err := ParseKey([]byte(k.Key))
		if err != nil || back != id {
			t.Errorf("ParseKey(%q) = %v, %v", k.Key, back, err)
		}
		if got := Murmur2(id.Key()); got != k.Murmur2 {
			t.Errorf("Murmur2(%q) = %d, want %d", k.Key, got, k.Murmur2)
		}
		for n, want := range map[int32]int32{3: k.Partition3, 16: k.Partition16} {
			if got := Partition(id.Key(), n); got != want {
				t.Errorf("Partition(%q, %d) = %d, want %d", k.Key, n, got, want)
			}
			tp := part.ForTopic("t")
			if got := tp.Partition(&kgo.Record{Key: id.Key()}, int(n)); int32(got) != want {
				t.Errorf("kgo partitioner(%q, %d) = %d, want %d", k.Key, n, got, want)
			}
		}
	}
	for _, e := range v.EventIDs {
		if got := string(AppendFramed(nil, e.Parts...)); got != e.Framed {
			t.Errorf("AppendFramed(%q) = %q, want %q", e.Parts, got, e.Framed)
		}
		if got := EventID(e.Parts...); got != e.EventID {
			t.Errorf("EventID(%q) = %s, want %s", e.Parts, got, e.EventID)
		}
	}
}

func TestParseKeyRejects(t *testing.T) {
	for _, k := range []string{"", "acme", "4:acme", "4:acme9:api_calls", "4:acme9:api_calls6:req-42x",
		"04:acme9:api_calls6:req-42", "4:acme9:api_calls7:req-42", "-1:a1:b1:c", "a:b:c", "4:acme:api_calls:req-42",
		"1:a1:b", "9999999999:a"} {
		if _, err := ParseKey([]byte(k)); !errors.Is(err, ErrBadKey) {
			t.Errorf("ParseKey(%q) = %v, want ErrBadKey", k, err)
		}
	}
	if id, err := ParseKey([]byte("0:0:0:")); err != nil || id != (Identity{}) {
		t.Errorf("ParseKey of empty parts = %v, %v", id, err)
	}
}

func TestPropertiesSorted(t *testing.T) {
	m := map[string]string{"z": "1", "a": "2", "m": "3", "b": "4"}
	first := MustEncode(&UsageEvent{Properties: Properties(m)})
	for i := 0; i < 20; i++ {
		if !bytes.Equal(MustEncode(&UsageEvent{Properties: Properties(m)}), first) {
			t.Fatal("encoding of the same properties differs between calls")
		}
	}
	if !reflect.DeepEqual(PropertyMap(Properties(m)), m) {
		t.Fatal("PropertyMap(Properties(m)) != m")
	}
	if Properties(nil) != nil || PropertyMap(nil) != nil {
		t.Fatal("empty conversions should be nil")
	}
}

func TestSplitFramed(t *testing.T) {
	for _, parts := range [][]string{{"acme", "api_calls"}, {"", "a:b", "12:x"}, {"ünï", "", ""}} {
		got, err := SplitFramed(AppendFramed(nil, parts...))
		if err != nil || !reflect.DeepEqual(got, parts) {
			t.Errorf("SplitFramed(AppendFramed(%q)) = %q, %v", parts, got, err)
		}
	}
	for _, bad := range []string{"4:acm", "x:a", ":a", "3"} {
		if _, err := SplitFramed([]byte(bad)); err == nil {
			t.Errorf("SplitFramed(%q) accepted", bad)
		}
	}
}

func TestAppendDedupedFromRaw(t *testing.T) {
	for _, e := range []*UsageEvent{
		{EventID: "req-42", CustomerID: "acme", Meter: "api_calls", Quantity: 3, EventTime: 1795003200250, Source: "gw",
			Properties: []Property{{Name: "a", Value: "1"}, {Name: "b", Value: ""}}},
		{EventID: "e", CustomerID: "c", Meter: "m", Quantity: 0, EventTime: 946684800000},
		{EventID: "x", CustomerID: "y", Meter: "z", Quantity: 1 << 62, EventTime: 1 << 50},
	} {
		for _, f := range []struct {
			ingest    int64
			partition int32
			offset    int64
		}{{1795003201000, 0, 0}, {1, 255, 1 << 40}, {1 << 60, 1<<31 - 1, 7}} {
			got, ok := AppendDedupedFromRaw(nil, MustEncode(e), f.ingest, f.partition, f.offset)
			if !ok {
				t.Fatal("current UsageEvent not spliced")
			}
			want := MustEncode(&DedupedEvent{EventID: e.EventID, CustomerID: e.CustomerID, Meter: e.Meter, Quantity: e.Quantity,
				EventTime: e.EventTime, Source: e.Source, Properties: e.Properties, IngestTime: f.ingest,
				SourcePartition: f.partition, SourceOffset: f.offset})
			if !bytes.Equal(got, want) {
				t.Fatalf("spliced encoding differs from a full encode:\n got % x\nwant % x", got, want)
			}
		}
	}
	raw, _ := hex.DecodeString(strings.TrimSpace(string(mustReadFile(t, "testdata/usage_event.v0.hex"))))
	if _, ok := AppendDedupedFromRaw(nil, raw, 1, 1, 1); ok {
		t.Fatal("an event written with an old schema must not be spliced")
	}
}

func mustReadFile(t *testing.T, name string) []byte {
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
