package schemas

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode"
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
		// DEL, C1 controls and the invisible format characters (bidi
		// controls, zero-width ones) make one ID look like another in an
		// analyst's table: "acme\u202e1-" shows as "acme-1".
		{"DEL", "customer_id", "U+007F at offset 4", func(e *UsageEvent) { e.CustomerID = "acme\x7f" }},
		{"NEL", "customer_id", "U+0085 at offset 4", func(e *UsageEvent) { e.CustomerID = "acme\u0085" }},
		{"C1 first", "meter", "U+0080 at offset 3", func(e *UsageEvent) { e.Meter = "api\u0080" }},
		{"C1 last", "event_id", "U+009F at offset 0", func(e *UsageEvent) { e.EventID = "\u009f" }},
		{"RLO", "customer_id", "U+202E at offset 4", func(e *UsageEvent) { e.CustomerID = "acme\u202e1-" }},
		{"LRE", "customer_id", "U+202A at offset 0", func(e *UsageEvent) { e.CustomerID = "\u202aacme" }},
		{"PDF", "customer_id", "U+202C at offset 1", func(e *UsageEvent) { e.CustomerID = "a\u202c" }},
		{"LRI", "source", "U+2066 at offset 2", func(e *UsageEvent) { e.Source = "gw\u2066" }},
		{"PDI", "meter", "U+2069 at offset 0", func(e *UsageEvent) { e.Meter = "\u2069m" }},
		{"LRM", "event_id", "U+200E at offset 3", func(e *UsageEvent) { e.EventID = "req\u200e" }},
		{"RLM", "customer_id", "U+200F at offset 2", func(e *UsageEvent) { e.CustomerID = "ac\u200fme" }},
		{"ALM", "customer_id", "U+061C at offset 2", func(e *UsageEvent) { e.CustomerID = "ac\u061cme" }},
		{"ZWSP", "customer_id", "U+200B at offset 2", func(e *UsageEvent) { e.CustomerID = "ac\u200bme" }},
		{"word joiner", "customer_id", "U+2060 at offset 2", func(e *UsageEvent) { e.CustomerID = "ac\u2060me" }},
		{"BOM", "customer_id", "U+FEFF at offset 0", func(e *UsageEvent) { e.CustomerID = "\ufeffacme" }},
		{"line separator", "source", "U+2028 at offset 2", func(e *UsageEvent) { e.Source = "gw\u2028x" }},
		// The other format and default-ignorable characters: "acme-1\u00ad"
		// shows as "acme-1", a Hangul filler as a blank.
		{"soft hyphen", "customer_id", "invisible character U+00AD at offset 6", func(e *UsageEvent) { e.CustomerID = "acme-1\u00ad" }},
		{"function application", "customer_id", "U+2061 at offset 1", func(e *UsageEvent) { e.CustomerID = "a\u2061" }},
		{"inhibit swapping", "meter", "U+206A at offset 0", func(e *UsageEvent) { e.Meter = "\u206am" }},
		{"grapheme joiner", "event_id", "U+034F at offset 1", func(e *UsageEvent) { e.EventID = "r\u034f" }},
		{"Mongolian vowel separator", "customer_id", "U+180E at offset 1", func(e *UsageEvent) { e.CustomerID = "a\u180e" }},
		{"Hangul filler", "customer_id", "U+3164 at offset 4", func(e *UsageEvent) { e.CustomerID = "acme\u3164" }},
		{"halfwidth Hangul filler", "source", "U+FFA0 at offset 2", func(e *UsageEvent) { e.Source = "gw\uffa0" }},
		{"variation selector", "customer_id", "U+FE0F at offset 4", func(e *UsageEvent) { e.CustomerID = "acme\ufe0f" }},
		{"tag", "customer_id", "U+E0041 at offset 4", func(e *UsageEvent) { e.CustomerID = "acme\U000e0041" }},
		{"interlinear annotation", "customer_id", "U+FFF9 at offset 1", func(e *UsageEvent) { e.CustomerID = "a\ufff9" }},
		// The zero-width joiner and non-joiner join emoji and the letters
		// of scripts that join; anywhere else they only hide: "acme-1\u200d"
		// shows as "acme-1", a lone joiner as nothing.
		{"lone joiner", "customer_id", "zero-width joiner U+200D at offset 0", func(e *UsageEvent) { e.CustomerID = "\u200d" }},
		{"joiner at the end", "customer_id", "U+200D at offset 6", func(e *UsageEvent) { e.CustomerID = "acme-1\u200d" }},
		{"non-joiner at the start", "meter", "zero-width non-joiner U+200C at offset 0", func(e *UsageEvent) { e.Meter = "\u200capi" }},
		{"non-joiner in a Latin word", "event_id", "U+200C at offset 2", func(e *UsageEvent) { e.EventID = "re\u200cq" }},
		{"joiner beside an accented letter", "customer_id", "U+200D at offset 5", func(e *UsageEvent) { e.CustomerID = "caf\u00e9\u200d\u00e9" }},
		{"two joiners", "customer_id", "U+200D at offset 4", func(e *UsageEvent) { e.CustomerID = "👩\u200d\u200d💻" }},
		{"joiner beside a space", "source", "U+200D at offset 5", func(e *UsageEvent) { e.Source = "\u0645\u06cc \u200d\u062e" }},
		// White space only is as good as no ID: one identity for every
		// event that has it.
		{"blank event_id", "event_id", "must not be blank (white space only)", func(e *UsageEvent) { e.EventID = "   " }},
		{"no-break space", "customer_id", "must not be blank", func(e *UsageEvent) { e.CustomerID = "\u00a0" }},
		{"ideographic space", "meter", "must not be blank", func(e *UsageEvent) { e.Meter = " \u3000\u2003" }},
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
		func(e *UsageEvent) { e.CustomerID = "Zürich 😀 عربى 中文" },
		func(e *UsageEvent) { e.CustomerID = "👩\u200d💻" },                                         // a zero-width joiner makes one emoji of two
		func(e *UsageEvent) { e.CustomerID = "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645" }, // a zero-width non-joiner in a Persian word
		func(e *UsageEvent) { e.CustomerID = "\u0915\u094d\u200d\u0937" },                         // a zero-width joiner after a virama (Devanagari)
		func(e *UsageEvent) { e.CustomerID = "👩🏽\u200d💻" },                                        // after a skin tone modifier
		func(e *UsageEvent) { e.CustomerID = "\u00a0\u00ff\u2000\u202f" },                         // past C1, between the format characters
		func(e *UsageEvent) { e.Properties[0].Value = "line 1\nline 2\t\x00\x7f\u202e" },          // controls are fine in properties
		func(e *UsageEvent) { e.EventID = " req 1 " },                                             // blanks around an ID, or in it
		func(e *UsageEvent) { e.Source = "   " },                                                  // source is no identity field
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
			rs, at := []rune(v), 0
			for j, r := range rs {
				i := at
				at += utf8.RuneLen(r)
				if unicode.In(r, unicode.Cc, unicode.Cf, unicode.Zl, unicode.Zp, unicode.Other_Default_Ignorable_Code_Point, unicode.Variation_Selector) && r != 0x200c && r != 0x200d {
					return fmt.Sprintf("holds the %s U+%04X at offset %d (not allowed in identity fields and source)", charKind(r), r, i)
				}
				if r == 0x200c || r == 0x200d {
					joins := func(k int) bool {
						return k >= 0 && k < len(rs) && rs[k] > 0x7f && rs[k] != 0x200c && rs[k] != 0x200d && !unicode.IsSpace(rs[k]) &&
							!unicode.In(rs[k], unicode.Latin, unicode.Greek, unicode.Cyrillic)
					}
					if !joins(j-1) || !joins(j+1) {
						return fmt.Sprintf("holds the %s U+%04X at offset %d where it joins nothing (allowed in identity fields and source only between emoji or letters of a script that joins)", charKind(r), r, i)
					}
				}
			}
		}
		return ""
	}
	cases := []string{"", "acme", "Zürich", "a\x00", "\x1f", "a\x7f", "\x00\xff", "a\tb\xc3", "é\n", "\ufffd", strings.Repeat("x", 100) + "\x01",
		"a\u0085", "\u009f\xff", "x\u202e", "\u2066", "\u200f", "\u200d", "\u00a0", "👩\u200d💻", "a\u200db", "\u0645\u200c\u062e", "\u0645\u200c"}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		b := make([]byte, rng.IntN(12))
		for i := range b {
			b[i] = []byte{'a', 0, 0x1f, 0x20, 0x7f, 0x80, 0xc3, 0xa9, 0xe2, 0xff, 0xc2, 0x85, 0x9f, 0x81, 0xaa, 0xd8, 0x9c}[rng.IntN(17)]
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
