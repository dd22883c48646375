package schemas

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

// FuzzDecode feeds arbitrary bytes to the decoder. It must never panic and
// must fail only with ErrUndecodable or ErrUnknownSchema; whatever it
// accepts must re-encode to a message that decodes to the same value
// (deeply equal) and encodes to the same bytes.
func FuzzDecode(f *testing.F) {
	for _, m := range samples() {
		b := MustEncode(m)
		f.Add(b)
		f.Add(b[:len(b)/2])
	}
	f.Add([]byte{0xC3, 0x01})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Decode(b)
		if err != nil {
			if !errors.Is(err, ErrUndecodable) && !errors.Is(err, ErrUnknownSchema) {
				t.Fatalf("unexpected error class: %v", err)
			}
			return
		}
		again, err := Encode(m)
		if err != nil {
			t.Fatalf("decoded value does not re-encode: %v", err)
		}
		m2, err := Decode(again)
		if err != nil {
			t.Fatalf("re-encoded value does not decode: %v", err)
		}
		if !bytes.Equal(MustEncode(m2), again) {
			t.Fatal("encoding is not stable after a decode")
		}
		if !reflect.DeepEqual(m2, m) {
			t.Fatalf("decode(encode(m)) differs from m:\n got %#v\nwant %#v", m2, m)
		}
	})
}

// FuzzParseKey checks that ParseKey accepts exactly the canonical keys.
func FuzzParseKey(f *testing.F) {
	f.Add([]byte("4:acme9:api_calls6:req-42"))
	f.Add([]byte("0:0:0:"))
	f.Add([]byte("1:a"))
	f.Fuzz(func(t *testing.T, b []byte) {
		id, err := ParseKey(b)
		if err != nil {
			if !errors.Is(err, ErrBadKey) {
				t.Fatalf("unexpected error class: %v", err)
			}
			return
		}
		if !bytes.Equal(id.Key(), b) {
			t.Fatalf("ParseKey accepted %q, which is not the canonical %q", b, id.Key())
		}
	})
}

// FuzzDecodeUsageOr: the decoder dedup runs on every record, into a value
// reused from the record before, gives what Decode gives and keeps nothing
// of the record before.
func FuzzDecodeUsageOr(f *testing.F) {
	for _, m := range samples() {
		b := MustEncode(m)
		f.Add(MustEncode(samples()["usage_event"]), b)
		f.Add(b, b[:len(b)/2])
	}
	f.Add([]byte{}, []byte{0xC3, 0x01})
	f.Fuzz(func(t *testing.T, prev, b []byte) {
		var e UsageEvent
		_, _ = DecodeUsageOr(prev, &e)
		got, err := DecodeUsageOr(b, &e)
		want, werr := Decode(b)
		if (err == nil) != (werr == nil) {
			t.Fatalf("DecodeUsageOr error %v, Decode error %v", err, werr)
		}
		if err != nil {
			if errors.Is(err, ErrUnknownSchema) != errors.Is(werr, ErrUnknownSchema) || !errors.Is(err, ErrUndecodable) && !errors.Is(err, ErrUnknownSchema) {
				t.Fatalf("error classes differ: %v, %v", err, werr)
			}
			return
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("DecodeUsageOr into a reused value:\n got %#v\nwant %#v", got, want)
		}
	})
}

// FuzzSplitFramed checks that SplitFramed accepts exactly what AppendFramed
// produces: whatever it splits frames back to the same bytes, so no two
// byte strings split into the same parts.
func FuzzSplitFramed(f *testing.F) {
	f.Add([]byte("4:acme9:api_calls"))
	f.Add([]byte(""))
	f.Add([]byte("0:"))
	f.Add([]byte("01:a"))
	f.Add([]byte("+1:a"))
	f.Add([]byte("1:a2:b"))
	f.Fuzz(func(t *testing.T, b []byte) {
		parts, err := SplitFramed(b)
		if err != nil {
			if !errors.Is(err, ErrBadKey) {
				t.Fatalf("unexpected error class: %v", err)
			}
			return
		}
		if again := AppendFramed(nil, parts...); !bytes.Equal(again, b) {
			t.Fatalf("SplitFramed(%q) = %q, which frames to %q", b, parts, again)
		}
	})
}
