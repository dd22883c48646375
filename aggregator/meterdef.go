package aggregator

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/schemas"
)

// Meter definitions in the state. An aggregate's working state means what
// its meter's definition made of its events: a MAX state holds the
// largest quantity so far, a SUM the total, a UNIQUE_COUNT the number of
// distinct values of one property (each value a 'u' key), and the
// group_by names split the aggregates. Read under another definition it
// gives wrong revisions and adjustments, silently. So the state records,
// for each period and meter it holds state of, the definition that state
// was built with ('M' P meter), and a partition whose recorded
// definitions differ from the meters file is refused at its load
// (ErrMeterChanged).
//
// What is recorded is meterDef: the aggregation, the UNIQUE_COUNT
// property, the group_by names, and what a quantity is (value_property,
// the JSONPath the HTTP ingest reads it from, and scale, its decimal
// places: its unit). A meter's name is the key; its unit and description
// document it, its event_type and the JSONPaths of its group_by values
// say which CloudEvents feed it and where their group values are: none of
// them changes what a state holds, and they may change at any time. An
// event_type added or removed brings or takes its value_property: that is
// not a change (sameDef); a value_property changed to another path is.
// Adding a meter changes no state. Removing one makes it undeclared, which
// counts as a SUM without groups or scale: allowed if that is what it was
// (its value_property, if any, goes with its event_type), refused
// while it has state otherwise.
//
// A record lives as long as its period's state: written with the first
// state key of the meter in the period (an OPEN aggregate, the working
// state of an adjustment in a final period, or a line an adjustment was
// booked into), deleted with the period's
// marker when its state expires at end + W + B + S (expireChunk). A meter's
// definition can therefore change once the partition holds no state of
// it; until then a new definition goes under a new meter name.
//
// State built before definitions were recorded has no keyMeterDefs: its
// 'a' and 'f' keys are scanned once at load, and the next transaction
// records the configured definition for each period and meter they hold,
// and keyMeterDefs (a change made at that same restart cannot be seen).

// ErrMeterChanged is returned (wrapped) when the meters file defines a
// meter otherwise than the state of one of its periods was built with
// (checkMeterDefs).
var ErrMeterChanged = errors.New("a meter's definition is not the one its state was built with")

// meterDef is what a meter's state means, as recorded in the state: a
// compact JSON object whose fields are in this order, empty ones left out,
// so that a definition encodes the same in every version that does not
// add a field it uses.
type meterDef struct {
	Aggregation   Aggregation `json:"aggregation"`
	Property      string      `json:"property,omitempty"`
	GroupBy       []string    `json:"group_by,omitempty"`
	ValueProperty string      `json:"value_property,omitempty"`
	Scale         int         `json:"scale,omitempty"`
}

// definition returns the meter's definition as the state records it, for
// example {"aggregation":"UNIQUE_COUNT","property":"user_id","group_by":["model"]}.
func (m *Meter) definition() []byte {
	return meterDef{Aggregation: m.Aggregation, Property: m.Property, GroupBy: m.GroupBy,
		ValueProperty: m.ValueProperty, Scale: m.Scale}.encode()
}

func (d meterDef) encode() []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	// A struct of strings, ints and a slice of strings always encodes.
	_ = enc.Encode(d)
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// sameDef reports whether the recorded definition was and m's, now, give
// a state the same meaning. A value_property recorded or configured
// alone is the event_type that came or went with it: which CloudEvents
// feed the meter, as producers naming it fed it before or after. Only a
// value_property changed from one path to another is a change.
func sameDef(was, now []byte) bool {
	if bytes.Equal(was, now) {
		return true
	}
	var a, b meterDef
	if json.Unmarshal(was, &a) != nil || json.Unmarshal(now, &b) != nil {
		return false
	}
	if a.ValueProperty == "" || b.ValueProperty == "" {
		a.ValueProperty, b.ValueProperty = "", ""
	}
	return bytes.Equal(a.encode(), b.encode())
}

// defKey is a period and a meter whose definition the state records.
type defKey struct {
	start int64
	meter string
}

