package dedup

// Retired keys (docs/design.md, Event identity and keys: a retired key
// stays in the ring for the retention of usage.events).
//
// A record dedup signed keeps its arrival only while a key of the ring
// verifies it; a key removed from the ring too early turns the re-routed
// records it signed, still in the events topic, into ordinary producer
// records, whose arrival is their re-route time (an event can become late
// and be billed in another period). So each partition's state records every
// key ID the partition signed with and the broker time of its last use,
// and Open refuses a ring that lacks a key whose last use is within the
// retention of the events topic. A key is recorded with a check value of
// its secret (keyCheck), so that an ID given another secret counts as
// missing: it would not verify what the former secret signed.
//
// The last use is the partition watermark (the largest broker arrival time
// dedup has read on the partition; docs/design.md, Time) when the partition
// signed, rounded up to keyUseStep: a record signed then is stamped by the
// broker at or after it. The entry is written when that rounded time grows
// (at most once a keyUseStep of broker time per partition), and with the
// other metadata keys at every bucket expiry, so that the changelog's
// retention never deletes the only copy. A key is compared with the
// partition watermark too, never with a wall clock: a partition whose
// watermark stopped while dedup was down keeps a key longer, never shorter.
//
// A record signed at a watermark is stamped later, by the partition's lag
// at most (its broker time is when it was written, the watermark when what
// dedup read was written). A key may therefore go up to that long before
// the last record it signed leaves the topic: dedup has read that record
// by then, unless a partition lags by the whole retention, and a record
// read is not read again (the group's offsets move past it, and dedup
// stops rather than re-read when they are lost; docs/design.md,
// Exactly-once, 6).
//
// The entries stay few: the ring is the operator's, an entry of a key in
// the ring is kept, and an entry of a key no longer in the ring either
// stops dedup or, past the retention, is deleted at once.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"time"

	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/stream"
)

// ErrKeyStillNeeded is returned when the key ring lacks a key that signed
// records of the events topic which its retention may still hold, or has
// its ID with another secret: without the key, re-routed records it signed
// would lose their arrival time. Put the key back in the ring (after the
// signing key, where it only verifies) until the time the error names; or,
// if its secret leaked, name it in Config.ForgetKeys.
var ErrKeyStillNeeded = errors.New("a key that signed records the events topic may still hold is missing from the ring")

// keyUsePrefix starts the state key of a key ID's last signing use:
// "mS" | key ID → epoch ms (8 bytes BE) | keyCheck of its secret.
var keyUsePrefix = []byte("mS")

// keyUseEnd is the first state key after those of keyUsePrefix.
var keyUseEnd = []byte("mT")

// keyUseStep is the granularity of a recorded last use (rounded up).
const keyUseStep = time.Minute

func keyUseKey(id string) []byte { return append(append([]byte(nil), keyUsePrefix...), id...) }

// roundUpUse rounds a broker time up to keyUseStep.
func roundUpUse(ms int64) int64 {
	step := keyUseStep.Milliseconds()
	return (ms + step - 1) / step * step
}

// openKeyUses reads the key IDs partition p of the state signed with. A key
// of the ring is kept; one that left the ring is dropped when its last use
// is past the events topic's retention at the partition watermark, or
// named in Config.ForgetKeys, and otherwise refused with
// ErrKeyStillNeeded. State written before last uses were recorded holds
// none: nothing is refused, and recording starts.
func (pr *processor) openKeyUses(p int32, st *stream.PartitionState, pt *partition) error {
	type use struct {
		id       string
		at       int64
		replaced bool // the ring has the ID with another secret
	}
	var gone []use
	err := st.Scan(keyUsePrefix, keyUseEnd, func(k, v []byte) error {
		id := string(k[len(keyUsePrefix):])
		if !validKeyID(id) || len(v) != keyUseLen {
			return fmt.Errorf("dedup: partition %d: corrupt last use of a key (%d-byte ID, %d-byte value)", p, len(id), len(v))
		}
		at := int64(binary.BigEndian.Uint64(v))
		c, ok := pr.keys.check[id]
		if ok && bytes.Equal(c[:], v[8:]) {
			pt.keyUses[id] = at
			return nil
		}
		gone = append(gone, use{id: id, at: at, replaced: ok})
		return nil
	})
	if err != nil {
		return err
	}
	pt.signUse = pt.keyUses[pr.keys.signID]
	if len(gone) == 0 {
		return nil
	}
	var (
		retention time.Duration
		retErr    error
		read      bool // retention or retErr is set
		errs      []error
	)
	for _, u := range gone {
		if pr.forget[u.id] {
			pr.log.Warn("key forgotten on request although records it signed may remain in the events topic: they are now ordinary producer records",
				zap.Int32("partition", p), zap.String("key_id", u.id), zap.Time("last_use", time.UnixMilli(u.at).UTC()))
			pt.dropUses = append(pt.dropUses, u.id)
			continue
		}
		if !read {
			retention, retErr = pr.eventsRetention()
			read = true
		}
		if retErr != nil {
			errs = append(errs, fmt.Errorf("dedup: partition %d: key %q %s, and it last signed a record of %s at %s: read that topic's retention.ms to see whether they are gone: %w; grant DescribeConfigs on the topic, or put the key back in the ring",
				p, u.id, absent(u.replaced), pr.eventsTopic, msTime(u.at), retErr))
			continue
		}
		if retention >= 0 && u.at+retention.Milliseconds() <= pt.wm {
			pr.log.Info("retired key forgotten: the records it signed have left the events topic",
				zap.Int32("partition", p), zap.String("key_id", u.id), zap.Time("last_use", time.UnixMilli(u.at).UTC()),
				zap.Duration("retention", retention), zap.Time("watermark", time.UnixMilli(pt.wm).UTC()))
			pt.dropUses = append(pt.dropUses, u.id)
			continue
		}
		errs = append(errs, pr.keyStillNeeded(p, u.id, u.replaced, u.at, retention, pt.wm))
	}
	if len(pt.dropUses) > 0 {
		pt.writeMeta = true
	}
	return errors.Join(errs...)
}

