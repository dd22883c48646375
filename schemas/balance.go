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
		1 + varintLen(b.OverdraftLimit) + varintLen(b.Overdrawn) + varintLen(b.CapsUntil)
	for i := range b.Meters {
		n += meterBalanceSize(&b.Meters[i])
	}
	for i := range b.Grants {
		n += grantBalanceSize(&b.Grants[i])
	}
	return n + (len(b.Meters)/hambaBlockLength+len(b.Grants)/hambaBlockLength+2)*2*maxLongBytes
}

// appendBalanceBody appends b's Avro body as hamba writes it; b must be
// balanceEncodable.
func appendBalanceBody(dst []byte, b *Balance) []byte {
	dst = appendString(dst, b.CustomerID)
	dst = appendString(dst, b.Plan)
	dst = appendBool(dst, b.Unmetered)
	dst = binary.AppendVarint(dst, b.Revision)
	dst = binary.AppendVarint(dst, b.UpdatedAt)
	dst = binary.AppendVarint(dst, b.PeriodStart)
	dst = binary.AppendVarint(dst, b.PeriodEnd)
	dst = appendBlocks(dst, b.Meters, meterBalanceSize, appendMeterBalance)
	dst = appendBlocks(dst, b.Grants, grantBalanceSize, appendGrantBalance)
	p, _ := overdraftIndex(b.OverdraftPolicy)
	dst = binary.AppendVarint(dst, p)
	dst = binary.AppendVarint(dst, b.OverdraftLimit)
	dst = binary.AppendVarint(dst, b.Overdrawn)
	return binary.AppendVarint(dst, b.CapsUntil)
}

func meterBalanceSize(m *MeterBalance) int {
	return varintLen(int64(len(m.Meter))) + len(m.Meter) + varintLen(m.Usage) + varintLen(m.Limit) + 1
}

func appendMeterBalance(dst []byte, m *MeterBalance) []byte {
	o, _ := onLimitIndex(m.OnLimit)
	dst = appendString(dst, m.Meter)
	dst = binary.AppendVarint(dst, m.Usage)
	dst = binary.AppendVarint(dst, m.Limit)
	return binary.AppendVarint(dst, o)
}

func grantBalanceSize(g *GrantBalance) int {
	return varintLen(int64(len(g.ID))) + len(g.ID) + varintLen(int64(g.Priority)) + varintLen(g.EffectiveFrom) +
		varintLen(g.ExpiresAt) + varintLen(g.Amount) + varintLen(g.Consumed) + varintLen(g.Remaining)
}

func appendGrantBalance(dst []byte, g *GrantBalance) []byte {
	dst = appendString(dst, g.ID)
	dst = binary.AppendVarint(dst, int64(g.Priority))
	dst = binary.AppendVarint(dst, g.EffectiveFrom)
	dst = binary.AppendVarint(dst, g.ExpiresAt)
	dst = binary.AppendVarint(dst, g.Amount)
	dst = binary.AppendVarint(dst, g.Consumed)
	return binary.AppendVarint(dst, g.Remaining)
}

// appendBlocks appends an array as hamba writes it: blocks of
// hambaBlockLength items, each headed by the negated count and the
// block's byte size (the sum of size over its items), then a count of 0.
func appendBlocks[T any](dst []byte, items []T, size func(*T) int, appendItem func([]byte, *T) []byte) []byte {
	for len(items) > 0 {
		block := items[:min(len(items), hambaBlockLength)]
		items = items[len(block):]
		n := 0
		for i := range block {
			n += size(&block[i])
		}
		dst = binary.AppendVarint(dst, -int64(len(block)))
		dst = binary.AppendVarint(dst, int64(n))
		for i := range block {
			dst = appendItem(dst, &block[i])
		}
	}
	return append(dst, 0)
}
