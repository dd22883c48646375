package dedup

import "encoding/binary"

// bloom is a growing, blocked Bloom filter over 16-byte key hashes: each
// key sets k bits inside one 512-bit block, so a lookup touches one cache
// line. When a filter reaches its capacity a new one twice as large is
// chained, keeping the false-positive rate near 1% (10 bits per key, k=7)
// without knowing the key count up front.
//
// A false positive only costs a Pebble read; there are no false negatives,
// so a filter that gained keys of an aborted transaction stays correct.
type bloom struct {
	filters []*blockFilter
	// first is the capacity of the first filter; 0 means bloomFirstCap.
	// A bucket sized from its predecessor's key count starts with one
	// filter that fits, instead of a chain (each link is one more cache
	// miss on every lookup that finds nothing).
	first int
}

const (
	bloomBitsPerKey = 10
	bloomK          = 7
	bloomFirstCap   = 1 << 16
	bloomGrowth     = 4
)

type blockFilter struct {
	blocks [][8]uint64
	n, cap int
}

func newBlockFilter(capacity int) *blockFilter {
	nb := (capacity*bloomBitsPerKey + 511) / 512
	return &blockFilter{blocks: make([][8]uint64, nb), cap: capacity}
}

// The block is chosen by h1 and the k bits inside it by k separate 9-bit
// pieces of h2, so that the two choices are independent. (Deriving the
// bits from h1 as well, as h2 + i·h1 mod 512, tied them to the block: the
// low bits of h1 are the same for every key of a block whenever the block
// count shares factors of two with 512, and the filter answered "maybe" for
// 12–26% of absent keys instead of about 1%, each a Pebble read.)

func (f *blockFilter) add(h1, h2 uint64) {
	b := &f.blocks[h1%uint64(len(f.blocks))]
	for i := 0; i < bloomK; i++ {
		bit := h2 >> (9 * i) & 511
		b[bit/64] |= 1 << (bit % 64)
	}
	f.n++
}

func (f *blockFilter) mayContain(h1, h2 uint64) bool {
	b := &f.blocks[h1%uint64(len(f.blocks))]
	for i := 0; i < bloomK; i++ {
		bit := h2 >> (9 * i) & 511
		if b[bit/64]&(1<<(bit%64)) == 0 {
			return false
		}
	}
	return true
}

func hashes(h []byte) (uint64, uint64) {
	return binary.LittleEndian.Uint64(h[0:8]), binary.LittleEndian.Uint64(h[8:16])
}

func (b *bloom) add(h []byte) {
	h1, h2 := hashes(h)
	if len(b.filters) == 0 || b.filters[len(b.filters)-1].n >= b.filters[len(b.filters)-1].cap {
		c := max(b.first, bloomFirstCap)
		if len(b.filters) > 0 {
			c = b.filters[len(b.filters)-1].cap * bloomGrowth
		}
		b.filters = append(b.filters, newBlockFilter(c))
	}
	b.filters[len(b.filters)-1].add(h1, h2)
}

func (b *bloom) mayContain(h []byte) bool {
	h1, h2 := hashes(h)
	for _, f := range b.filters {
		if f.mayContain(h1, h2) {
			return true
		}
	}
	return false
}
