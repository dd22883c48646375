package aggregator

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/theory/jsonpath"
	"sigs.k8s.io/yaml"

	"github.com/meterline/meterline/internal/yamlbound"
)

// Aggregation is how a meter's events combine within a period.
type Aggregation string

// The aggregations (docs/design.md, Meters and aggregations).
const (
	Sum         Aggregation = "SUM"
	Count       Aggregation = "COUNT"
	Max         Aggregation = "MAX"
	UniqueCount Aggregation = "UNIQUE_COUNT"
	Latest      Aggregation = "LATEST"
)

// Meter declares one meter.
type Meter struct {
	// Name is the meter name events carry.
	Name string `json:"name"`
	// Aggregation is SUM (default), COUNT, MAX, UNIQUE_COUNT or LATEST.
	Aggregation Aggregation `json:"aggregation,omitempty"`
	// Property is the event property UNIQUE_COUNT counts distinct values
	// of. Required for UNIQUE_COUNT, not allowed otherwise.
	Property string `json:"property,omitempty"`
	// GroupBy lists event properties that split the aggregate; an event
	// without one groups under the empty value. In the meters file it is a
	// list of property names, or (OpenMeter's form) a map from property
	// name to the JSONPath of its value in a CloudEvent's data; either way
	// GroupBy holds the names, sorted.
	GroupBy []string `json:"group_by,omitempty"`
	// Unit and Description document the meter.
	Unit        string `json:"unit,omitempty"`
	Description string `json:"description,omitempty"`

	// The fields below map CloudEvents received by the HTTP ingest
	// (docs/ingest.md, Meters: from a CloudEvent to usage) to this meter,
	// as OpenMeter's meter definitions do. They do not change how the
	// aggregator counts.

	// EventType is the CloudEvents type whose events feed this meter.
	// Several meters may share one: a CloudEvent then feeds each of them.
	// Empty: only producers that name the meter feed it.
	EventType string `json:"event_type,omitempty"`
	// ValueProperty is a singular JSONPath (RFC 9535) into the
	// CloudEvent's data, such as $.tokens: the quantity for SUM, MAX and
	// LATEST, the value counted for UNIQUE_COUNT (stored as the event
	// property named by Property). Required with EventType except for
	// COUNT, which counts events and takes none.
	ValueProperty string `json:"value_property,omitempty"`
	// GroupByPaths maps each GroupBy name to the JSONPath of its value in
	// a CloudEvent's data: from group_by written as a map, or $['name']
	// for a name in a list. Nil when group_by is empty.
	GroupByPaths map[string]string `json:"-"`
	// Scale is the number of decimal places a CloudEvent's value may have:
	// the quantity is the value times 10^Scale, which must be an integer
	// (a value of 1.25 with scale 2 is 125 base units). Default 0: values
	// must be integers in the meter's base unit. SUM, MAX and LATEST only;
	// at most 18.
	Scale int `json:"scale,omitempty"`
}

// MaxScale bounds Meter.Scale: 10^18 still fits a 64-bit quantity.
const MaxScale = 18

