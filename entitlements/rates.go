package entitlements

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"sort"

	"github.com/meterline/meterline/schemas"
)

// Cost returns what units cost at rate r, in micro-credits:
// units × r.MicroCredits / r.PerUnits, rounded half up, computed in 128
// bits. ok is false when the cost does not fit 64 bits (or the input is
// out of range: negative units or micro-credits, per_units not positive).
func Cost(units int64, r schemas.Rate) (cost int64, ok bool) {
	if units < 0 || r.MicroCredits < 0 || r.PerUnits <= 0 {
		return 0, false
	}
	// p = units × micro_credits < 2^126; cost = ⌊(2p + per) / (2·per)⌋.
	hi, lo := bits.Mul64(uint64(units), uint64(r.MicroCredits))
	hi, lo = hi<<1|lo>>63, lo<<1
	var carry uint64
	lo, carry = bits.Add64(lo, uint64(r.PerUnits), 0)
	hi += carry
	d := uint64(r.PerUnits) << 1 // < 2^64: PerUnits < 2^63
	if hi >= d {
		return 0, false // the quotient needs more than 64 bits
	}
	q, _ := bits.Div64(hi, lo, d)
	if q > math.MaxInt64 {
		return 0, false
	}
	return int64(q), true
}

// ValidateRateCard checks a RateCard and returns every problem at once
// (past maxFieldErrors, and past the bounds on versions and rates, it
// names no more), each named by its field path ("versions[1].rates.tokens.per_units").
// With meters, rates on meters whose aggregation is not SUM or COUNT are
// refused.
func ValidateRateCard(c *schemas.RateCard, meters Meters) error {
	var f fieldErrs
	if len(c.Versions) > MaxRateVersions {
		f.must("versions", "%d versions, more than %d", len(c.Versions), MaxRateVersions)
	}
	total := 0
	for _, v := range c.Versions {
		total += len(v.Rates)
	}
	// Past the bounds the card is refused: its further items are not
	// looked at (one written straight to the topic may hold tens of
	// thousands).
	budget := MaxRates + 1
	for i, v := range c.Versions[:min(len(c.Versions), MaxRateVersions+1)] {
		if budget <= 0 {
			break
		}
		at := fmt.Sprintf("versions[%d]", i)
		if v.EffectiveFrom < 0 {
			f.add(at+".effective_from", "must not be negative (got %d)", v.EffectiveFrom)
		}
		if i > 0 && v.EffectiveFrom <= c.Versions[i-1].EffectiveFrom {
			f.add(at+".effective_from", "must be after versions[%d]'s (versions are in time order, no two at the same time)", i-1)
		}
		rates := v.Rates[:min(len(v.Rates), budget)]
		budget -= len(rates)
		seen := map[string]bool{}
		for j, r := range rates {
			rat := fmt.Sprintf("%s.rates[%d]", at, j)
			if r.Meter == "" || len(r.Meter) > MaxNameBytes || schemas.CheckText("", r.Meter, true) != nil {
				f.checkName(rat+".meter", r.Meter)
			} else {
				rat = at + ".rates." + pathPart(r.Meter)
				if seen[r.Meter] {
					f.add(rat, "the meter has more than one rate in this version")
				}
				seen[r.Meter] = true
			}
			if r.MicroCredits < 0 {
				f.add(rat+".micro_credits", "must not be negative (got %d)", r.MicroCredits)
			}
			if r.PerUnits <= 0 {
				f.add(rat+".per_units", "must be positive (got %d)", r.PerUnits)
			}
			if meters != nil && r.Meter != "" {
				if agg, declared := meters(r.Meter); declared && !Charged(agg) {
					f.add(rat, "%s is a %s meter: rates apply to SUM and COUNT meters only", r.Meter, agg)
				}
			}
		}
	}
	if total > MaxRates {
		f.must("versions", "%d rates in all, more than %d", total, MaxRates)
	}
	return f.err()
}

