package ingest

import "strconv"

// duplicateMember returns an error naming the first member of the data
// (the text of a valid JSON object: a CloudEvent's data) whose name, its
// escapes decoded, an earlier member of the same object already has, at
// any depth: "data.tokens.input", "data.items[1].a". nil when there is
// none. A meter's JSONPath reads the data as encoding/json decodes it,
// the last of two members of one name, so the quantity billed would be
// whichever copy came last; /v1/events refuses a name repeated in an
// event or its properties (producer.ParseJSON) for the same reason.
//
// It walks the text once, without recursion, so that data nested however
// deep costs its size and no more; it allocates nothing for data of at
// most a few levels and members whose names have no escapes.
func duplicateMember(data string) *fieldError {
	var (
		frameBuf [8]dupFrame
		nameBuf  [32]string
	)
	frames, names := frameBuf[:0], nameBuf[:0]
	for i := 0; i < len(data); i++ {
		switch c := data[i]; c {
		case '{', '[':
			frames = append(frames, dupFrame{object: c == '{', wantKey: c == '{', first: len(names)})
		case '}', ']':
			names = names[:frames[len(frames)-1].first]
			frames = frames[:len(frames)-1]
			if len(frames) == 0 {
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
			top := &frames[len(frames)-1]
			if top.object && top.wantKey {
				name := data[i+1 : end-1]
				if escaped {
					name, _ = unquote(data[i:end])
				}
				top.wantKey, top.key = false, name
				if top.has(names[top.first:], name) {
					return &fieldError{clip(dupPath(frames)), "invalid", "appears twice"}
				}
				names = append(names, name)
			}
			i = end - 1
		}
	}
	return nil
}

// dupFrame is an object or an array that duplicateMember is in.
type dupFrame struct {
	object, wantKey bool
	// first is the index of the object's first member name in the names
	// of every open object; key is its current member's name; index is an
	// array's current element.
	first, index int
	key          string
	// set holds the object's names once it has more than dupLinear.
	set map[string]struct{}
}

// dupLinear is the most member names of one object compared one by one;
// past it they go into a set, so that an object of many members costs
// time in proportion to them.
const dupLinear = 16

// has reports whether name is among the object's names so far, its
// members' names (names).
func (f *dupFrame) has(names []string, name string) bool {
	if f.set == nil && len(names) < dupLinear {
		for _, n := range names {
			if n == name {
				return true
			}
		}
		return false
	}
	if f.set == nil {
		f.set = make(map[string]struct{}, 2*len(names))
		for _, n := range names {
			f.set[n] = struct{}{}
		}
	}
	if _, ok := f.set[name]; ok {
		return true
	}
	f.set[name] = struct{}{}
	return false
}

// dupPath names the current member of the innermost object of frames:
// data, then each open object's current member (.name) and each open
// array's current element ([i]).
func dupPath(frames []dupFrame) string {
	p := "data"
	for k := range frames {
		switch f := &frames[k]; {
		case f.object:
			p += "." + f.key
		case k+1 < len(frames):
			p += "[" + strconv.Itoa(f.index) + "]"
		}
	}
	return p
}
