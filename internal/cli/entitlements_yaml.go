package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"

	yaml3 "go.yaml.in/yaml/v3"
)

// entYAML is the YAML form of a document that get, list and balance
// print: its JSON form, keys sorted, as the YAML 1.2 parser of `set`
// reads it back. Every name is written so that it reads as itself: a
// meter or grant id `<<` quoted (plain, it is a merge key), one longer
// than 1,024 characters as an explicit key (`? name`; a plain or quoted
// key is at most 1,024 characters long in YAML).
func entYAML(v any) ([]byte, error) {
	j, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.UseNumber()
	n, err := jsonNode(dec)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	enc := yaml3.NewEncoder(&out)
	enc.SetIndent(2)
	enc.CompactSeqIndent()
	if err := enc.Encode(n); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// jsonNode reads the next JSON value of dec as a YAML node, the keys of
// an object sorted.
func jsonNode(dec *json.Decoder) (*yaml3.Node, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		if t == '[' {
			n := &yaml3.Node{Kind: yaml3.SequenceNode, Tag: "!!seq"}
			for dec.More() {
				c, err := jsonNode(dec)
				if err != nil {
					return nil, err
				}
				n.Content = append(n.Content, c)
			}
			_, err := dec.Token()
			return n, err
		}
		return jsonObject(dec)
	case string:
		return strNode(t), nil
	case json.Number:
		tag := "!!float"
		if _, err := strconv.ParseInt(t.String(), 10, 64); err == nil {
			tag = "!!int"
		}
		return &yaml3.Node{Kind: yaml3.ScalarNode, Tag: tag, Value: t.String()}, nil
	case bool:
		return &yaml3.Node{Kind: yaml3.ScalarNode, Tag: "!!bool", Value: strconv.FormatBool(t)}, nil
	case nil:
		return &yaml3.Node{Kind: yaml3.ScalarNode, Tag: "!!null", Value: "null"}, nil
	}
	return nil, fmt.Errorf("unexpected JSON token %v", tok)
}

// jsonObject reads the members of a JSON object, its '{' read, as a
// mapping node with its keys sorted.
func jsonObject(dec *json.Decoder) (*yaml3.Node, error) {
	type member struct{ k, v *yaml3.Node }
	var ms []member
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return nil, err
		}
		ks, ok := k.(string)
		if !ok {
			return nil, errors.New("a JSON object key that is not a string")
		}
		v, err := jsonNode(dec)
		if err != nil {
			return nil, err
		}
		ms = append(ms, member{strNode(ks), v})
	}
	if _, err := dec.Token(); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	slices.SortFunc(ms, func(a, b member) int {
		switch {
		case a.k.Value < b.k.Value:
			return -1
		case a.k.Value > b.k.Value:
			return 1
		}
		return 0
	})
	n := &yaml3.Node{Kind: yaml3.MappingNode, Tag: "!!map"}
	for _, m := range ms {
		n.Content = append(n.Content, m.k, m.v)
	}
	return n, nil
}

// strNode is a string's node: quoted where a YAML 1.1 reader would take
// it plain for a bool (on, yes, y), as a merge key (<<) or base 60 (1:20),
// and wherever a YAML 1.2 reader would take it for something else.
func strNode(s string) *yaml3.Node {
	n := &yaml3.Node{Kind: yaml3.ScalarNode, Tag: "!!str", Value: s}
	if yaml11Special.MatchString(s) {
		n.Style = yaml3.DoubleQuotedStyle
	}
	return n
}

// yaml11Special matches the plain scalars that YAML 1.1 (the printer get
// used before, and many readers) reads as other than a string, and the
// merge key.
var yaml11Special = regexp.MustCompile(`^(y|Y|yes|Yes|YES|n|N|no|No|NO|on|On|ON|off|Off|OFF|true|True|TRUE|false|False|FALSE|<<|[-+]?[0-9][0-9_]*(:[0-5]?[0-9])+(\.[0-9_]*)?)$`)