// rateCard is one card record as RateHistory keeps it: its broker time
// and the versions that can still price an event (the last one in effect
// at written, and those after it), each with its rates sorted by meter.
type rateCard struct {
	written  int64
	versions []schemas.RateVersion
}

// RateHistory is every rate card record that a future event can be priced
// by, in the order they were read. The zero value has no card.
type RateHistory struct {
	cards []rateCard
}

// Set adds the card read at broker time written; nil is a tombstone (no
// card from written on). A card whose broker time is earlier than the
// previous card's (a broker clock that stepped back) counts as written at
// the previous card's time, so that cards stay in read order. A card that
// prices every event it could price as the previous card does (the same
// card written again: a billing system's periodic sync) is not kept: Rate
// answers alike without it. An invalid card returns the FieldErrors of
// ValidateRateCard and changes nothing.
func (h *RateHistory) Set(written int64, c *schemas.RateCard) error {
	return h.SetWithin(written, c, math.MinInt64, math.MinInt64)
}

// SetWithin is Set, refusing the card (ErrTooManyVersions) when the
// history already holds MaxVersions cards in effect at or after since
// (the one in effect at since, and those read after it), as
// Timeline.SetWithin does a key's versions: the history is one state
// value, written whole with each card. The cards in effect at or after
// bytesSince count against MaxVersionBytes. With since and bytesSince at
// most the horizon the history has been pruned to (Prune), the counts
// are the same however far it has been pruned.
func (h *RateHistory) SetWithin(written int64, c *schemas.RateCard, since, bytesSince int64) error {
	if c != nil {
		if err := ValidateRateCard(c, nil); err != nil {
			return err
		}
	}
	n := len(h.cards)
	if n > 0 && written < h.cards[n-1].written {
		written = h.cards[n-1].written
	}
	var versions []schemas.RateVersion
	if c != nil {
		for _, v := range pricingVersions(c, written) {
			rates := append([]schemas.Rate(nil), v.Rates...)
			sort.Slice(rates, func(i, j int) bool { return rates[i].Meter < rates[j].Meter })
			versions = append(versions, schemas.RateVersion{EffectiveFrom: v.EffectiveFrom, Rates: rates})
		}
	}
	if n > 0 && samePricing(h.cards[n-1].versions, versions, written) {
		return nil
	}
	first := max(sort.Search(n, func(i int) bool { return h.cards[i].written > since })-1, 0)
	if k := n - first; k >= MaxVersions {
		return fmt.Errorf("%w: %d rate cards (the most is %d)", ErrTooManyVersions, k, MaxVersions)
	}
	size := versionsBytes(versions)
	first = max(sort.Search(n, func(i int) bool { return h.cards[i].written > bytesSince })-1, 0)
	for _, c := range h.cards[first:] {
		size += versionsBytes(c.versions)
	}
	if size > MaxVersionBytes {
		return fmt.Errorf("%w: %d bytes of rate cards (the most is %d)", ErrTooManyVersions, size, MaxVersionBytes)
	}
	h.cards = append(h.cards, rateCard{written: written, versions: versions})
	return nil
}

// pricingVersions returns the versions of c that can price an event once
// the card is read at written: the last one in effect at written and
// those after it. The ones before can price no event with this card: an
// event is priced by it only at event times at or after written.
func pricingVersions(c *schemas.RateCard, written int64) []schemas.RateVersion {
	first := 0
	for i, v := range c.Versions {
		if v.EffectiveFrom <= written {
			first = i
		}
	}
	return c.Versions[min(first, len(c.Versions)):]
}

// CheckCardBytes refuses (ErrTooManyVersions) a card whose versions that
// can price an event once it is read at written (pricingVersions) take
// more than MaxVersionBytes in a RateHistory: SetWithin refuses such a
// card whatever the history holds, though Kafka takes it (10,000 rates
// of 50-byte meter names are about 540 KB). A card read later keeps no
// more versions, so one that passes at the time it is written passes
// when it is read.
func CheckCardBytes(c *schemas.RateCard, written int64) error {
	if size := versionsBytes(pricingVersions(c, written)); size > MaxVersionBytes {
		return fmt.Errorf("%w: %d bytes of rate cards (the most is %d)", ErrTooManyVersions, size, MaxVersionBytes)
	}
	return nil
}

