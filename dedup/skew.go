package dedup

import (
	"encoding/binary"
	"fmt"
)

// Key lifetimes across a lowered S (docs/design.md, Dedup, expiry).
//
// An event accepted under skew S has an event time up to S after its
// arrival, and its key must live until its first arrival + W + S: an exact
// copy arriving before then is inside the window by its own arrival. When S
// is lowered, the keys already stored were accepted under the longer one;
// expiring them by the new S would drop a key while an exact copy of its
// event is still accepted, and forward that copy as a first copy. So the
// state records the S of the run that last wrote it, and a run with a
// shorter one keeps expiring by the longer S (and judges the expiry check
// by it) until no key accepted under it can be left: its watermark at
// start, before which every such key first arrived, plus W + the longer S +
// a bucket; and W more for a re-routed copy, whose arrival may be W before
// the watermark. Only the expiry uses it: the window (in_future) is the
// configured S.

// keySkew: the S (ms) the last run that wrote the state ran with, a
// longer S (ms) keys may still have been accepted under (0: none) and the
// watermark (ms) from which none can be left: 24 bytes, big-endian.
var keySkew = []byte("mX")

// skewKeep is keySkew's value.
type skewKeep struct {
	last  int64
	older int64
	until int64
}

func (k skewKeep) encode() []byte {
	b := make([]byte, 24)
	binary.BigEndian.PutUint64(b[0:], uint64(k.last))
	binary.BigEndian.PutUint64(b[8:], uint64(k.older))
	binary.BigEndian.PutUint64(b[16:], uint64(k.until))
	return b
}

// readSkew reads keySkew through get.
func readSkew(get func([]byte) ([]byte, bool, error)) (skewKeep, bool, error) {
	v, ok, err := get(keySkew)
	switch {
	case err != nil || !ok:
		return skewKeep{}, false, err
	case len(v) != 24:
		return skewKeep{}, false, fmt.Errorf("corrupt recorded skew (%d bytes)", len(v))
	}
	return skewKeep{
		last:  int64(binary.BigEndian.Uint64(v[0:])),
		older: int64(binary.BigEndian.Uint64(v[8:])),
		until: int64(binary.BigEndian.Uint64(v[16:])),
	}, true, nil
}

// keepSkew returns what a run with config c records, starting on a state
// that recorded k (ok: it did) at watermark wm.
func keepSkew(c *Config, k skewKeep, ok bool, wm int64) skewKeep {
	cur := c.Skew.Milliseconds()
	if !ok {
		// A new state, or one written before S was recorded: its keys'
		// S is not known; recording starts with this one.
		return skewKeep{last: cur}
	}
	if k.older != 0 && wm >= k.until {
		k.older, k.until = 0, 0
	}
	if k.last > cur {
		k.older = max(k.older, k.last)
		k.until = max(k.until, wm+2*c.Window.Milliseconds()+k.last+c.Bucket.Milliseconds())
	}
	k.last = cur
	if k.older <= cur {
		k.older, k.until = 0, 0
	}
	return k
}

// expirySkew returns the S keys expire by at watermark wm: the longest of
// the configured one, the one the state last ran with and a longer one
// still pending.
func expirySkew(c *Config, k skewKeep, wm int64) int64 {
	s := max(c.Skew.Milliseconds(), k.last)
	if wm < k.until {
		s = max(s, k.older)
	}
	return s
}
