package entitlements

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/meterline/meterline/internal/clip"
	"github.com/meterline/meterline/internal/yamlbound"
)

// Limits of decodeStrict: the nodes one document may expand to (aliases
// included; a rate card at its limits has about 25,000, and a document at
// this limit, the parser's tree and the converted one, allocates about
// 150 MB: TestNodeLimitDocumentBounded), the text of its
// keys and scalars as JSON writes them (jsonTextLen), aliases expanded (as much as the 16 MiB document
// `entitlements set` reads holds without aliases: a scalar of 64 KiB
// named by 10,000 aliases, a 100 KB document, was 640 MiB of text and
// took gigabytes to convert), how deep they nest, and how many problems
// it names before it stops.
const (
	maxDocNodes  = 1 << 17
	maxDocText   = 16 << 20
	maxDocDepth  = 64
	maxDocErrors = 20
)

// errEmptyDocument refuses a document with no content (an empty or
// truncated file, comments alone, null): written, it would be a record
// with no fields, a default plan that caps nothing or a rate card that
// prices nothing. A record with no fields is written {}.
var errEmptyDocument = errors.New("the document is empty (a record with no fields is written {})")

// decodeStrict reads one YAML (or JSON) document into v as it is written:
// a key given twice, a field v does not have (names match exactly, not in
// any case as encoding/json would), a merge key, a second document or an
// empty one (errEmptyDocument) is an error; a name keeps its text (YAML 1.2: `on` and `007` are names,
// not true and 7); a scalar reaches an Int or a rate as its text, so a
// number is read from its digits, never through a float. Each problem is
// named by its field path.
func decodeStrict(b []byte, v any) error {
	if yamlbound.NodesPast(b, maxDocNodes) != 0 {
		// Refused before the parser builds every node: a flat list of
		// millions took gigabytes.
		var f fieldErrs
		f.add("document", "the document expands to more than %d nodes", maxDocNodes)
		return f.err()
	}
	doc, err := parseOne(b)
	if err != nil {
		return err
	}
	s := strictDoc{nodes: maxDocNodes, text: maxDocText}
	tree := s.value(doc, reflect.TypeOf(v).Elem(), "", 0)
	if err := s.err(); err != nil {
		return err
	}
	// Not HTML-escaped: '<', '>' and '&' stay one byte (jsonTextLen).
	var j bytes.Buffer
	je := json.NewEncoder(&j)
	je.SetEscapeHTML(false)
	if err := je.Encode(tree); err != nil {
		return err
	}
	jd := json.NewDecoder(&j)
	jd.DisallowUnknownFields()
	return jd.Decode(v)
}

// parseOne parses the one document of b. A JSON object that the YAML
// parser refuses is read as JSON (jsonDoc): the YAML parser refuses a
// quoted key of more than 1,024 characters, which `get -o json` prints
// for a name of 1,023 or 1,024 bytes.
func parseOne(b []byte) (*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errEmptyDocument
		}
		if t := bytes.TrimSpace(b); len(t) > 0 && t[0] == '{' && utf8.Valid(t) && json.Valid(t) {
			return jsonDoc(b)
		}
		return nil, err
	}
	if len(doc.Content) == 0 || doc.Content[0].Kind == yaml.ScalarNode && doc.Content[0].Tag == "!!null" {
		return nil, errEmptyDocument
	}
	var more yaml.Node
	switch err := dec.Decode(&more); {
	case err == nil:
		return nil, fmt.Errorf("line %d: more than one document: write one record at a time", more.Line)
	case !errors.Is(err, io.EOF):
		return nil, err
	}
	return &doc, nil
}

// jsonDoc reads a JSON document (valid, an object) as the node tree the
// YAML parser makes of it: each key and value with its line, a key given
// twice kept twice (strictDoc refuses it), a scalar's text as written.
// jsonLineBytes counts the bytes jsonDoc's line numbering read, for the
// test that each is read once (TestLongJSONRateCardRead).
var jsonLineBytes atomic.Int64

