package clip

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestTo(t *testing.T) {
	for _, c := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 8, "short"},
		{"exactly8", 8, "exactly8"},
		{"longer than eight", 8, "longer t…"},
		{"aaaaaaaé", 8, "aaaaaaa…"}, // é (2 bytes) would straddle the cut
		{"€€€", 4, "€…"},
	} {
		if got := To(c.in, c.n); got != c.want {
			t.Errorf("To(%q, %d) = %q, want %q", c.in, c.n, got, c.want)
		}
	}
	got := To(strings.Repeat("日本", 100), Echo)
	if !utf8.ValidString(got) || len(got) > Echo+len("…") {
		t.Errorf("To of a long multibyte string = %q (%d bytes), want valid UTF-8 of at most %d bytes", got, len(got), Echo+len("…"))
	}
}
