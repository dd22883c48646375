package ingest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/theory/jsonpath"

	"github.com/meterline/meterline/aggregator"
	"github.com/meterline/meterline/producer"
	"github.com/meterline/meterline/schemas"
)

// mapper turns a CloudEvent into usage events, one per meter its type
// feeds, by the meters file (DESIGN §11).
type mapper struct {
	byType map[string][]*meterMap
}

// meterMap is one meter with its JSONPaths compiled.
type meterMap struct {
	m      *aggregator.Meter
	value  *jsonpath.Path // nil for COUNT
	groups []groupPath    // sorted by name
	// needsData: the meter reads the event's data.
	needsData bool
}

type groupPath struct {
	name string
	path *jsonpath.Path
	raw  string
}

func newMapper(cat *aggregator.Catalog) (*mapper, error) {
	mp := &mapper{byType: map[string][]*meterMap{}}
	for _, t := range cat.EventTypes() {
		for _, m := range cat.ForEventType(t) {
			mm := &meterMap{m: m}
			if m.ValueProperty != "" {
				p, err := jsonpath.Parse(m.ValueProperty)
				if err != nil {
					return nil, fmt.Errorf("ingest: meter %s: value_property %q: %w", m.Name, m.ValueProperty, err)
				}
				mm.value = p
			}
			for _, name := range m.GroupBy {
				raw := m.GroupByPaths[name]
				p, err := jsonpath.Parse(raw)
				if err != nil {
					return nil, fmt.Errorf("ingest: meter %s: group_by %s %q: %w", m.Name, name, raw, err)
				}
				mm.groups = append(mm.groups, groupPath{name: name, path: p, raw: raw})
			}
			sort.Slice(mm.groups, func(i, j int) bool { return mm.groups[i].name < mm.groups[j].name })
			mm.needsData = mm.value != nil || len(mm.groups) > 0
			mp.byType[t] = append(mp.byType[t], mm)
		}
	}
	return mp, nil
}

// events returns the usage events of ce, one per meter its type feeds.
// received is the event time of an event without one. Each meter's event
// gets the identity (subject, meter, producer.EventID(source, id)): the
// same (source, id) is the same event, as in OpenMeter.
//
// The second result names, per usage event, the CloudEvent's field for
// each field of the usage event (customer_id → subject, quantity → the
// value's member of data, ...).
func (mp *mapper) events(ce *CloudEvent, received time.Time) ([]producer.Event, []fieldMap, *fieldError) {
	meters := mp.byType[ce.Type]
	if len(meters) == 0 {
		return nil, nil, &fieldError{"type", CodeUnknownEventType, fmt.Sprintf("%q feeds no meter (the meters file declares no event_type %q)", ce.Type, ce.Type)}
	}
	var data any
	for _, mm := range meters {
		if mm.needsData {
			if len(ce.Data) == 0 {
				break // each meter reports what it misses
			}
			dec := json.NewDecoder(bytes.NewReader(ce.Data))
			dec.UseNumber() // exact decimals, never float64
			if err := dec.Decode(&data); err != nil {
				return nil, nil, &fieldError{"data", schemas.ReasonInvalid, err.Error()}
			}
			break
		}
	}
	t := ce.Time
	if t.IsZero() {
		t = received
	}
	id := producer.EventID(ce.Source, ce.ID)
	out := make([]producer.Event, 0, len(meters))
	fms := make([]fieldMap, 0, len(meters))
	for _, mm := range meters {
		e := producer.Event{EventID: id, CustomerID: ce.Subject, Meter: mm.m.Name, EventTime: t, Source: ce.Source, Quantity: 1}
		if len(mm.groups) > 0 || mm.m.Aggregation == aggregator.UniqueCount {
			e.Properties = make(map[string]string, len(mm.groups)+1)
		}
		for _, g := range mm.groups {
			v, ok, fe := selectOne(g.path, g.raw, data)
			if fe != nil {
				return nil, nil, fe
			}
			if !ok {
				continue // groups under the empty value
			}
			s, fe := scalarString(v, g.raw)
			if fe != nil {
				return nil, nil, fe
			}
			e.Properties[g.name] = s
		}
		if mm.value != nil {
			raw := mm.m.ValueProperty
			v, ok, fe := selectOne(mm.value, raw, data)
			if fe != nil {
				return nil, nil, fe
			}
			if !ok {
				return nil, nil, &fieldError{dataField(raw), schemas.ReasonInvalid,
					fmt.Sprintf("is missing: meter %s reads its value from %s", mm.m.Name, raw)}
			}
			if mm.m.Aggregation == aggregator.UniqueCount {
				s, fe := scalarString(v, raw)
				if fe != nil {
					return nil, nil, fe
				}
				e.Properties[mm.m.Property] = s
			} else {
				q, fe := quantity(v, mm.m.Scale, raw, mm.m.Name)
				if fe != nil {
					return nil, nil, fe
				}
				e.Quantity = q
			}
		}
		out = append(out, e)
		fms = append(fms, mm.fieldMap)
	}
	return out, fms, nil
}

// fieldMap names the CloudEvent field a usage event's field came from.
func (mm *meterMap) fieldMap(f string) string {
	switch f {
	case "customer_id":
		return "subject"
	case "event_id":
		return "id"
	case "event_time":
		return "time"
	case "meter":
		return "type"
	case "source", "event":
		return f
	case "quantity":
		if mm.value != nil {
			return dataField(mm.m.ValueProperty)
		}
		return "data"
	}
	if name, ok := strings.CutPrefix(f, "properties."); ok {
		for _, g := range mm.groups {
			if g.name == name {
				return dataField(g.raw)
			}
		}
		if name == mm.m.Property && mm.value != nil {
			return dataField(mm.m.ValueProperty)
		}
	}
	return "data"
}

