package schemas

import (
	"errors"
	"unsafe"
)

// RateCardCounts reads b, a message of the current RateCard schema, for
// how many versions it holds and how many rates in all, without decoding
// it: it allocates nothing. ok is true only for bytes Decode decodes,
// giving as many versions and rates; it is false for anything else
// (another kind or schema version, bytes that do not decode: Decode says
// why), as EntitlementsCounts.
//
// A rate card of 1 MB may hold 330,000 rates, which Decode allocates
// about 10 MB for: a reader that refuses more than a bound can refuse it
// by these counts first.
func RateCardCounts(b []byte) (versions, rates int64, ok bool) {
	versions, rates, err := rateCardCounts(b)
	return versions, rates, err == nil
}

// errNotRateCard: the bytes are not a message of the current RateCard
// schema.
var errNotRateCard = errors.New("schemas: not a message of the current RateCard schema")

// rateCardCounts is RateCardCounts, with the reason it is not ok.
func rateCardCounts(b []byte) (versions, rates int64, err error) {
	r, err := load()
	if err != nil {
		return 0, 0, err
	}
	if len(b) <= headerSize || string(b[:headerSize]) != string(r.headers[KindRateCard][:]) {
		return 0, 0, errNotRateCard
	}
	body := b[headerSize:]
	d := bodyDecoder{s: unsafe.String(unsafe.SliceData(body), len(body))}
	versions = d.skipArray("versions", func() {
		d.long("versions.effective_from")
		rates += d.skipArray("versions.rates", func() {
			d.str("versions.rates.meter")
			d.long("versions.rates.micro_credits")
			d.long("versions.rates.per_units")
		})
	})
	return versions, rates, d.err(KindRateCard)
}
