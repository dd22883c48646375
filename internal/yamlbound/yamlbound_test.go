package yamlbound

import (
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
