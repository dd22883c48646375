package schemas

import "testing"

// The hot calls of the two stages, with hamba/avro and with the
// hand-written codecs (fast.go), on the sample values of schemas_test.go.

func benchDecode(b *testing.B, m Message) {
	msg := MustEncode(m)
	b.Run("hamba", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := hambaDecode(msg); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("fast", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := Decode(msg); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkDecodeUsageEvent(b *testing.B) { benchDecode(b, samples()["usage_event"]) }

func BenchmarkDecodeDedupedEvent(b *testing.B) { benchDecode(b, samples()["deduped_event"]) }

func BenchmarkEncodeAggregate(b *testing.B) {
	a := samples()["aggregate"]
	b.Run("hamba", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := hambaEncode(a); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("fast", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := Encode(a); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkEncodeRejected: an aggregator's over_limit rejection of a
// usage.deduped record (Bound included: its digests of the raw bytes).
func BenchmarkEncodeRejected(b *testing.B) {
	ev := MustEncode(samples()["deduped_event"])
	key := CustomerKey("cust-00042")
	rej := func() *Rejected {
		return &Rejected{Reason: ReasonOverLimit, Stage: "aggregator", SourceTopic: "usage.deduped", SourcePartition: 7,
			SourceOffset: 123456, SourceTimestamp: 1764633600000, CustomerID: "cust-00042", Meter: "api_calls", EventID: "bench-42",
			Detail: `api_calls: usage in the period 1850 + 57 would pass the cap 1900 of plan "bench"`, RawKey: key, RawValue: ev}
	}
	b.Run("hamba", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			r := rej()
			r.Bound()
			if _, err := hambaEncode(r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("fast", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := EncodeRejected(nil, rej()); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkEncodeBalance(b *testing.B) {
	bal := &Balance{CustomerID: "cust-01234", Plan: "bench", Revision: 1234, UpdatedAt: 1_790_000_000_000,
		PeriodStart: 1_788_000_000_000, PeriodEnd: 1_790_600_000_000,
		Meters: []MeterBalance{{Meter: "api_calls", Usage: 1900, Limit: 1900, OnLimit: OnLimitReject},
			{Meter: "tokens", Usage: 1500, Limit: 1900, OnLimit: OnLimitReject}},
		Grants:          []GrantBalance{{ID: "bench", Amount: 1_000_000, Consumed: 4000, Remaining: 996_000}},
		OverdraftPolicy: OverdraftDeny}
	for _, c := range []struct {
		name string
		enc  func(Message) ([]byte, error)
	}{{"fast", Encode}, {"hamba", hambaEncode}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.enc(bal); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
