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
