package schemas

import (
	"unsafe"

	"github.com/hamba/avro/v2"
)

// hasBlocks reports whether a body of schema s may hold an array or a map:
// the values whose block counts checkBlockCounts checks.
func hasBlocks(s avro.Schema, seen map[avro.Schema]bool) bool {
	if seen[s] {
		return false
	}
	seen[s] = true
	switch s := s.(type) {
	case *avro.ArraySchema, *avro.MapSchema:
		return true
	case *avro.RefSchema:
		return hasBlocks(s.Schema(), seen)
	case *avro.RecordSchema:
		for _, f := range s.Fields() {
			if hasBlocks(f.Type(), seen) {
				return true
			}
		}
	case *avro.UnionSchema:
		for _, t := range s.Types() {
			if hasBlocks(t, seen) {
				return true
			}
		}
	}
	return false
}

// checkBlockCounts reads body as its writer schema s lays it out, before
// hamba/avro decodes it, and returns an error wrapping ErrUndecodable and
// errCountOverflow when the block counts of an array or a map overflow
// int64 (fast.go's blockCount): hamba v2.31.0 adds them unchecked, takes a
// count of -2⁶³ or a sum that wraps as a slice of negative length, and
// writes the items of the following blocks outside it (memory that is not
// the slice's: the process's heap and globals). Any other failure to read
// is left to hamba, which reports it: the reading rules are hamba's
// (fast.go), so a body that fails here fails there at the same place or
// before, where no later block is reached.
func checkBlockCounts(k Kind, s avro.Schema, body []byte) error {
	// Only read: nothing read is kept, so the body is not copied.
	d := bodyDecoder{s: unsafe.String(unsafe.SliceData(body), len(body))}
	d.walk(s)
	if d.failed && d.cause == errCountOverflow {
		return d.err(k)
	}
	return nil
}

// walk reads one value of schema s.
func (d *bodyDecoder) walk(s avro.Schema) {
	if d.failed {
		return
	}
	switch s := s.(type) {
	case *avro.RecordSchema:
		for _, f := range s.Fields() {
			d.walk(f.Type())
		}
	case *avro.RefSchema:
		d.walk(s.Schema())
	case *avro.EnumSchema:
		d.int(s.Name())
	case *avro.FixedSchema:
		d.skip(s.Name(), s.Size())
	case *avro.ArraySchema:
		d.skipArray("array", func() { d.walk(s.Items()) })
	case *avro.MapSchema:
		d.skipArray("map", func() {
			d.str("map key")
			d.walk(s.Values())
		})
	case *avro.UnionSchema:
		i := d.int("union index")
		if ts := s.Types(); !d.failed && i >= 0 && int(i) < len(ts) {
			d.walk(ts[i])
		} else {
			d.fail("union index", "out of range")
		}
	case *avro.PrimitiveSchema:
		d.primitive(s.Type())
	default:
		d.fail(string(s.Type()), "schema type not read")
	}
}

// primitive reads one value of a primitive type.
func (d *bodyDecoder) primitive(t avro.Type) {
	switch t {
	case avro.String, avro.Bytes:
		d.str(string(t))
	case avro.Int:
		d.int(string(t))
	case avro.Long:
		d.long(string(t))
	case avro.Boolean:
		d.bool(string(t))
	case avro.Float:
		d.skip(string(t), 4)
	case avro.Double:
		d.skip(string(t), 8)
	case avro.Null:
	default:
		d.fail(string(t), "type not read")
	}
}

// skip reads n bytes.
func (d *bodyDecoder) skip(field string, n int) {
	if d.failed {
		return
	}
	if n > len(d.s)-d.i {
		d.fail(field, "truncated")
		return
	}
	d.i += n
}