// UnmarshalJSON reads a meter of the meters file, with group_by as a list
// of names or a map from name to JSONPath. Unknown keys are an error.
func (m *Meter) UnmarshalJSON(b []byte) error {
	type plain Meter // without this method
	var raw struct {
		plain
		GroupBy json.RawMessage `json:"group_by,omitempty"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		return err
	}
	*m = Meter(raw.plain)
	m.GroupBy, m.GroupByPaths = nil, nil
	g := bytes.TrimSpace(raw.GroupBy)
	switch {
	case len(g) == 0 || bytes.Equal(g, []byte("null")):
	case g[0] == '{':
		var paths map[string]string
		if err := json.Unmarshal(g, &paths); err != nil {
			return fmt.Errorf("group_by: a map must map names to JSONPath strings: %w", err)
		}
		m.GroupByPaths = paths
		for name := range paths {
			m.GroupBy = append(m.GroupBy, name)
		}
	default:
		if err := json.Unmarshal(g, &m.GroupBy); err != nil {
			return fmt.Errorf("group_by: want a list of property names or a map from name to JSONPath: %w", err)
		}
		if len(m.GroupBy) > 0 {
			m.GroupByPaths = make(map[string]string, len(m.GroupBy))
			for _, name := range m.GroupBy {
				m.GroupByPaths[name] = "$[" + strconv.Quote(name) + "]"
			}
		}
	}
	return nil
}

// Catalog is the set of declared meters.
type Catalog struct {
	meters map[string]*Meter
	// byEventType lists, per CloudEvents type, the meters it feeds, in the
	// order of the meters file.
	byEventType map[string][]*Meter
}

type metersFile struct {
	Meters []Meter `json:"meters"`
}

// ParseMeters parses a meters YAML document:
//
//	meters:
//	  - name: api_calls
//	    aggregation: SUM
//	    group_by: [model]
//	    unit: requests
//	  - name: active_users
//	    aggregation: UNIQUE_COUNT
//	    property: user_id
//
// For the HTTP ingest, a meter also says which CloudEvents feed it
// (OpenMeter's meter definition, in snake case):
//
//   - name: tokens
//     aggregation: SUM
//     event_type: prompt
//     value_property: $.tokens
//     group_by: {model: $.model}
//
// Unknown keys are an error. Every problem is reported at once.
func ParseMeters(b []byte) (*Catalog, error) {
	if err := yamlbound.Check(b); err != nil {
		return nil, fmt.Errorf("meters: %w", err)
	}
	var f metersFile
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		return nil, fmt.Errorf("meters: %w", err)
	}
	c := &Catalog{meters: map[string]*Meter{}, byEventType: map[string][]*Meter{}}
	var errs []error
	for i := range f.Meters {
		m := f.Meters[i]
		at := fmt.Sprintf("meters[%d]", i)
		if m.Name == "" {
			errs = append(errs, fmt.Errorf("meters: %s.name is required", at))
			continue
		}
		at = fmt.Sprintf("meters[%d] (%s)", i, m.Name)
		if _, dup := c.meters[m.Name]; dup {
			errs = append(errs, fmt.Errorf("meters: %s is declared twice", at))
		}
		m.Aggregation = Aggregation(strings.ToUpper(string(m.Aggregation)))
		if m.Aggregation == "" {
			m.Aggregation = Sum
		}
		switch m.Aggregation {
		case Sum, Count, Max, Latest:
			if m.Property != "" {
				errs = append(errs, fmt.Errorf("meters: %s.property is only for UNIQUE_COUNT", at))
			}
		case UniqueCount:
			if m.Property == "" {
				errs = append(errs, fmt.Errorf("meters: %s.property is required for UNIQUE_COUNT", at))
			}
		default:
			errs = append(errs, fmt.Errorf("meters: %s.aggregation %q is not SUM, COUNT, MAX, UNIQUE_COUNT or LATEST", at, m.Aggregation))
		}
		seen := map[string]bool{}
		for _, g := range m.GroupBy {
			if g == "" || seen[g] {
				errs = append(errs, fmt.Errorf("meters: %s.group_by has an empty or repeated property %q", at, g))
			}
			seen[g] = true
		}
		sort.Strings(m.GroupBy)
		errs = append(errs, validateIngest(at, &m)...)
		c.meters[m.Name] = &m
		if m.EventType != "" {
			c.byEventType[m.EventType] = append(c.byEventType[m.EventType], &m)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return c, nil
}

// maxMetersBytes bounds a meters file: as much text as its aliases may
// expand to (yamlbound.MaxText), far more than a catalog of thousands of
// meters takes.
const maxMetersBytes = yamlbound.MaxText

// LoadMeters reads a meters file, refusing one larger than maxMetersBytes.
func LoadMeters(path string) (*Catalog, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("meters: %w", err)
	}
	defer f.Close()
	b, err := yamlbound.ReadAll(f, maxMetersBytes)
	if tl := (*yamlbound.TooLargeError)(nil); errors.As(err, &tl) {
		return nil, fmt.Errorf("meters: %s: the file is %w", path, err)
	}
	if err != nil {
		return nil, fmt.Errorf("meters: %s: %w", path, err)
	}
	return ParseMeters(b)
}

// validateIngest checks the fields that map CloudEvents to the meter.
func validateIngest(at string, m *Meter) []error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("meters: %s."+format, append([]any{at}, args...)...))
	}
	if m.EventType == "" {
		if m.ValueProperty != "" {
			bad("value_property is only for meters with an event_type")
		}
		if m.Scale != 0 {
			bad("scale is only for meters with an event_type")
		}
	} else {
		switch {
		case m.Aggregation == Count && m.ValueProperty != "":
			bad("value_property is not allowed for COUNT, which counts events")
		case m.Aggregation != Count && m.ValueProperty == "":
			bad("value_property is required for %s with an event_type (a JSONPath such as $.tokens)", m.Aggregation)
		}
	}
	if m.ValueProperty != "" {
		if err := singularPath(m.ValueProperty); err != nil {
			bad("value_property %q: %v", m.ValueProperty, err)
		}
	}
	for _, name := range m.GroupBy {
		if p := m.GroupByPaths[name]; p != "" {
			if err := singularPath(p); err != nil {
				bad("group_by.%s %q: %v", name, p, err)
			}
		}
	}
	switch {
	case m.Scale < 0 || m.Scale > MaxScale:
		bad("scale %d is not between 0 and %d", m.Scale, MaxScale)
	case m.Scale != 0 && m.Aggregation != Sum && m.Aggregation != Max && m.Aggregation != Latest:
		bad("scale is only for SUM, MAX and LATEST")
	}
	return errs
}

// singularPath checks that p is a JSONPath selecting at most one value.
func singularPath(p string) error {
	q, err := jsonpath.Parse(p)
	if err != nil {
		return err
	}
	if q.Query().Singular() == nil {
		return errors.New("selects several values; want a singular path such as $.tokens or $.usage.input")
	}
	return nil
}

// ForEventType returns the meters a CloudEvent of type t feeds, in the
// order of the meters file; none when no meter declares t.
func (c *Catalog) ForEventType(t string) []*Meter {
	if c == nil {
		return nil
	}
	return c.byEventType[t]
}

// EventTypes returns the event types of the declared meters, sorted.
func (c *Catalog) EventTypes() []string {
	if c == nil {
		return nil
	}
	out := make([]string, 0, len(c.byEventType))
	for t := range c.byEventType {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

var undeclared = &Meter{Aggregation: Sum}

// Lookup returns the meter's declaration; an undeclared meter is a SUM
// without groups, and ok is false.
func (c *Catalog) Lookup(name string) (m *Meter, ok bool) {
	if c != nil {
		if m, ok := c.meters[name]; ok {
			return m, true
		}
	}
	return undeclared, false
}

// Len returns the number of declared meters.
func (c *Catalog) Len() int {
	if c == nil {
		return 0
	}
	return len(c.meters)
}

// Period is the length of a billing period.
type Period string

// Period lengths. Periods are calendar-aligned in UTC.
const (
	Hour  Period = "hour"
	Day   Period = "day"
	Month Period = "month"
)

// Validate checks the period name.
func (p Period) Validate() error {
	switch p {
	case Hour, Day, Month:
		return nil
	}
	return fmt.Errorf("aggregator: period %q is not hour, day or month", p)
}

// Bounds returns the period [start, end) containing ms, in epoch ms.
func (p Period) Bounds(ms int64) (start, end int64) {
	t := time.UnixMilli(ms).UTC()
	var s, e time.Time
	switch p {
	case Hour:
		s = t.Truncate(time.Hour)
		e = s.Add(time.Hour)
	case Day:
		s = time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
		e = s.AddDate(0, 0, 1)
	default:
		s = time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
		e = s.AddDate(0, 1, 0)
	}
	return s.UnixMilli(), e.UnixMilli()
}
