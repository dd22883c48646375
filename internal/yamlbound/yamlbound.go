// Package yamlbound refuses a YAML document whose aliases expand it past a
// bound, before a reader that expands them builds it. sigs.k8s.io/yaml
// (the meters file, --config) converts a document to JSON, writing an
// aliased value once per alias: yaml.v2 limits the share of aliases, not
// the text they name, so a 105 KB file (a 64 KiB scalar named by 10,000
// aliases) took 11 to 14 s and 5 to 6 GB to load. ReadAll bounds the
// file itself: a multi-GB file, or /dev/zero, given by mistake.
package yamlbound

import (
	"bytes"
	"fmt"
	"io"

	"go.yaml.in/yaml/v3"
)

// Limits of Check: the nodes the first document expands to and the bytes
// of its keys and scalars. (yaml.v3 refuses collections nested more than
// 10,000 deep; an alias's expansion, counted where it is defined too, can
// reach about 140,000 within MaxNodes: Check's recursion stays shallow.)
const (
	MaxNodes = 1 << 20
	MaxText  = 16 << 20
)

// Check returns an error when the first document of b, its aliases
// expanded, has more than MaxNodes nodes or MaxText bytes of keys and
// scalars. A b that does not parse passes: the reader reports its error.
// A b found past MaxNodes without its aliases expanded (NodesPast) is
// refused before it is parsed.
func Check(b []byte) error {
	if line := NodesPast(b, MaxNodes); line != 0 {
		return fmt.Errorf("line %d: the document expands to more than %d nodes", line, MaxNodes)
	}
	var doc yaml.Node
	if yaml.NewDecoder(bytes.NewReader(b)).Decode(&doc) != nil {
		return nil
	}
	w := walker{nodes: MaxNodes, text: MaxText, open: map[*yaml.Node]bool{}}
	return w.walk(&doc)
}

type walker struct {
	nodes, text int
	open        map[*yaml.Node]bool // the anchored nodes being expanded
}

func (w *walker) walk(n *yaml.Node) error {
	w.nodes--
	w.text -= len(n.Value)
	switch {
	case w.nodes < 0:
		return fmt.Errorf("line %d: the document expands to more than %d nodes", n.Line, MaxNodes)
	case w.text < 0:
		return fmt.Errorf("line %d: the document expands to more than %d MiB of text", n.Line, MaxText>>20)
	}
	if n.Kind == yaml.AliasNode {
		if n.Alias == nil || w.open[n.Alias] {
			return nil // an alias of itself: the reader refuses it
		}
		w.open[n.Alias] = true
		defer delete(w.open, n.Alias)
		return w.walk(n.Alias)
	}
	for _, c := range n.Content {
		if err := w.walk(c); err != nil {
			return err
		}
	}
	return nil
}

// TooLargeError is ReadAll's error for a file longer than its limit; its
// text, "larger than 1 MiB", follows the file's name: "the file is ".
type TooLargeError struct {
	Limit int // bytes
}

func (e *TooLargeError) Error() string {
	if e.Limit >= 1<<20 && e.Limit%(1<<20) == 0 {
		return fmt.Sprintf("larger than %d MiB", e.Limit>>20)
	}
	return fmt.Sprintf("larger than %d bytes", e.Limit)
}

// ReadAll reads r to its end, as io.ReadAll, unless it holds more than
// limit bytes: it then returns a *TooLargeError, having read limit+1
// bytes, whatever r is (/dev/zero, which never ends, too). A document cut
// at the limit could parse as another, shorter one, so it is refused
// rather than cut.
func ReadAll(r io.Reader, limit int) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, int64(limit)+1))
	if err == nil && len(b) > limit {
		return nil, &TooLargeError{Limit: limit}
	}
	return b, err
}
