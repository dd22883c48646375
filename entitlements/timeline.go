package entitlements

import (
	"fmt"
	"math"
	"sort"
)

// MaxVersions bounds the versions of one key that take effect within a
// span before a record's broker time (SetWithin; for the Ledger,
// Config.Span), the one in effect at its start and those scheduled for
// later included. A record past it is refused (ErrTooManyVersions): an
// operator changing a customer's entitlements thousands of times a month
// is a runaway script, and the state must stay bounded. A record that
// changes nothing takes no version (Set). The count depends on the
// records alone, never on how far a stage has pruned: a stage that lags
// keeps older versions too, and refuses the same records as one that is
// caught up.
const MaxVersions = 256

// ErrTooManyVersions is returned (wrapped) by Timeline.Set when the
// timeline already holds MaxVersions versions that a future event may
// need. The record is refused as invalid; what was in effect stays.
var ErrTooManyVersions = fmt.Errorf("%w: too many versions of one key within the window", ErrInvalid)

// MaxVersionBytes bounds the encoded size of the versions of one key
// in effect from a time before a record's broker time on (for the Ledger,
// Ledger.bytesSpan; a stage keeps them all), the record's own included (a
// rate card counts its cards alike). A key's versions are one state
// value, written whole to the changelog: under the broker's record size
// (1 MB by default) with room for the versions a stage far behind keeps
// from before that, a plan of MaxCaps caps and MaxGrants grants of
// MaxNameBytes names (about 530 KB) fits, and two such do not. A record
// past it is refused as ErrTooManyVersions.
const MaxVersionBytes = 768 << 10

// planBytes returns the size of p's encoding in a Timeline.
func planBytes(p *Plan) int {
	if p == nil {
		return 0
	}
	e := &enc{}
	encodePlan(e, p)
	return len(e.b)
}

// Version is one entry of a Timeline: from arrival time From on, Plan
// applies; a nil Plan is a tombstone (the customer's record was deleted:
// the default plan applies).
type Version struct {
	From int64
	Plan *Plan
	// size is planBytes(Plan), once known (0: not yet).
	size int
}

// bytes returns the size of v's plan's encoding in a Timeline (planBytes),
// counted once.
func (v *Version) bytes() int {
	if v.size == 0 && v.Plan != nil {
		v.size = planBytes(v.Plan)
	}
	return v.size
}

// Timeline is the entitlements of one key (a customer, or the default
// plan) over arrival time, as the records read so far make them. Versions
// are in increasing From, which is also the order their records were read.
// The zero value has no version.
type Timeline struct {
	versions []Version
}

// Set applies a record read at broker time written, with effective_from
// from (raised to written when earlier); p nil is a tombstone, effective
// at written. The record replaces every version whose From is at or after
// its own, so that At(t) is the most recently read record whose effective
// time is at or before t. A record whose plan is the same as that of the
// version in effect at its effective time takes no version of its own.
func (t *Timeline) Set(written, from int64, p *Plan) error {
	return t.SetWithin(written, from, p, math.MinInt64, math.MinInt64)
}

// SetWithin is Set, counting against MaxVersions only the versions in
// effect at or after since (the one in effect at since, and those from
// since on), and against MaxVersionBytes those in effect at or after
// bytesSince: the versions before them are kept (Prune drops them), but
// they do not refuse the record. With since and bytesSince at most the
// horizon the timeline has been pruned to, the counts are the same
// however far it has been pruned. A stage keeps the versions from its
// horizon on, and its state value holds them all: bytesSince no later
// than that horizon keeps the value within MaxVersionBytes.
func (t *Timeline) SetWithin(written, from int64, p *Plan, since, bytesSince int64) error {
	if from < written || p == nil {
		from = written
	}
	i := sort.Search(len(t.versions), func(i int) bool { return t.versions[i].From >= from })
	if i > 0 && t.versions[i-1].Plan.same(p) {
		// The version in effect at from already says what the record
		// says (a record written again unchanged, a billing system's
		// periodic sync): At answers alike without a version of its
		// own, so it takes none, and is never refused for the bound.
		t.versions = t.versions[:i]
		return nil
	}
	// The versions that stay (before i) and count: from the one in
	// effect at since on.
	first := sort.Search(i, func(k int) bool { return t.versions[k].From > since }) - 1
	if n := i - max(first, 0); n >= MaxVersions {
		return fmt.Errorf("%w: %d versions (the most is %d)", ErrTooManyVersions, n, MaxVersions)
	}
	own := planBytes(p)
	size := own
	first = sort.Search(i, func(k int) bool { return t.versions[k].From > bytesSince }) - 1
	for k := max(first, 0); k < i; k++ {
		size += t.versions[k].bytes()
	}
	if size > MaxVersionBytes {
		return fmt.Errorf("%w: %d bytes of versions (the most is %d)", ErrTooManyVersions, size, MaxVersionBytes)
	}
	t.versions = append(t.versions[:i], Version{From: from, Plan: p, size: own})
	return nil
}

// Size returns about the bytes the timeline's encoding takes
// (MarshalBinary): what a cache of timelines counts it as.
func (t *Timeline) Size() int {
	n := 16
	for k := range t.versions {
		n += 11 + t.versions[k].bytes()
	}
	return n
}

// At returns the version in effect at arrival time arrival: ok is false
// when no version is (no record yet, as far as this timeline knows); p is
// nil when that version is a tombstone.
func (t *Timeline) At(arrival int64) (p *Plan, ok bool) {
	// Events mostly arrive after the latest version's start: it is
	// looked at first, once per event decided.
	if n := len(t.versions); n > 0 && t.versions[n-1].From <= arrival {
		return t.versions[n-1].Plan, true
	}
	i := sort.Search(len(t.versions), func(i int) bool { return t.versions[i].From > arrival }) - 1
	if i < 0 {
		return nil, false
	}
	return t.versions[i].Plan, true
}

// Prune drops the versions no future event can be decided by, given that
// every future event arrives at or after horizon: it keeps the version in
// effect at horizon and those after it. A timeline left with only a
// tombstone is empty (Len 0): a deleted key with nothing scheduled.
func (t *Timeline) Prune(horizon int64) {
	i := sort.Search(len(t.versions), func(i int) bool { return t.versions[i].From > horizon }) - 1
	if i > 0 {
		t.versions = append(t.versions[:0], t.versions[i:]...)
	}
	if len(t.versions) == 1 && t.versions[0].Plan == nil && t.versions[0].From <= horizon {
		t.versions = t.versions[:0]
	}
}

// Len returns the number of versions kept.
func (t *Timeline) Len() int { return len(t.versions) }

// Versions returns the versions kept, in order. The slice is the
// timeline's own: do not modify it.
func (t *Timeline) Versions() []Version { return t.versions }
