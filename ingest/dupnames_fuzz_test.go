package ingest

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzDuplicateMember: duplicateMember finds a repeated member name in
// valid JSON of valid UTF-8 exactly when encoding/json's tokens show one in some object,
// and the path it names ends in such a name.
func FuzzDuplicateMember(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":1,"a":2}`, `{"a":{"b":1},"c":[{"d":1,"d":2}]}`, `{"\u0061":1,"a":2}`, `{"a":[1,{"a":1}],"b":{"a":1}}`,
		`{"x":{"y":{"z":1,"z":1}}}`, `{"":1,"":2}`, `{"a\\b":1,"a\\b":1}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		// The data it checks is valid UTF-8 (checkText runs first).
		if !utf8.ValidString(s) || !json.Valid([]byte(s)) || strings.TrimSpace(s) == "" || strings.TrimSpace(s)[0] != '{' {
			return
		}
		want := repeatedNames(t, s)
		fe := duplicateMember(strings.TrimSpace(s))
		if (fe != nil) != (len(want) > 0) {
			t.Fatalf("duplicateMember(%q) = %v, want a repetition: %v", s, fe, want)
		}
		if fe != nil && fe.Field != clip(fe.Field) {
			return // clipped: the name is cut
		}
		if fe != nil {
			found := false
			for _, n := range want {
				found = found || strings.HasSuffix(fe.Field, "."+n)
			}
			if !found {
				t.Fatalf("duplicateMember(%q) names %q, not one of %v", s, fe.Field, want)
			}
		}
	})
}

// repeatedNames lists the names repeated in some object of the JSON text
// s, by encoding/json's tokens.
func repeatedNames(t *testing.T, s string) []string {
	dec := json.NewDecoder(strings.NewReader(s))
	type obj struct {
		names  map[string]bool
		object bool
		key    bool
	}
	var stack []*obj
	var out []string
	for {
		tok, err := dec.Token()
		if err != nil {
			return out
		}
		var top *obj
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		switch v := tok.(type) {
		case json.Delim:
			switch v {
			case '{', '[':
				if top != nil && top.object {
					top.key = true
				}
				stack = append(stack, &obj{names: map[string]bool{}, object: v == '{', key: true})
				continue
			default:
				stack = stack[:len(stack)-1]
				continue
			}
		case string:
			if top != nil && top.object && top.key {
				if top.names[v] {
					out = append(out, v)
				}
				top.names[v] = true
				top.key = false
				continue
			}
		}
		if top != nil && top.object {
			top.key = true
		}
	}
}
