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
	"github.com/theory/jsonpath/spec"

	"github.com/meterline/meterline/aggregator"
	"github.com/meterline/meterline/producer"
	"github.com/meterline/meterline/schemas"
)

// mapper turns a CloudEvent into usage events, one per meter its type
// feeds, by the meters file (docs/ingest.md, Meters: from a CloudEvent to
// usage).
type mapper struct {
	byType map[string][]*meterMap
	// maxMeters and maxProps are the most meters a type feeds and the
	// most properties its usage events have together, for sizing.
	maxMeters, maxProps int
}

// meterMap is one meter with its JSONPaths compiled.
type meterMap struct {
	m      *aggregator.Meter
	value  *dataPath   // nil for COUNT
	groups []groupPath // sorted by name
	// props are the properties of the meter's usage events, sorted by
	// name: each group, and the UNIQUE_COUNT property, which takes the
	// place of a group of the same name.
	props []propSlot
}

type groupPath struct {
	name string
	path *dataPath
	raw  string
}

// propSlot is one property of a meter's usage events: group k's value,
// or (group -1) the meter's value.
type propSlot struct {
	name  string
	group int
}

// dataPath is a compiled value_property or group_by path. A simple path,
// of names and indexes only ($.a.b, $['a'], $.items[0], $.a[-1]: every
// singular path, which is all a meters file takes), is looked up in the
// data's text (steps); any other is evaluated on the decoded data.
type dataPath struct {
	path   *jsonpath.Path
	simple bool
	steps  []pathStep
}

// pathStep is one step of a simple path: a member's name, or (isIndex)
// an array's element, counted from the end when index is negative.
type pathStep struct {
	name    string
	index   int
	isIndex bool
}

func compilePath(raw string) (*dataPath, error) {
	p, err := jsonpath.Parse(raw)
	if err != nil {
		return nil, err
	}
	dp := &dataPath{path: p, simple: true}
	for _, seg := range p.Query().Segments() {
		sels := seg.Selectors()
		var step pathStep
		ok := len(sels) == 1 && !seg.IsDescendant()
		if ok {
			switch sel := sels[0].(type) {
			case spec.Name:
				step.name = string(sel)
			case spec.Index:
				step.index, step.isIndex = int(sel), true
			default:
				ok = false
			}
		}
		if !ok {
			dp.simple, dp.steps = false, nil
			break
		}
		dp.steps = append(dp.steps, step)
	}
	return dp, nil
}

func newMapper(cat *aggregator.Catalog) (*mapper, error) {
	mp := &mapper{byType: map[string][]*meterMap{}}
	for _, t := range cat.EventTypes() {
		for _, m := range cat.ForEventType(t) {
			mm := &meterMap{m: m}
			if m.ValueProperty != "" {
				p, err := compilePath(m.ValueProperty)
				if err != nil {
					return nil, fmt.Errorf("ingest: meter %s: value_property %q: %w", m.Name, m.ValueProperty, err)
				}
				mm.value = p
			}
			for _, name := range m.GroupBy {
				raw := m.GroupByPaths[name]
				p, err := compilePath(raw)
				if err != nil {
					return nil, fmt.Errorf("ingest: meter %s: group_by %s %q: %w", m.Name, name, raw, err)
				}
				mm.groups = append(mm.groups, groupPath{name: name, path: p, raw: raw})
			}
			sort.Slice(mm.groups, func(i, j int) bool { return mm.groups[i].name < mm.groups[j].name })
			for k, g := range mm.groups {
				mm.props = append(mm.props, propSlot{name: g.name, group: k})
			}
			if m.Aggregation == aggregator.UniqueCount && mm.value != nil {
				k := sort.Search(len(mm.props), func(k int) bool { return mm.props[k].name >= m.Property })
				if k < len(mm.props) && mm.props[k].name == m.Property {
					mm.props[k].group = -1 // the value wins over a group of the same name
				} else {
					mm.props = append(mm.props[:k], append([]propSlot{{name: m.Property, group: -1}}, mm.props[k:]...)...)
				}
			}
			mp.byType[t] = append(mp.byType[t], mm)
		}
		props := 0
		for _, mm := range mp.byType[t] {
			props += len(mm.props)
		}
		mp.maxMeters, mp.maxProps = max(mp.maxMeters, len(mp.byType[t])), max(mp.maxProps, props)
	}
	return mp, nil
}

// usage is one usage event of a request on its way to a record.
type usage struct {
	ue schemas.UsageEvent
	// time is the event time at full precision (producer.AppendRecord).
	time time.Time
	// input is the index of the request's event it came from.
	input int
	// mm is the meter that mapped it from a CloudEvent; nil for an event
	// of Meterline's format, whose fields keep their names.
	mm *meterMap
}

// mapScratch is what mapping reuses from one CloudEvent to the next.
type mapScratch struct {
	data    dataView
	decoded any // the data decoded, for paths that are not simple
	didDec  bool
	groups  []jvalue
}

