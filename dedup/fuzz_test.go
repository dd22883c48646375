package dedup

import (
	"bytes"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
)

// Fuzz targets for what dedup reads from producer-controlled header bytes:
// the re-route and tick signatures, the decimal fields, and the key ring
// format.

const fuzzTopic = "usage.events"

var fuzzKey = Key{ID: "k1", Secret: bytes.Repeat([]byte{7}, MinSecretBytes)}

// fuzzPartition is a partition with just what arrivalOf and tick's checks
// use.
func fuzzPartition(upgrade int64) *partition {
	pr := &processor{cfg: Config{Window: 35 * 24 * time.Hour}, log: zap.NewNop(), m: newMetrics(prometheus.NewRegistry()),
		keys: newKeyring([]Key{fuzzKey}), eventsTopic: fuzzTopic}
	return &partition{pr: pr, upgrade: upgrade}
}

func headersOf(rerouted, arrival, auth []byte, mask uint8) []kgo.RecordHeader {
	var hs []kgo.RecordHeader
	if mask&1 != 0 {
		hs = append(hs, kgo.RecordHeader{Key: HeaderRerouted, Value: rerouted})
	}
	if mask&2 != 0 {
		hs = append(hs, kgo.RecordHeader{Key: HeaderArrival, Value: arrival})
	}
	if mask&4 != 0 {
		hs = append(hs, kgo.RecordHeader{Key: HeaderAuth, Value: auth})
	}
	if mask&8 != 0 {
		hs = append(hs, kgo.RecordHeader{Key: HeaderArrival, Value: arrival}) // repeated
	}
	return hs
}

// FuzzRerouteHeaders: whatever the headers, a record's arrival is its
// broker timestamp unless the headers are proven, and then it lies in
// [ts − W, ts]; headers are proven only by the one signature the key makes
// over this very record, or unsigned below the upgrade offset.
func FuzzRerouteHeaders(f *testing.F) {
	kr := newKeyring([]Key{fuzzKey})
	key, val := []byte("4:acme9:api_calls2:e1"), []byte("value")
	good := kr.rerouteHeaders(fuzzTopic, 3, key, val, rerouted{origPartition: 1, origOffset: 42, arrival: 1795219200000})
	f.Add(key, val, int32(3), good[0].Value, good[1].Value, good[2].Value, uint8(7), int64(5), int64(1795219300000), int64(0))
	f.Add(key, val, int32(3), good[0].Value, good[1].Value, good[2].Value, uint8(3), int64(5), int64(1795219300000), int64(10))
	f.Add(key, val, int32(3), []byte("0/0"), []byte("-9223372036854775808"), []byte("v1:k1:"), uint8(15), int64(0), int64(-1), int64(1))
	// Proven arrivals outside [ts − W, ts] (the signature does not cover
	// the broker timestamp): a re-route written more than W after its
	// original arrived, signed and unsigned below the upgrade offset, and
	// one stamped by a broker clock that stepped back.
	day := int64(24 * time.Hour / time.Millisecond)
	f.Add(key, val, int32(3), good[0].Value, good[1].Value, good[2].Value, uint8(7), int64(5), 1795219200000+40*day, int64(0))
	f.Add(key, val, int32(3), good[0].Value, good[1].Value, good[2].Value, uint8(3), int64(5), 1795219200000+40*day, int64(10))
	f.Add(key, val, int32(3), good[0].Value, good[1].Value, good[2].Value, uint8(7), int64(5), 1795219200000-day, int64(0))
	f.Fuzz(func(t *testing.T, key, val []byte, part int32, rr, arr, auth []byte, mask uint8, offset, ts, upgrade int64) {
		ts %= 1 << 50 // broker timestamps: far from overflow
		pt := fuzzPartition(upgrade)
		r := &kgo.Record{Topic: fuzzTopic, Partition: part, Offset: offset, Key: key, Value: val, Headers: headersOf(rr, arr, auth, mask)}
		h := scanHeaders(r.Headers)
		arrival, proven := pt.arrivalOf(r, &h, ts)
		if !proven {
			if arrival != ts {
				t.Fatalf("unproven record: arrival %d, want its broker timestamp %d", arrival, ts)
			}
			return
		}
		if arrival < ts-pt.pr.cfg.Window.Milliseconds() || arrival > ts {
			t.Fatalf("proven arrival %d outside [ts − W, ts] for ts %d", arrival, ts)
		}
		p, ok := parseRerouted(&h)
		if !ok {
			t.Fatal("proven with malformed re-route headers")
		}
		if h.hasAuth {
			want := kr.rerouteHeaders(fuzzTopic, part, key, val, p)[2].Value
			if !bytes.Equal(h.auth, want) {
				t.Fatalf("proven with signature %q, the key makes only %q", h.auth, want)
			}
		} else if offset >= upgrade {
			t.Fatalf("unsigned headers proven at offset %d, at or above the upgrade offset %d", offset, upgrade)
		}
	})
}