// loadMeterDefs reads the recorded definitions into pt.defs and checks
// them against the meters file (checkMeterDefs). State that does not
// record definitions yet has its pairs listed for the next transaction
// (writeMeterDefs). It runs after the period markers are loaded.
func (pt *partition) loadMeterDefs(st stateReader) error {
	pt.defs = map[defKey]struct{}{}
	pt.defsPending = pt.defsPending[:0]
	var changed []defChange
	if err := st.Scan([]byte{pfxMeterDef}, []byte{pfxMeterDef + 1}, func(k, v []byte) error {
		if len(k) < 9 {
			return fmt.Errorf("aggregator: partition %d: corrupt meter definition key %q", pt.p, k)
		}
		dk := defKey{start: int64(binary.BigEndian.Uint64(k[1:9])), meter: string(k[9:])}
		pt.defs[dk] = struct{}{}
		m, declared := pt.pr.cfg.Meters.Lookup(dk.meter)
		if now := m.definition(); !sameDef(v, now) {
			changed = append(changed, defChange{defKey: dk, was: string(v), now: string(now), declared: declared})
		}
		return nil
	}); err != nil {
		return err
	}
	if len(changed) > 0 {
		return pt.meterChangedError(changed)
	}
	_, ok, err := st.Get(keyMeterDefs)
	if err != nil || ok {
		pt.writeDefsMark = false
		return err
	}
	// Not recorded yet: new state, or built before definitions were.
	pt.writeDefsMark = true
	for _, pfx := range []byte{pfxOpen, pfxFinal} {
		if err := st.Scan([]byte{pfx}, []byte{pfx + 1}, func(k, _ []byte) error {
			if len(k) < 9 {
				return fmt.Errorf("aggregator: partition %d: corrupt aggregate key %q", pt.p, k)
			}
			parts, err := schemas.SplitFramed(k[9:])
			if err != nil || len(parts) < 2 {
				// No meter to record: its FINAL revision refuses it
				// (aggOutput).
				return nil
			}
			dk := defKey{start: int64(binary.BigEndian.Uint64(k[1:9])), meter: parts[1]}
			if _, ok := pt.defs[dk]; !ok {
				pt.defs[dk] = struct{}{}
				pt.defsPending = append(pt.defsPending, dk)
			}
			return nil
		}); err != nil {
			return err
		}
	}
	return nil
}

// writeMeterDefs records in tx what loadMeterDefs found unrecorded: the
// configured definition of each period and meter that state built
// before definitions were recorded holds, and keyMeterDefs.
func (pt *partition) writeMeterDefs(tx *stream.Tx) {
	for _, dk := range pt.defsPending {
		m, _ := pt.pr.cfg.Meters.Lookup(dk.meter)
		tx.Put(periodKey(pfxMeterDef, dk.start, []byte(dk.meter)), m.definition())
	}
	pt.defsPending = pt.defsPending[:0]
	if pt.writeDefsMark {
		tx.Put(keyMeterDefs, []byte(meterDefsVersion))
		pt.writeDefsMark = false
	}
}

// meterDefsVersion is keyMeterDefs' value: the encoding of meterDef.
const meterDefsVersion = "json"

// recordDef records m's definition for period start in tx, unless the
// state already records one: called when the meter's first state key in
// the period is written.
func (pt *partition) recordDef(tx *stream.Tx, start int64, meter string, m *Meter) {
	if _, ok := pt.defs[defKey{start, meter}]; ok {
		return
	}
	pt.defs[defKey{start, strings.Clone(meter)}] = struct{}{}
	tx.Put(periodKey(pfxMeterDef, start, []byte(meter)), m.definition())
}

// expireDefs deletes the recorded definitions of period start, whose
// state is gone.
func (pt *partition) expireDefs(tx *stream.Tx, start int64) error {
	var keys [][]byte
	if err := tx.Scan(periodKey(pfxMeterDef, start), periodKey(pfxMeterDef, start+1), func(k, _ []byte) error {
		keys = append(keys, bytes.Clone(k))
		return nil
	}); err != nil {
		return err
	}
	for _, k := range keys {
		tx.Delete(k)
		delete(pt.defs, defKey{start, string(k[9:])})
	}
	return nil
}

// defChange is a period and meter whose recorded definition (was) is not
// the configured one (now).
type defChange struct {
	defKey
	was, now string
	declared bool
}

// meterChangedError says which meters changed, in which periods, and
// what to do.
func (pt *partition) meterChangedError(changed []defChange) error {
	sort.Slice(changed, func(i, j int) bool {
		if changed[i].meter != changed[j].meter {
			return changed[i].meter < changed[j].meter
		}
		return changed[i].start < changed[j].start
	})
	const most = 5
	var b strings.Builder
	var until int64
	for i, c := range changed {
		_, end := pt.pr.cfg.Period.Bounds(c.start)
		until = max(until, pt.expiresAt(end))
		if i == most {
			fmt.Fprintf(&b, "; and %d more", len(changed)-most)
			continue
		}
		if i > most {
			continue
		}
		if i > 0 {
			b.WriteString("; ")
		}
		status := "OPEN"
		if _, final := pt.finals[c.start]; final {
			status = "final, its working state kept for adjustments"
		}
		now := "the meters file now declares " + c.now
		switch {
		case !c.declared && pt.pr.cfg.StrictMeters:
			now = "the meters file no longer declares it (its state would be finalized and adjusted as an undeclared meter's, " + c.now + ")"
		case !c.declared:
			now = "the meters file no longer declares it, and an undeclared meter counts as " + c.now
		}
		fmt.Fprintf(&b, "meter %q: its state of period %s (%s) was built as %s, %s", c.meter, msTime(c.start), status, c.was, now)
	}
	return fmt.Errorf("aggregator: partition %d: %w: %s. Read under another definition that state would give wrong revisions and adjustments: "+
		"put the meter's definition back (a meter's unit, description, event_type and group_by paths may change), "+
		"or declare the new definition under a new meter name and send its events there; the definition of a meter "+
		"can change once no state of it is left in %s (its periods final and expired at end + W + B + S: not before %s)",
		pt.p, ErrMeterChanged, b.String(), pt.pr.cfg.Topics.AggregateChangelogTopic(), msTime(until))
}
