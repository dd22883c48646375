package aggregator

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/entitlements"
	"github.com/meterline/meterline/schemas"
)

// TestEntitlementsVersionsTooLargeRefused: two valid records of one
// customer of about 530 KB each (256 caps and 256 grants with names of
// 1,024 bytes) would make its timeline, one state value, larger than the
// changelog takes (MESSAGE_TOO_LARGE: the stage stopped, and stopped
// again after each restart). The second is rejected (invalid) and the
// partition goes on.
func TestEntitlementsVersionsTooLargeRefused(t *testing.T) {
	h := newEntHarness(t, nil, 1)
	big := func(name string) *schemas.Entitlements {
		e := &schemas.Entitlements{CustomerID: "acme", Plan: name, Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}}
		for i := range entitlements.MaxCaps {
			e.Caps = append(e.Caps, schemas.Cap{Meter: fmt.Sprintf("%04d", i) + strings.Repeat("m", entitlements.MaxNameBytes-4),
				Limit: 1, OnLimit: schemas.OnLimitReject})
		}
		for i := range entitlements.MaxGrants {
			e.Grants = append(e.Grants, schemas.Grant{ID: fmt.Sprintf("%04d", i) + strings.Repeat("g", entitlements.MaxNameBytes-4), Amount: 1})
		}
		return e
	}
	t0 := time.Now().Add(-time.Minute).UnixMilli()
	h.produce(h.entitlement(1, big("one"), t0))
	h.produce(h.entitlement(1, big("two"), t0+1000))
	h.runPastRecords(t, "other", t0+2000)
	rej := readRejected(t, h)
	if len(rej) != 1 || rej[0].Reason != schemas.ReasonInvalid || !strings.Contains(rej[0].Detail, "bytes of versions") {
		t.Fatalf("rejected %+v, want the second record of acme, invalid for the bytes of its versions", rej)
	}
}