// events appends the usage events of ce (input i of req), one per meter
// its type feeds, to req.usages; received is the event time of an event
// without one. Each meter's event gets the identity (subject, meter,
// producer.EventID(source, id)): the same (source, id) is the same event,
// as in OpenMeter. Nothing is appended when ce is refused.
func (mp *mapper) events(req *request, i int, ce *CloudEvent, received time.Time) *fieldError {
	meters := mp.byType[ce.Type]
	if len(meters) == 0 {
		return &fieldError{"type", CodeUnknownEventType, fmt.Sprintf("%q feeds no meter (the meters file declares no event_type %q)", clip(ce.Type), clip(ce.Type))}
	}
	sc := &req.scratch
	sc.data.reset(ce.Data)
	sc.decoded, sc.didDec = nil, false
	t := ce.Time
	if t.IsZero() {
		t = received
	}
	id := producer.EventID(ce.Source, ce.ID)
	first, firstProp := len(req.usages), len(req.props)
	for _, mm := range meters {
		u := usage{ue: schemas.UsageEvent{EventID: id, CustomerID: ce.Subject, Meter: mm.m.Name, Source: ce.Source, Quantity: 1},
			time: t, input: i, mm: mm}
		sc.groups = sc.groups[:0]
		for _, g := range mm.groups {
			v, fe := sc.selectOne(g.path, g.raw)
			if fe == nil && v.kind != jMissing { // missing: groups under the empty value
				v.s, fe = scalarString(v, g.raw)
				v.kind = jString
			}
			if fe != nil {
				req.usages, req.props = req.usages[:first], req.props[:firstProp]
				return fe
			}
			sc.groups = append(sc.groups, v)
		}
		var unique string
		if mm.value != nil {
			raw := mm.m.ValueProperty
			v, fe := sc.selectOne(mm.value, raw)
			if fe == nil && v.kind == jMissing {
				fe = &fieldError{dataField(raw), schemas.ReasonInvalid, mm.missingValue(ce.Data)}
			}
			if fe == nil {
				if mm.m.Aggregation == aggregator.UniqueCount {
					unique, fe = scalarString(v, raw)
				} else {
					u.ue.Quantity, fe = quantity(v, mm.m.Scale, raw, mm.m.Name)
				}
			}
			if fe != nil {
				req.usages, req.props = req.usages[:first], req.props[:firstProp]
				return fe
			}
		}
		start := len(req.props)
		for _, p := range mm.props {
			switch {
			case p.group < 0:
				req.props = append(req.props, schemas.Property{Name: p.name, Value: unique})
			case sc.groups[p.group].kind != jMissing:
				req.props = append(req.props, schemas.Property{Name: p.name, Value: sc.groups[p.group].s})
			}
		}
		if len(req.props) > start {
			u.ue.Properties = req.props[start:len(req.props):len(req.props)]
		}
		req.usages = append(req.usages, u)
	}
	return nil
}

