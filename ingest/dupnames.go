package ingest

import (
	"hash/maphash"
	"slices"
	"strconv"
	"sync"
	"unicode/utf8"
)

// duplicateMember returns an error naming a member of the data (the text
// of a valid JSON object: a CloudEvent's data) whose name, its escapes
// decoded, another member of the same object has, at any depth:
// "data.tokens.input", "data.items[1].a"; nil when there is none. A
// meter's JSONPath reads the data as encoding/json decodes it, the last of
// two members of one name, so the quantity billed would be whichever copy
// came last; /v1/events refuses a name repeated in an event or its
// properties (producer.ParseJSON) for the same reason. Of an object's
// repeated names, the one repeated first is named; an inner object is
// checked before the object that holds it.
//
// It walks the text once, without recursion, so that data nested however
// deep costs its size and no more, and keeps 8 bytes per member of the
// objects it is in (a 32-bit hash of the name and its offset), not the
// names: an object's hashes are sorted when it ends, and names of equal
// hashes compared. Its stacks are reused from call to call (dupPool): the
// data of every event of a batch may nest as deep as JSON allows, and a
// stack grown anew for each would cost some 100 times its size. Data
// whose names have no escapes allocates nothing.
func duplicateMember(data string) *fieldError {
	sc := dupPool.Get().(*dupScratch)
	fe := sc.check(data)
	if cap(sc.frames) <= maxDupFrames && cap(sc.keys) <= maxDupKeys {
		clear(sc.frames[:sc.used]) // holds no request's text
		sc.used = 0
		dupPool.Put(sc)
	}
	return fe
}

// dupScratch holds duplicateMember's stacks, for reuse (dupPool).
type dupScratch struct {
	frames []dupFrame
	keys   []uint64
	used   int // the most frames held
}

var dupPool = sync.Pool{New: func() any { return new(dupScratch) }}

// maxDupFrames and maxDupKeys bound the stacks kept for reuse: room for
// the nesting JSON allows (encoding/json's limit, 10,000), and for the
// names of a megabyte of members.
const (
	maxDupFrames = 16 << 10
	maxDupKeys   = 256 << 10
)

// check is duplicateMember, in sc's stacks.
func (sc *dupScratch) check(data string) *fieldError {
	frames, keys := sc.frames[:0], sc.keys[:0]
	defer func() { sc.frames, sc.keys = frames[:0], keys[:0] }()
	for i := 0; i < len(data); i++ {
		switch c := data[i]; c {
		case '{', '[':
			frames = append(frames, dupFrame{object: c == '{', wantKey: c == '{', first: len(keys)})
			sc.used = max(sc.used, len(frames))
		case '}', ']':
			top := &frames[len(frames)-1]
			if top.object {
				if off, ok := repeatedName(data, keys[top.first:]); ok {
					end, _ := scanString(data, int(off))
					top.key = data[off+1 : end-1]
					return &fieldError{clip(dupPath(frames)), "invalid", "appears twice"}
				}
			}
			keys = keys[:top.first]
			if frames = frames[:len(frames)-1]; len(frames) == 0 {
				return nil
			}
		case ',':
			if top := &frames[len(frames)-1]; top.object {
				top.wantKey = true
			} else {
				top.index++
			}
		case '"':
			end, escaped := scanString(data, i)
			if end < 0 {
				return nil // not valid JSON: not this check's to say
			}
			if top := &frames[len(frames)-1]; top.object && top.wantKey {
				top.wantKey = false
				top.key = data[i+1 : end-1] // named only for the path of an error
				keys = append(keys, uint64(nameHash(data[i+1:end-1], escaped))<<32|uint64(uint32(i)))
			}
			i = end - 1
		}
	}
	return nil
}

// dupFrame is an object or an array that duplicateMember is in.
type dupFrame struct {
	object, wantKey bool
	// first is the index of the object's first key in the keys of every
	// open object; key is the literal of its current member's name (its
	// text, quotes excluded); index is an array's current element.
	first, index int
	key          string
}

// dupSeed seeds the hashes of member names: random, so that no request
// can be made of names whose hashes collide.
var dupSeed = maphash.MakeSeed()

// nameHash is the 32-bit hash of a member name, given as its literal's
// text: decoded when escaped, so that "\u0061" and "a" hash alike.
func nameHash(lit string, escaped bool) uint32 {
	if !escaped {
		return uint32(maphash.String(dupSeed, lit))
	}
	var h maphash.Hash
	h.SetSeed(dupSeed)
	var buf [utf8.UTFMax]byte
	eachUnescaped(lit, func(plain string, r rune) bool {
		if r >= 0 {
			_, _ = h.Write(buf[:utf8.EncodeRune(buf[:], r)])
		} else {
			_, _ = h.WriteString(plain)
		}
		return true
	})
	return uint32(h.Sum64())
}

// repeatedName sorts the keys of one object (hash<<32 | offset of the
// name's opening quote in data) and returns the offset of the name that
// is repeated first in the text: of every name repeated, its second
// occurrence that comes first. Names of equal hashes are compared.
func repeatedName(data string, keys []uint64) (uint32, bool) {
	if len(keys) < 2 {
		return 0, false
	}
	slices.Sort(keys)
	best, found := uint32(0), false
	for i := 0; i < len(keys); {
		j := i + 1
		for j < len(keys) && keys[j]>>32 == keys[i]>>32 {
			j++
		}
		// A run of equal hashes is in the order of the text: its first
		// name that an earlier one of the run equals is the run's first
		// repetition.
	run:
		for b := i + 1; b < j; b++ {
			nb := decodedName(data, uint32(keys[b]))
			for a := i; a < b; a++ {
				if decodedName(data, uint32(keys[a])) == nb {
					if off := uint32(keys[b]); !found || off < best {
						best, found = off, true
					}
					break run
				}
			}
		}
		i = j
	}
	return best, found
}

// decodedName is the member name whose literal starts at data[off].
func decodedName(data string, off uint32) string {
	end, escaped := scanString(data, int(off))
	if !escaped {
		return data[off+1 : end-1]
	}
	s, _ := unquote(data[off:end])
	return s
}

// dupPath names the current member of the innermost object of frames:
// data, then each open object's current member (.name) and each open
// array's current element ([i]).
func dupPath(frames []dupFrame) string {
	p := "data"
	for k := range frames {
		switch f := &frames[k]; {
		case f.object:
			name := f.key
			if s, ok := unquote(`"` + name + `"`); ok {
				name = s
			}
			p += "." + name
		case k+1 < len(frames):
			p += "[" + strconv.Itoa(f.index) + "]"
		}
	}
	return p
}