// keyStillNeeded says which key is missing, since when and until when it
// must stay, and what to do.
func (pr *processor) keyStillNeeded(p int32, id string, replaced bool, at int64, retention time.Duration, wm int64) error {
	todo := "put it back in the ring after the signing key (there it only verifies)"
	leaked := "if its secret leaked, name it in --dedup-forget-ids (Config.ForgetKeys) to drop it anyway (the re-routed records it signed then lose their arrival time); see docs/operations.md, Dedup keys"
	if replaced {
		todo = "give the ID its former secret back, after the signing key (there it only verifies), and the new secret an ID of its own"
		leaked = "if the former secret leaked, give the new secret an ID of its own and name this one in --dedup-forget-ids (Config.ForgetKeys) to drop it anyway (the re-routed records it signed then lose their arrival time); see docs/operations.md, Dedup keys"
	}
	if retention < 0 {
		return fmt.Errorf("dedup: partition %d: %w: key %q %s, but it last signed a record of %s at %s (broker time, to the minute), and %s keeps records for ever (retention.ms -1): "+
			"the key must stay in the ring for as long as that retention is infinite; %s; it may go once retention.ms is finite and the partition watermark has passed %s plus that retention; %s",
			p, ErrKeyStillNeeded, id, absent(replaced), pr.eventsTopic, msTime(at), pr.eventsTopic, todo, msTime(at), leaked)
	}
	until := at + retention.Milliseconds()
	return fmt.Errorf("dedup: partition %d: %w: key %q %s, but it last signed a record of %s at %s (broker time, to the minute), and %s keeps records for %s (retention.ms): "+
		"the key must stay in the ring until the partition watermark passes %s (it is at %s); %s, and remove it after that; %s",
		p, ErrKeyStillNeeded, id, absent(replaced), pr.eventsTopic, msTime(at), pr.eventsTopic, retention, msTime(until), msTime(wm), todo, leaked)
}

// absent says how a key that signed is missing from the ring.
func absent(replaced bool) string {
	if replaced {
		return "has another secret in the ring than the one it signed with"
	}
	return "is not in the ring"
}

// keyUseLen is the length of a last-use value: the time and the key check.
const keyUseLen = 8 + keyCheckLen

// keyUseValue encodes a last use of the ring's key id.
func (kr *keyring) keyUseValue(id string, at int64) []byte {
	v := make([]byte, 8, keyUseLen)
	binary.BigEndian.PutUint64(v, uint64(at))
	c := kr.check[id]
	return append(v, c[:]...)
}

// noteSigned records that the open transaction signed a record with the
// signing key at the partition watermark: a compare, and a state write at
// most once a keyUseStep of broker time.
func (pt *partition) noteSigned(tx *stream.Tx) {
	if pt.wm <= 0 {
		// Nothing read yet, so no broker time to record: the first tick
		// of a new partition. Its signature is checked only by the tick
		// rule, and the next transaction records a time.
		return
	}
	u := roundUpUse(pt.wm)
	if u <= pt.signUse {
		return
	}
	pt.signUse = u
	pt.keyUses[pt.pr.keys.signID] = u
	tx.Put(pt.pr.signUseKey, pt.pr.keys.keyUseValue(pt.pr.keys.signID, u))
}

// writeKeyUses writes every recorded last use of a key of the ring, and
// deletes those of keys dropped from it (with the other metadata keys).
// After an aborted transaction a use may be written that the abort took
// back: later than the truth, which keeps the key longer, never shorter.
func (pt *partition) writeKeyUses(tx *stream.Tx) {
	for _, id := range pt.dropUses {
		if _, ok := pt.keyUses[id]; !ok { // not an ID the ring's key has signed under since
			tx.Delete(keyUseKey(id))
		}
	}
	ids := make([]string, 0, len(pt.keyUses))
	for id := range pt.keyUses {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		tx.Put(keyUseKey(id), pt.pr.keys.keyUseValue(id, pt.keyUses[id]))
	}
}
