package schemas

import (
	"errors"
	"strings"
	"testing"
)

// TestValidateText: text is valid UTF-8, checked on its bytes, and the
// identity fields and source hold no C0 control character (DESIGN §8).
// Events travel as Avro, whose strings may carry any bytes, so the check
// runs on what the decoder returns.
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
