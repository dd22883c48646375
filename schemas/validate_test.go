package schemas

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestValidateText: text is valid UTF-8, checked on its bytes, and the
// identity fields and source hold no C0 control character (docs/design.md,
// Event identity and keys). Events travel as Avro, whose strings may carry
// any bytes, so the check runs on what the decoder returns.
func TestValidateText(t *testing.T) {
	good := func() *UsageEvent {
		return &UsageEvent{EventID: "req-1", CustomerID: "acme", Meter: "api_calls", Quantity: 1,
			EventTime: MinEventTime, Source: "gw", Properties: []Property{{Name: "model", Value: "m1"}}}
	}
	cases := []struct {
		name, field, why string
		edit             func(*UsageEvent)
	}{
		{"ff", "customer_id", "byte 0xff at offset 4", func(e *UsageEvent) { e.CustomerID = "acme\xff" }},
		{"fe", "customer_id", "byte 0xfe at offset 4", func(e *UsageEvent) { e.CustomerID = "acme\xfe" }},
		{"surrogate", "meter", "byte 0xed at offset 0", func(e *UsageEvent) { e.Meter = "\xed\xa0\x80" }},
		{"overlong", "event_id", "byte 0xc0 at offset 0", func(e *UsageEvent) { e.EventID = "\xc0\xaf" }},
		{"source", "source", "not valid UTF-8", func(e *UsageEvent) { e.Source = "g\x80w" }},
		{"property value", "properties.model", "not valid UTF-8", func(e *UsageEvent) { e.Properties[0].Value = "\xff" }},
		{"property name", "properties", "a property name is not valid UTF-8", func(e *UsageEvent) { e.Properties[0].Name = "\xff" }},
		{"NUL", "customer_id", "U+0000 at offset 4", func(e *UsageEvent) { e.CustomerID = "acme\x00" }},
		{"unit separator", "meter", "U+001F at offset 3", func(e *UsageEvent) { e.Meter = "api\x1fcalls" }},
		{"CR", "event_id", "U+000D at offset 5", func(e *UsageEvent) { e.EventID = "req-1\r" }},
		{"ESC", "source", "U+001B at offset 0", func(e *UsageEvent) { e.Source = "\x1b[0m" }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := good()
			c.edit(e)
			// Through Avro, as dedup sees it.
			b, err := Encode(e)
			if err != nil {
				t.Fatal(err)
			}
			var got UsageEvent
			if _, err := DecodeUsageOr(b, &got); err != nil {
				t.Fatalf("decode: %v", err)
			}
			err = got.Validate()
			var fe *FieldError
			if !errors.As(err, &fe) || !errors.Is(err, ErrInvalidEvent) {
				t.Fatalf("Validate = %v, want a *FieldError", err)
			}
			if fe.Field != c.field || fe.Code != ReasonInvalid || !strings.Contains(fe.Reason, c.why) {
				t.Fatalf("Validate = %q (field %q, code %q); want invalid %s, %q", err, fe.Field, fe.Code, c.field, c.why)
			}
		})
	}
	for _, edit := range []func(*UsageEvent){
		func(e *UsageEvent) { e.CustomerID = "acme\uFFFD" },
		func(e *UsageEvent) { e.CustomerID = "Zürich 😀\x7f" },
		func(e *UsageEvent) { e.Properties[0].Value = "line 1\nline 2\t\x00" }, // controls are fine in properties
	} {
		e := good()
		edit(e)
		if err := e.Validate(); err != nil {
			t.Errorf("Validate(%+v) = %v, want ok", e, err)
		}
	}
}

// BenchmarkValidate: the rules dedup applies to every event.
func BenchmarkValidate(b *testing.B) {
	e := &UsageEvent{EventID: "0123456789abcdef0123456789abcdef", CustomerID: "customer-000123", Meter: "api_calls",
		Quantity: 1, EventTime: MinEventTime, Source: "api-gateway", Properties: []Property{{Name: "model", Value: "m1"}, {Name: "region", Value: "eu-west-1"}}}
	for b.Loop() {
		if err := e.Validate(); err != nil {
			b.Fatal(err)
		}
	}
}

// TestCheckTextFastPath: CheckText, which takes ASCII without control
// characters in one pass, answers every string as the plain rules do
// (invalid UTF-8 first, then, in identity fields, a C0 control).
func TestCheckTextFastPath(t *testing.T) {
	ref := func(v string, identity bool) string {
		if !utf8.ValidString(v) {
			i := firstInvalidUTF8(v)
			return fmt.Sprintf("is not valid UTF-8 (byte 0x%02x at offset %d)", v[i], i)
		}
		if identity {
			for i := 0; i < len(v); i++ {
				if v[i] < 0x20 {
					return fmt.Sprintf("holds the control character U+%04X at offset %d (not allowed in identity fields and source)", v[i], i)
				}
			}
		}
		return ""
	}
	cases := []string{"", "acme", "Zürich", "a\x00", "\x1f", "a\x7f", "\x00\xff", "a\tb\xc3", "é\n", "\ufffd", strings.Repeat("x", 100) + "\x01"}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		b := make([]byte, rng.IntN(12))
		for i := range b {
			b[i] = []byte{'a', 0, 0x1f, 0x20, 0x7f, 0x80, 0xc3, 0xa9, 0xe2, 0xff}[rng.IntN(10)]
		}
		cases = append(cases, string(b))
	}
	for _, v := range cases {
		for _, identity := range []bool{false, true} {
			got := ""
			if fe := CheckText("f", v, identity); fe != nil {
				got = fe.Reason
			}
			if want := ref(v, identity); got != want {
				t.Fatalf("CheckText(%q, identity %v) = %q, want %q", v, identity, got, want)
			}
		}
	}
}