// FuzzReplayedHeaders: the headers dedup signed for one record prove
// nothing on any other key, value or partition.
func FuzzReplayedHeaders(f *testing.F) {
	f.Add([]byte("4:acme1:m2:e1"), []byte("v"), int32(0), []byte("4:acme1:m2:e1"), []byte("v"), int32(1))
	f.Add([]byte("4:acme1:m2:e1"), []byte("v"), int32(0), []byte("4:acme1:m2:e2"), []byte("v"), int32(0))
	f.Fuzz(func(t *testing.T, k1, v1 []byte, p1 int32, k2, v2 []byte, p2 int32) {
		kr := newKeyring([]Key{fuzzKey})
		hs := kr.rerouteHeaders(fuzzTopic, p1, k1, v1, rerouted{origPartition: 2, origOffset: 9, arrival: 1000})
		pt := fuzzPartition(0)
		r := &kgo.Record{Topic: fuzzTopic, Partition: p2, Offset: 1, Key: k2, Value: v2, Headers: hs}
		h := scanHeaders(r.Headers)
		_, proven := pt.arrivalOf(r, &h, 2000)
		same := bytes.Equal(k1, k2) && bytes.Equal(v1, v2) && p1 == p2
		if proven != same {
			t.Fatalf("proven %v on %s a record other than the signed one", proven, map[bool]string{true: "the same", false: "another"}[same])
		}
	})
}

// FuzzTickAuth: a tick is authentic only with the signature the key makes
// for its partition and value.
func FuzzTickAuth(f *testing.F) {
	kr := newKeyring([]Key{fuzzKey})
	good := kr.tickHeaders(fuzzTopic, 1, []byte("tick"))[0].Value
	f.Add(int32(1), []byte("tick"), good, uint8(4))
	f.Add(int32(2), []byte("tick"), good, uint8(5))
	f.Fuzz(func(t *testing.T, part int32, val, auth []byte, mask uint8) {
		r := &kgo.Record{Topic: fuzzTopic, Partition: part, Value: val, Headers: headersOf([]byte("0/0"), []byte("1"), auth, mask)}
		h := scanHeaders(r.Headers)
		if kr.verifyTick(fuzzTopic, r, &h) == "" && !bytes.Equal(auth, kr.tickHeaders(fuzzTopic, part, val)[0].Value) {
			t.Fatalf("tick authentic with %q", auth)
		}
	})
}

// FuzzParseDec: parseDec accepts exactly the canonical decimal spelling of
// an int64.
func FuzzParseDec(f *testing.F) {
	for _, s := range []string{"0", "-1", "42", "007", "+5", "-0", "9223372036854775807", "-9223372036854775808", "9223372036854775808", ""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		v, ok := parseDec(b)
		w, err := strconv.ParseInt(string(b), 10, 64)
		canonical := err == nil && strconv.FormatInt(w, 10) == string(b)
		if ok && (!canonical || v != w) {
			t.Fatalf("parseDec(%q) = %d, not the canonical spelling", b, v)
		}
		// The one canonical int64 parseDec refuses is the minimum, which
		// no offset, partition or arrival takes.
		if !ok && canonical && w != -1<<63 {
			t.Fatalf("parseDec(%q) refused a canonical int64", b)
		}
	})
}

// FuzzParseKeys: ParseKeys never panics, and a ring it accepts is valid
// and written back by FormatKeys to the same ring.
func FuzzParseKeys(f *testing.F) {
	f.Add([]byte("k1 " + string(bytes.Repeat([]byte("ab"), 32)) + "\n# old\nk0 " + string(bytes.Repeat([]byte("01"), 40))))
	f.Add([]byte("k1 zz,k2"))
	f.Fuzz(func(t *testing.T, b []byte) {
		keys, err := ParseKeys(b)
		if err != nil {
			return
		}
		if validateKeys(keys) != nil {
			t.Fatal("accepted an invalid ring")
		}
		again, err := ParseKeys(FormatKeys(keys...))
		if err != nil || len(again) != len(keys) {
			t.Fatalf("FormatKeys output does not parse back: %v", err)
		}
		for i := range keys {
			if again[i].ID != keys[i].ID || !bytes.Equal(again[i].Secret, keys[i].Secret) {
				t.Fatalf("key %d changed through FormatKeys", i)
			}
		}
	})
}
