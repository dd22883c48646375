package schemas

import (
	"unsafe"

	"github.com/hamba/avro/v2"
)

// checkBody reads body as its writer schema s lays it out, before
// hamba/avro decodes it, and returns an error wrapping ErrUndecodable when
// it does not read: hamba would refuse it too (the reading rules are
// hamba's, fast.go's), but only after it has allocated what the body
// claims: the length of a string (up to 1 MiB), and each array's slice
// grown to the count its block claims (65,536 items), before reading a
// byte of them (13 bytes of a Tick cost 1 MiB, 23 of a Balance 4 MB).
// Here the walk stops at the first string or item the body does not
// hold. And it refuses the block counts of an array that overflow int64
// (errCountOverflow, fast.go's blockCount), which hamba v2.31.0 adds
// unchecked: it takes a count of -2⁶³, or a sum that wraps, as a slice of
// negative length and writes the items of the following blocks outside
// it, into memory that is not the slice's. (No schema here has a map; one
// is read as hamba reads it.)
func checkBody(k Kind, s avro.Schema, body []byte) error {
	// Only read: nothing read is kept, so the body is not copied.
	d := bodyDecoder{s: unsafe.String(unsafe.SliceData(body), len(body))}
	d.walk(s)
	if d.failed {
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
		d.skipMap(s.Values())
	case *avro.UnionSchema:
		i := d.int("union index")
		if ts := s.Types(); !d.failed && i >= 0 && int(i) < len(ts) {
			d.walk(ts[i])
		} else {
			d.fail("union index", "out of range")
		}
	case *avro.PrimitiveSchema:
		d.primitive(s.Type())
	case *avro.NullSchema: // no bytes
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

// skipMap reads a map of values of schema v as hamba does: blocks of
// entries without a bound on their count (hamba fills a Go map, not a
// slice, and takes a negative count, -2⁶³ negated, as no entries).
func (d *bodyDecoder) skipMap(v avro.Schema) {
	for !d.failed {
		c := d.long("map")
		if c < 0 {
			c = -c
			d.long("map") // the block's byte size
		}
		if d.failed || c == 0 {
			return
		}
		for ; c > 0 && !d.failed; c-- {
			d.str("map key")
			d.walk(v)
		}
	}
}
