package schemas

import "encoding/binary"

// The hand-written encoding of a Balance, byte for byte what hamba writes
// (TestEncodeBalanceMatchesHamba): the aggregator writes one for every
// customer whose balance goes out, at most once a transaction each.

// onLimitIndex and overdraftIndex are the enums' symbol indexes in
// balance.avsc; ok is false for a value that is no symbol (hamba refuses
// it: AppendEncode leaves it to hamba, for its error).
func onLimitIndex(o OnLimit) (int64, bool) {
	switch o {
	case OnLimitReject:
		return 0, true
	case OnLimitAllow:
		return 1, true
	}
	return 0, false
}

func overdraftIndex(p OverdraftPolicy) (int64, bool) {
	switch p {
	case OverdraftAllow:
		return 0, true
	case OverdraftDeny:
		return 1, true
	}
	return 0, false
}

// balanceEncodable reports whether appendBalanceBody can encode b: every
// enum holds one of its symbols.
func balanceEncodable(b *Balance) bool {
	if _, ok := overdraftIndex(b.OverdraftPolicy); !ok {
		return false
	}
	for i := range b.Meters {
		if _, ok := onLimitIndex(b.Meters[i].OnLimit); !ok {
			return false
		}
	}
	return true
}

// balanceSizeHint is a capacity that holds b's encoding, header included:
// its exact size but for the arrays' block headers, bounded.
func balanceSizeHint(b *Balance) int {
	n := headerSize + varintLen(int64(len(b.CustomerID))) + len(b.CustomerID) + varintLen(int64(len(b.Plan))) + len(b.Plan) + 1 +
		varintLen(b.Revision) + varintLen(b.UpdatedAt) + varintLen(b.PeriodStart) + varintLen(b.PeriodEnd) +
		1 + varintLen(b.OverdraftLimit) + varintLen(b.Overdrawn)
	for i := range b.Meters {
		m := &b.Meters[i]
		n += varintLen(int64(len(m.Meter))) + len(m.Meter) + varintLen(m.Usage) + varintLen(m.Limit) + 1
	}
	for i := range b.Grants {
		g := &b.Grants[i]
		n += varintLen(int64(len(g.ID))) + len(g.ID) + varintLen(int64(g.Priority)) + varintLen(g.EffectiveFrom) +
			varintLen(g.ExpiresAt) + varintLen(g.Amount) + varintLen(g.Consumed) + varintLen(g.Remaining)
	}
	return n + (len(b.Meters)/hambaBlockLength+len(b.Grants)/hambaBlockLength+2)*2*maxLongBytes
}

// appendBalanceBody appends b's Avro body as hamba writes it; b must be
// balanceEncodable.
func appendBalanceBody(dst []byte, b *Balance) []byte {
	dst = appendString(dst, b.CustomerID)
	dst = appendString(dst, b.Plan)
	if b.Unmetered {
		dst = append(dst, 1)
	} else {
		dst = append(dst, 0)
	}
	dst = binary.AppendVarint(dst, b.Revision)
	dst = binary.AppendVarint(dst, b.UpdatedAt)
	dst = binary.AppendVarint(dst, b.PeriodStart)
	dst = binary.AppendVarint(dst, b.PeriodEnd)
	// Arrays as hamba writes them: blocks of hambaBlockLength items, each
	// headed by the negated count and the block's byte size, then 0.
	for ms := b.Meters; len(ms) > 0; {
		block := ms[:min(len(ms), hambaBlockLength)]
		ms = ms[len(block):]
		size := 0
		for i := range block {
			m := &block[i]
			size += varintLen(int64(len(m.Meter))) + len(m.Meter) + varintLen(m.Usage) + varintLen(m.Limit) + 1
		}
		dst = binary.AppendVarint(dst, -int64(len(block)))
		dst = binary.AppendVarint(dst, int64(size))
		for i := range block {
			m := &block[i]
			o, _ := onLimitIndex(m.OnLimit)
			dst = appendString(dst, m.Meter)
			dst = binary.AppendVarint(dst, m.Usage)
			dst = binary.AppendVarint(dst, m.Limit)
			dst = binary.AppendVarint(dst, o)
		}
	}
	dst = append(dst, 0)
	for gs := b.Grants; len(gs) > 0; {
		block := gs[:min(len(gs), hambaBlockLength)]
		gs = gs[len(block):]
		size := 0
		for i := range block {
			g := &block[i]
			size += varintLen(int64(len(g.ID))) + len(g.ID) + varintLen(int64(g.Priority)) + varintLen(g.EffectiveFrom) +
				varintLen(g.ExpiresAt) + varintLen(g.Amount) + varintLen(g.Consumed) + varintLen(g.Remaining)
		}
		dst = binary.AppendVarint(dst, -int64(len(block)))
		dst = binary.AppendVarint(dst, int64(size))
		for i := range block {
			g := &block[i]
			dst = appendString(dst, g.ID)
			dst = binary.AppendVarint(dst, int64(g.Priority))
			dst = binary.AppendVarint(dst, g.EffectiveFrom)
			dst = binary.AppendVarint(dst, g.ExpiresAt)
			dst = binary.AppendVarint(dst, g.Amount)
			dst = binary.AppendVarint(dst, g.Consumed)
			dst = binary.AppendVarint(dst, g.Remaining)
		}
	}
	dst = append(dst, 0)
	p, _ := overdraftIndex(b.OverdraftPolicy)
	dst = binary.AppendVarint(dst, p)
	dst = binary.AppendVarint(dst, b.OverdraftLimit)
	return binary.AppendVarint(dst, b.Overdrawn)
}