func jsonDoc(b []byte) (*yaml.Node, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	// The line at the decoder's offset, counted on from the last one
	// asked (from the start each time, a document of 10 MB took 20 s).
	seen, lines := 0, 1
	line := func() int {
		off := int(dec.InputOffset())
		lines += bytes.Count(b[seen:off], []byte{'\n'})
		jsonLineBytes.Add(int64(off - seen))
		seen = off
		return lines
	}
	var value func() (*yaml.Node, error)
	value = func() (*yaml.Node, error) {
		// The line of the token about to be read: past the spaces and
		// separator before it.
		rest := b[dec.InputOffset():]
		l := line() + bytes.Count(rest[:len(rest)-len(bytes.TrimLeft(rest, " \t\r\n,:"))], []byte{'\n'})
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		n := &yaml.Node{Kind: yaml.ScalarNode, Line: l}
		switch t := tok.(type) {
		case json.Delim:
			n.Kind, n.Tag = yaml.SequenceNode, "!!seq"
			if t == '{' {
				n.Kind, n.Tag = yaml.MappingNode, "!!map"
			}
			for dec.More() {
				c, err := value()
				if err != nil {
					return nil, err
				}
				n.Content = append(n.Content, c)
			}
			_, err := dec.Token()
			return n, err
		case string:
			n.Tag, n.Value = "!!str", t
		case json.Number:
			n.Tag, n.Value = "!!float", t.String()
			if _, err := strconv.ParseInt(t.String(), 10, 64); err == nil {
				n.Tag = "!!int"
			}
		case bool:
			n.Tag, n.Value = "!!bool", strconv.FormatBool(t)
		case nil:
			n.Tag, n.Value = "!!null", "null"
		}
		return n, nil
	}
	n, err := value()
	if err != nil {
		return nil, err
	}
	return &yaml.Node{Kind: yaml.DocumentNode, Line: 1, Content: []*yaml.Node{n}}, nil
}

// strictDoc converts a YAML node tree to the JSON-able tree of a Go type,
// collecting the problems it finds.
type strictDoc struct {
	nodes, text int // what is left of maxDocNodes and maxDocText
	spent       bool
	errs        fieldErrs
	dropped     int
}

// spend charges nodes and text bytes at path to the budgets: false once
// either is spent, named the first time.
func (s *strictDoc) spend(path string, nodes, text int) bool {
	s.nodes -= nodes
	s.text -= text
	if s.nodes >= 0 && s.text >= 0 {
		return true
	}
	if !s.spent {
		s.spent = true
		if s.nodes < 0 {
			s.add(path, "the document expands to more than %d nodes", maxDocNodes)
		} else {
			s.add(path, "the document expands to more than %d MiB of text", maxDocText>>20)
		}
	}
	return false
}

func (s *strictDoc) add(path, format string, args ...any) {
	if len(s.errs) >= maxDocErrors {
		s.dropped++
		return
	}
	if path == "" {
		path = "document"
	}
	s.errs.add(path, format, args...)
}

func (s *strictDoc) err() error {
	if s.dropped > 0 {
		s.errs = append(s.errs, fmt.Errorf("and %d more problems", s.dropped))
	}
	return s.errs.err()
}

// jsonTextLen is the length of s as decodeStrict's JSON writes it,
// quotes left out, or more: a quote, a backslash, \n, \r and \t take two
// bytes, another control character six (\u0001), U+2028 and U+2029 six
// for three, a byte that is not UTF-8 six (\ufffd). The text limit counts
// it, so that aliases of a scalar JSON escapes convert to no more text
// than those of one it does not (a scalar of 64 KiB of \x01 named by 255
// aliases was 96 MiB of JSON, 820 MB allocated).
func jsonTextLen(s string) int {
	n := len(s)
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\' || c == '\n' || c == '\r' || c == '\t':
			n++
		case c < ' ':
			n += 5
		case c >= utf8.RuneSelf:
			r, size := utf8.DecodeRuneInString(s[i:])
			switch {
			case r == utf8.RuneError && size == 1:
				n += 5
			case r == '\u2028' || r == '\u2029':
				n += 3
			}
			i += size - 1
		}
	}
	return n
}