// field names the field of the request a usage event's field came from:
// for a CloudEvent, customer_id → subject, quantity → the value's member
// of data, ...; for an event of Meterline's format (mm nil), itself.
func (mm *meterMap) field(f string) string {
	if mm == nil {
		return f
	}
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

// reason is the reason of a usage event's field error as the request's
// field reads it: the properties as a whole (their size) are the values
// the meter keeps of data, which field names as "data", not all of it.
func (mm *meterMap) reason(f, reason string) string {
	if mm == nil || f != "properties" {
		return reason
	}
	return fmt.Sprintf("the values meter %s keeps of data (its group_by and property): %s", mm.m.Name, reason)
}

// jvalue is the value a path selected, as the mapper needs it.
type jvalue struct {
	kind jkind
	s    string // a string's value, a number's text, "true" or "false"
}

type jkind uint8

const (
	jMissing   jkind = iota // nothing selected, or null
	jString                 // a string
	jNumber                 // a number
	jBool                   // true or false
	jComposite              // an object or an array
)

// selectOne returns the one value the singular path p selects in the
// data; jMissing when it selects nothing.
func (sc *mapScratch) selectOne(p *dataPath, raw string) (jvalue, *fieldError) {
	if p.simple {
		if v, ok := sc.data.lookup(p.steps); ok {
			return v, nil
		}
	}
	if sc.data.text == "" {
		return jvalue{}, nil
	}
	if !sc.didDec {
		sc.didDec = true
		dec := json.NewDecoder(bytes.NewReader([]byte(sc.data.text)))
		dec.UseNumber() // exact decimals, never float64
		if err := dec.Decode(&sc.decoded); err != nil {
			return jvalue{}, &fieldError{"data", schemas.ReasonInvalid, err.Error()}
		}
	}
	nodes := p.path.Select(sc.decoded)
	switch len(nodes) {
	case 0:
		return jvalue{}, nil
	case 1:
		return anyJValue(nodes[0]), nil
	}
	return jvalue{}, &fieldError{dataField(raw), schemas.ReasonInvalid, fmt.Sprintf("%s selects %d values; want one", raw, len(nodes))}
}

// anyJValue is a decoded JSON value (UseNumber) as a jvalue.
func anyJValue(v any) jvalue {
	switch x := v.(type) {
	case nil:
		return jvalue{} // null counts as missing
	case string:
		return jvalue{kind: jString, s: x}
	case json.Number:
		return jvalue{kind: jNumber, s: string(x)}
	case bool:
		return jvalue{kind: jBool, s: strconv.FormatBool(x)}
	}
	return jvalue{kind: jComposite}
}

// missingValue is the reason of a value the meter's path does not find
// in data (an event's data text; "" for none): OpenMeter's meter
// processing cannot use such an event either.
func (mm *meterMap) missingValue(data string) string {
	name, raw := mm.m.Name, mm.m.ValueProperty
	if data == "" {
		return fmt.Sprintf("is missing: the event has no data; meter %s reads its value from %s", name, raw)
	}
	return fmt.Sprintf("is missing: meter %s reads its value from %s", name, raw)
}

// dataField names the data member a JSONPath points at: $.tokens →
// data.tokens.
func dataField(path string) string { return "data" + strings.TrimPrefix(path, "$") }

// scalarString is a group-by or UNIQUE_COUNT value as a string: a string
// as it is, a number as written, a boolean as true or false.
func scalarString(v jvalue, raw string) (string, *fieldError) {
	if v.kind == jComposite {
		return "", &fieldError{dataField(raw), schemas.ReasonInvalid, "is an object or an array; want a string, a number or a boolean"}
	}
	return v.s, nil
}

// quantity converts a value (a JSON number or a numeric string) to an
// integer quantity in the meter's base unit: value × 10^scale, exactly.
// A value that is not an integer in the base unit, negative, or beyond 64
// bits is refused, saying why.
func quantity(v jvalue, scale int, raw, meter string) (int64, *fieldError) {
	bad := func(format string, args ...any) (int64, *fieldError) {
		return 0, &fieldError{dataField(raw), schemas.ReasonInvalid, fmt.Sprintf(format, args...)}
	}
	if v.kind != jNumber && v.kind != jString {
		return bad("must be a number or a numeric string (meter %s)", meter)
	}
	s, why := v.s, ""
	if v.kind == jString {
		s, why = numericString(s)
	}
	q := int64(0)
	if why == "" {
		q, why = decimalQuantity(s, scale)
	}
	if why != "" {
		return bad("%q %s (meter %s)", clip(v.s), why, meter)
	}
	return q, nil
}

// numericString reads a quantity sent as a string as OpenMeter reads it
// (strconv.ParseFloat, NaN and infinities refused) where that is a
// decimal, and returns it in JSON's number syntax for decimalQuantity: a
// sign + dropped, leading zeros dropped, a missing digit before or after
// the decimal point ("5.", ".5") filled in or dropped. What ParseFloat
// takes beyond a decimal (hexadecimal, _ between digits, inf, infinity,
// nan) is refused, saying why.
func numericString(s string) (string, string) {
	body := strings.TrimLeft(s, "+-")
	switch {
	case len(s)-len(body) > 1:
		return "", "is not a decimal number"
	case len(body) > 1 && body[0] == '0' && (body[1] == 'x' || body[1] == 'X'):
		return "", "is hexadecimal; send a decimal number"
	case strings.IndexByte(body, '_') >= 0:
		return "", "has _ in it; send the digits alone"
	case strings.EqualFold(body, "inf") || strings.EqualFold(body, "infinity") || strings.EqualFold(body, "nan"):
		return "", "is not a finite number"
	}
	mant, exp := body, ""
	if i := strings.IndexAny(body, "eE"); i >= 0 {
		mant, exp = body[:i], body[i:]
	}
	intPart, frac, dot := strings.Cut(mant, ".")
	if intPart == "" && frac == "" || !allDigits(intPart) || !allDigits(frac) {
		return "", "is not a decimal number"
	}
	if intPart = strings.TrimLeft(intPart, "0"); intPart == "" {
		intPart = "0"
	}
	out := intPart
	if dot && frac != "" {
		out += "." + frac
	}
	if strings.HasPrefix(s, "-") {
		out = "-" + out
	}
	return out + exp, "" // decimalQuantity checks the digits and the exponent
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
		// JSON allows leading zeros in an exponent ("1e007"): they do
		// not make it large.
		if e = strings.TrimLeft(e, "0"); e == "" {
			e = "0"
		}
		// An exponent of more than 18 digits is beyond any mantissa a
		// body holds, either way: 10^18 digits, against the millions of
		// a body of --max-body-bytes. Up to that it is taken exactly: a
		// mantissa of a million digits brings 10^-1000000 back into
		// range.
		if len(e) > 18 {
			e = "999999999999999999"
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