// versionsBytes returns about the size of a card's versions in the
// encoding of a RateHistory (MarshalBinary), at least their size.
func versionsBytes(vs []schemas.RateVersion) int {
	n := 0
	for _, v := range vs {
		n += binary.MaxVarintLen64 * 2
		for _, r := range v.Rates {
			n += len(r.Meter) + binary.MaxVarintLen64*3
		}
	}
	return n
}

// samePricing reports whether the versions a and b (each in
// EffectiveFrom order, rates sorted by meter) give every meter the same
// rate, or none alike, at every event time from on.
func samePricing(a, b []schemas.RateVersion, from int64) bool {
	sa, sb := pricingFrom(a, from), pricingFrom(b, from)
	return slices.EqualFunc(sa, sb, func(x, y schemas.RateVersion) bool {
		return x.EffectiveFrom == y.EffectiveFrom && slices.Equal(x.Rates, y.Rates)
	})
}

// pricingFrom returns what the versions price from event time from on,
// as versions: the first from from (no rates if none is in effect then),
// and each later one that changes a rate.
func pricingFrom(vs []schemas.RateVersion, from int64) []schemas.RateVersion {
	out := []schemas.RateVersion{{EffectiveFrom: from}}
	for _, v := range vs {
		last := &out[len(out)-1]
		switch {
		case v.EffectiveFrom <= from:
			last.Rates = v.Rates
		case !slices.Equal(v.Rates, last.Rates):
			out = append(out, v)
		}
	}
	return out
}

// Rate returns the rate of a meter for an event that arrived at arrival
// with event time eventTime: in the last card read at or before the
// earlier of the two, the version in effect at eventTime. ok is false when
// there is none (the event costs nothing).
func (h *RateHistory) Rate(arrival, eventTime int64, meter string) (r schemas.Rate, ok bool) {
	// Binary searches written out: this runs once per event decided, and
	// sort.Search's closures cost more than the search.
	at := min(arrival, eventTime)
	lo, hi := 0, len(h.cards)
	for lo < hi {
		if m := int(uint(lo+hi) >> 1); h.cards[m].written > at {
			hi = m
		} else {
			lo = m + 1
		}
	}
	if lo == 0 {
		return schemas.Rate{}, false
	}
	vs := h.cards[lo-1].versions
	lo, hi = 0, len(vs)
	for lo < hi {
		if m := int(uint(lo+hi) >> 1); vs[m].EffectiveFrom > eventTime {
			hi = m
		} else {
			lo = m + 1
		}
	}
	if lo == 0 {
		return schemas.Rate{}, false
	}
	rs := vs[lo-1].Rates
	if len(rs) <= smallRates {
		// A card prices a few meters: comparing them is cheaper than a
		// search (the rates are sorted by meter, the first equal is the
		// one the search finds).
		for i := range rs {
			if rs[i].Meter == meter {
				return rs[i], true
			}
		}
		return schemas.Rate{}, false
	}
	lo, hi = 0, len(rs)
	for lo < hi {
		if m := int(uint(lo+hi) >> 1); rs[m].Meter < meter {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < len(rs) && rs[lo].Meter == meter {
		return rs[lo], true
	}
	return schemas.Rate{}, false
}

// smallRates is how many rates Rate compares one by one.
const smallRates = 8

// Prune drops the cards no future event can be priced by, given that every
// future event has min(arrival, event_time) ≥ horizon: it keeps the last
// card read at or before horizon and those after it.
func (h *RateHistory) Prune(horizon int64) {
	k := sort.Search(len(h.cards), func(i int) bool { return h.cards[i].written > horizon }) - 1
	if k > 0 {
		h.cards = append(h.cards[:0], h.cards[k:]...)
	}
}

// Len returns the number of cards kept.
func (h *RateHistory) Len() int { return len(h.cards) }
