package yamlbound

import (
	"errors"
	"strings"
	"testing"
)

// TestCheck: a document whose aliases expand it past a limit is refused;
// one within them, or one that does not parse, passes.
func TestCheck(t *testing.T) {
	big := strings.Repeat("z", 64<<10)
	laughs := "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
	for i := 'b'; i <= 'i'; i++ {
		p := string(i - 1)
		laughs += string(i) + ": &" + string(i) + " [*" + p + ", *" + p + ", *" + p + ", *" + p + ", *" + p + ", *" + p + ", *" + p + ", *" + p + ", *" + p + ", *" + p + "]\n"
	}
	for _, c := range []struct{ name, doc, want string }{
		{"big scalar", "a: &a \"" + big + "\"\nb: [" + strings.Repeat("*a, ", 300) + "*a]\n", "more than 16 MiB of text"},
		{"big key", "a: &a\n  ? \"" + big + "\"\n  : 1\nb: [" + strings.Repeat("*a, ", 300) + "*a]\n", "more than 16 MiB of text"},
		{"billion laughs", laughs, "more than 1048576 nodes"},
		{"deep", strings.Repeat("[", 10_000) + strings.Repeat("]", 10_000), ""},
		{"within", "a: &a \"" + big + "\"\nb: [" + strings.Repeat("*a, ", 200) + "*a]\n", ""},
		{"alias of itself", "a: &a [*a]\n", ""},
		{"not YAML", "a: [\n", ""},
	} {
		err := Check([]byte(c.doc))
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
}

// TestReadAll: a reader of at most the limit is read whole; a longer one
// is refused with a *TooLargeError, having read limit+1 bytes of it.
func TestReadAll(t *testing.T) {
	for _, c := range []struct {
		size, limit int
		want        string
	}{
		{100, 100, ""},
		{101, 100, "larger than 100 bytes"},
		{1<<20 + 1, 1 << 20, "larger than 1 MiB"},
		{10 << 20, 1 << 20, "larger than 1 MiB"},
	} {
		r := strings.NewReader(strings.Repeat("x", c.size))
		b, err := ReadAll(r, c.limit)
		var tl *TooLargeError
		switch {
		case c.want == "" && (err != nil || len(b) != c.size):
			t.Errorf("%d bytes, limit %d: %d bytes, %v; want them all", c.size, c.limit, len(b), err)
		case c.want != "" && (!errors.As(err, &tl) || err.Error() != c.want || b != nil):
			t.Errorf("%d bytes, limit %d: %v; want %q", c.size, c.limit, err, c.want)
		}
		if read := int(r.Size()) - r.Len(); read > c.limit+1 {
			t.Errorf("%d bytes, limit %d: %d read", c.size, c.limit, read)
		}
	}
}
