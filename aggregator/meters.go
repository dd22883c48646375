package aggregator

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// Aggregation is how a meter's events combine within a period.
type Aggregation string

// The aggregations (DESIGN §5).
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
	// without one groups under the empty value.
	GroupBy []string `json:"group_by,omitempty"`
	// Unit and Description document the meter.
	Unit        string `json:"unit,omitempty"`
	Description string `json:"description,omitempty"`
}

// Catalog is the set of declared meters.
type Catalog struct {
	meters map[string]*Meter
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
// Unknown keys are an error. Every problem is reported at once.
func ParseMeters(b []byte) (*Catalog, error) {
	var f metersFile
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		return nil, fmt.Errorf("meters: %w", err)
	}
	c := &Catalog{meters: map[string]*Meter{}}
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
		c.meters[m.Name] = &m
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return c, nil
}

// LoadMeters reads a meters file.
func LoadMeters(path string) (*Catalog, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("meters: %w", err)
	}
	return ParseMeters(b)
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