// join is the path of a key below path.
func join(path, name string) string {
	if path == "" {
		return pathPart(name)
	}
	return path + "." + pathPart(name)
}

var unmarshalerType = reflect.TypeFor[json.Unmarshaler]()

// value returns the JSON-able form of n for a value of type t at path: a
// map for a struct or a map, a slice, a string, a bool or nil.
func (s *strictDoc) value(n *yaml.Node, t reflect.Type, path string, depth int) any {
	if !s.spend(path, 1, jsonTextLen(n.Value)) {
		return nil
	}
	if depth > maxDocDepth {
		s.add(path, "nested more than %d deep", maxDocDepth)
		return nil
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) == 0 {
			return nil
		}
		return s.value(n.Content[0], t, path, depth+1)
	case yaml.AliasNode:
		return s.value(n.Alias, t, path, depth+1)
	case yaml.MappingNode:
		return s.mapping(n, t, path, depth)
	case yaml.SequenceNode:
		if t.Kind() != reflect.Slice {
			s.add(path, "a list where %s is expected (line %d)", kindOf(t), n.Line)
			return nil
		}
		out := make([]any, 0, len(n.Content))
		for i, c := range n.Content {
			out = append(out, s.value(c, t.Elem(), fmt.Sprintf("%s[%d]", path, i), depth+1))
		}
		return out
	}
	// A scalar.
	if n.Tag == "!!null" {
		return nil
	}
	switch {
	case reflect.PointerTo(t).Implements(unmarshalerType) || t.Kind() == reflect.String:
		return n.Value // its text: an Int or a rate parses it
	case t.Kind() == reflect.Bool:
		var b bool
		if n.Tag != "!!bool" || n.Decode(&b) != nil {
			s.add(path, "must be true or false (got %q)", clip.To(n.Value, clip.Echo))
			return nil
		}
		return b
	}
	s.add(path, "a value where %s is expected (line %d)", kindOf(t), n.Line)
	return nil
}

// mapping converts a mapping node for a struct (its keys are the fields'
// JSON names) or a map (its keys are names, kept as written).
func (s *strictDoc) mapping(n *yaml.Node, t reflect.Type, path string, depth int) any {
	var fields map[string]reflect.Type
	switch t.Kind() {
	case reflect.Struct:
		fields = map[string]reflect.Type{}
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if f.IsExported() && name != "" && name != "-" {
				fields[name] = f.Type
			}
		}
	case reflect.Map:
	default:
		s.add(path, "a mapping where %s is expected (line %d)", kindOf(t), n.Line)
		return nil
	}
	out := map[string]any{}
	lines := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind == yaml.AliasNode {
			k = k.Alias
		}
		switch {
		case k.Kind != yaml.ScalarNode:
			s.add(path, "a key that is not a name (line %d)", k.Line)
			continue
		case k.Tag == "!!merge":
			s.add(path, "merge keys (<<) are not supported (line %d): write the fields out, or quote a name \"<<\"", k.Line)
			continue
		}
		if !s.spend(path, 0, jsonTextLen(k.Value)) {
			return nil
		}
		name, at := k.Value, join(path, clip.To(k.Value, clip.Echo))
		if l, dup := lines[name]; dup {
			s.add(at, "given twice (lines %d and %d)", l, k.Line)
			continue
		}
		lines[name] = k.Line
		et := t
		if fields != nil {
			ft, ok := fields[name]
			if !ok {
				s.add(path, "unknown field %q (line %d)", clip.To(name, clip.Echo), k.Line)
				continue
			}
			et = ft
		} else {
			et = t.Elem()
		}
		out[name] = s.value(v, et, at, depth+1)
	}
	return out
}

// kindOf names what a value of t is, for an error.
func kindOf(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Struct, reflect.Map:
		return "a mapping"
	case reflect.Slice:
		return "a list"
	case reflect.Bool:
		return "true or false"
	}
	return "a value"
}