// selectOne returns the one value the singular path selects in data;
// ok is false when it selects nothing.
func selectOne(p *jsonpath.Path, raw string, data any) (v any, ok bool, fe *fieldError) {
	if data == nil {
		return nil, false, nil
	}
	nodes := p.Select(data)
	switch len(nodes) {
	case 0:
		return nil, false, nil
	case 1:
		if nodes[0] == nil {
			return nil, false, nil // null counts as missing
		}
		return nodes[0], true, nil
	}
	return nil, false, &fieldError{dataField(raw), schemas.ReasonInvalid, fmt.Sprintf("%s selects %d values; want one", raw, len(nodes))}
}

// dataField names the data member a JSONPath points at: $.tokens →
// data.tokens.
func dataField(path string) string { return "data" + strings.TrimPrefix(path, "$") }

// scalarString is a group-by or UNIQUE_COUNT value as a string: a string
// as it is, a number as written, a boolean as true or false.
func scalarString(v any, raw string) (string, *fieldError) {
	switch x := v.(type) {
	case string:
		return x, nil
	case json.Number:
		return string(x), nil
	case bool:
		return strconv.FormatBool(x), nil
	}
	return "", &fieldError{dataField(raw), schemas.ReasonInvalid, "is an object or an array; want a string, a number or a boolean"}
}

// quantity converts a value (a JSON number or a numeric string) to an
// integer quantity in the meter's base unit: value × 10^scale, exactly.
// A value that is not an integer in the base unit, negative, or beyond 64
// bits is refused, saying why.
func quantity(v any, scale int, raw, meter string) (int64, *fieldError) {
	bad := func(format string, args ...any) (int64, *fieldError) {
		return 0, &fieldError{dataField(raw), schemas.ReasonInvalid, fmt.Sprintf(format, args...)}
	}
	var s string
	switch x := v.(type) {
	case json.Number:
		s = string(x)
	case string:
		s = x
	default:
		return bad("must be a number or a numeric string (meter %s)", meter)
	}
	q, why := decimalQuantity(s, scale)
	if why != "" {
		if len(s) > 64 {
			s = s[:64] + "…"
		}
		return bad("%q %s (meter %s)", s, why, meter)
	}
	return q, nil
}

// decimalQuantity parses s, a decimal in JSON's number syntax, and returns
// s × 10^scale when that is an integer in [0, 2^63); otherwise why not.
func decimalQuantity(s string, scale int) (int64, string) {
	if scale == 0 && len(s) > 0 && len(s) <= 18 && allDigits(s) && (s[0] != '0' || len(s) == 1) {
		n, _ := strconv.ParseInt(s, 10, 64) // fast path: a plain integer
		return n, ""
	}
	rest := s
	neg := strings.HasPrefix(rest, "-")
	rest = strings.TrimPrefix(rest, "-")
	i := 0
	for i < len(rest) && isDigit(rest[i]) {
		i++
	}
	intPart := rest[:i]
	rest = rest[i:]
	if intPart == "" || (len(intPart) > 1 && intPart[0] == '0') {
		return 0, "is not a decimal number"
	}
	frac := ""
	if strings.HasPrefix(rest, ".") {
		j := 1
		for j < len(rest) && isDigit(rest[j]) {
			j++
		}
		frac = rest[1:j]
		if frac == "" {
			return 0, "is not a decimal number"
		}
		rest = rest[j:]
	}
	exp := 0
	if len(rest) > 0 && (rest[0] == 'e' || rest[0] == 'E') {
		e := rest[1:]
		if len(e) > 0 && (e[0] == '+' || e[0] == '-') {
			e = e[1:]
		}
		if e == "" || !allDigits(e) {
			return 0, "is not a decimal number"
		}
		if len(e) > 6 {
			e = "999999" // beyond any 64-bit quantity either way
		}
		exp, _ = strconv.Atoi(e)
		if rest[1] == '-' {
			exp = -exp
		}
		rest = ""
	}
	if rest != "" {
		return 0, "is not a decimal number"
	}
	digits := strings.TrimLeft(intPart+frac, "0")
	if digits == "" {
		return 0, "" // zero, whatever its sign
	}
	if neg {
		return 0, "is negative; quantities are not"
	}
	shift := exp - len(frac) + scale
	if shift < 0 {
		if -shift >= len(digits) || strings.TrimLeft(digits[len(digits)+shift:], "0") != "" {
			if scale == 0 {
				return 0, "is not an integer in the meter's base unit (declare a scale in the meters file to accept decimals)"
			}
			return 0, fmt.Sprintf("has more than %d decimal places (the meter's scale)", scale)
		}
		digits = digits[:len(digits)+shift]
		shift = 0
	}
	if len(digits)+shift > 19 {
		return 0, "is beyond the 64-bit range of a quantity"
	}
	n, err := strconv.ParseInt(digits+strings.Repeat("0", shift), 10, 64)
	if err != nil {
		return 0, "is beyond the 64-bit range of a quantity"
	}
	return n, ""
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isDigit(s[i]) {
			return false
		}
	}
	return true
}
