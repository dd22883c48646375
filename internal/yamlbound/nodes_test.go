package yamlbound

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// parsedNodes is the number of nodes yaml.v3 builds of the first document
// of b (the document node and aliases' expansions not counted), false
// when b (any of its documents) does not parse.
func parsedNodes(b []byte) (int, bool) {
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(b))
	if dec.Decode(&doc) != nil {
		return 0, false
	}
	for {
		var more yaml.Node
		if err := dec.Decode(&more); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return 0, false
		}
	}
	var count func(n *yaml.Node) int
	count = func(n *yaml.Node) int {
		c := 1
		for _, k := range n.Content {
			c += count(k)
		}
		return c
	}
	return count(&doc) - 1, true
}

// nodeDocs are documents written in the ways YAML allows, for
// NodesPast's lower bound.
var nodeDocs = []string{
	"a: 1\n",
	"a:\n  - x\n  - y\n",
	"- a\n- - b\n  - c\n- {d: 1, e: [f, g]}\n",
	"a: [x, [y, z], {k: v}, [], {}, \"q, r\", 's, ''t']\n",
	"a: [x,\n  y, # c, d\n  z]\nb: 2\n",
	"a: |\n  - x\n  - y\n  [a, b, c]\nb: >-\n  - z\n\n  - w\nc: 3\n",
	"- |\n  - x\n  - y\n- z\n",
	"a: foo\n  - bar\n  - baz\nb: 1\n",
	"a: \"x\n  - y, [z]\n  - w\"\nb: 'p\n  - q'\n",
	"anchors: &a [x, y]\nb: *a\nc: [*a, *a]\n",
	"? complex\n: value\n? [a, b]\n: [c, d]\n",
	"--- # doc\na: 1\n...\n",
	"%YAML 1.2\n---\na: 1\n",
	"\ufeffa: [1,2,3]\n",
	"{\"a\": [1, 2, {\"b\": \"c,d\"}], \"e\": \"#f\"}",
	"a: x #, [y, z]\nb: [p, q] # ,,,\n",
	"a: b:c, d\ne: f#g, h\n",
	"a: &x !!seq\n- 1\n- 2\nb: !t &y\n  c: d\n",
	"- - - a\n    - b\n  - c\n- d\n",
	"a:\n- |\n  x\n- >\n y\n- z\n",
	"a: [x, y,]\nb: {c: d,}\n",
	"a:\t[x,\ty]\r\nb: 1\r\n",
	"a: '[,,,]'\nb: \"\\\"[,,,]\"\n",
	"a: -1\nb: - 2\n",
	"a: [- 1]\n",
	"a: {? b, c: d}\n",
	"a: [b: c, d: e]\n",
	"a: x\n\n  y\nb: 1\n",
	"a:\n  b:\n    c: [1, 2]\n  d: 4\n",
}

// TestNodesPastCountsNoMore: NodesPast counts no more nodes than yaml.v3
// builds, of the documents above and of the YAML files of the
// repository, so that it refuses no document within the limit; a flat
// list of many items is found past it.
func TestNodesPastCountsNoMore(t *testing.T) {
	docs := append([]string(nil), nodeDocs...)
	files, _ := filepath.Glob("../../*/*.yaml")
	more, _ := filepath.Glob("../../*/*/*.yaml")
	testdata, _ := filepath.Glob("../../*/testdata/*.yaml")
	for _, f := range append(append(files, more...), testdata...) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, string(b))
	}
	if len(docs) < len(nodeDocs)+5 {
		t.Fatalf("%d YAML files found in the repository", len(docs)-len(nodeDocs))
	}
	for _, d := range docs {
		n, ok := parsedNodes([]byte(d))
		if !ok {
			continue
		}
		if line := NodesPast([]byte(d), n); line != 0 {
			t.Errorf("more than the %d nodes parsed counted by line %d of\n%s", n, line, clip(d))
		}
	}
	for _, c := range []struct {
		doc  string
		line int
	}{
		{"a: [" + strings.Repeat("x,", 101) + "x]\n", 1},
		{"a: [\n" + strings.Repeat("  x,\n", 101) + "]\n", 100},
		{"a:\n" + strings.Repeat("- x\n", 101), 101},
		{strings.Repeat("k: v\n", 101), 101},
		{"a: [" + strings.Repeat("*x, ", 101) + "]\n", 1},
		{"a: {" + strings.Repeat("k: v, ", 101) + "}\n", 1},
	} {
		if line := NodesPast([]byte(c.doc), 100); line != c.line {
			t.Errorf("past 100 nodes by line %d, want %d, of\n%s", line, c.line, clip(c.doc))
		}
	}
}

func clip(s string) string {
	if len(s) > 300 {
		return s[:300] + "..."
	}
	return s
}

// FuzzNodesPast: of any document yaml.v3 parses, NodesPast counts no
// more nodes than it builds.
func FuzzNodesPast(f *testing.F) {
	for _, d := range nodeDocs {
		f.Add([]byte(d))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if n, ok := parsedNodes(b); ok {
			if line := NodesPast(b, n); line != 0 {
				t.Errorf("more than the %d nodes parsed counted by line %d of %q", n, line, b)
			}
		}
	})
}

// TestCheckFlatListBounded: Check refuses a 16 MiB flow list of 8 million
// items, and a block list of 4 million, as past MaxNodes without parsing
// it: yaml.v3 took 2 GB to build its nodes.
func TestCheckFlatListBounded(t *testing.T) {
	for _, doc := range [][]byte{
		[]byte("a: [" + strings.Repeat("x,", MaxText/2-4) + "x]\n"),
		[]byte("a:\n" + strings.Repeat("- x\n", MaxText/4-1)),
	} {
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		err := Check(doc)
		runtime.ReadMemStats(&m1)
		if err == nil || !strings.Contains(err.Error(), "more than 1048576 nodes") {
			t.Errorf("%.20q: %v, want it refused as more than 1048576 nodes", doc, err)
		}
		if n := m1.TotalAlloc - m0.TotalAlloc; n > 1<<20 {
			t.Errorf("%.20q: %d bytes allocated to refuse a document of %d", doc, n, len(doc))
		}
	}
}
