package aggregator

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/meterline/meterline/entitlements"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// TestEntitlementsFreshGrantsRefused: a producer rewrites a customer's
// record scheduled far ahead (each replaces the last, so its versions
// stay within their bound) with 256 fresh grant ids of 1,024 bytes that
// never expire. Each record added a grant generation per grant to the
// customer's account, kept for good: the account, one state value,
// grew past what the changelog takes (MESSAGE_TOO_LARGE) and every
// transaction of the partition failed. The records past
// entitlements.MaxGrantBytes are rejected (invalid) and the partition
// goes on.
func TestEntitlementsFreshGrantsRefused(t *testing.T) {
	freshGrantsRefused(t, newEntHarness(t, nil, 1))
}

// TestEntitlementsFreshGrantsRefusedReal is
// TestEntitlementsFreshGrantsRefused on the real broker, whose record
// size (1 MB by default) the account would pass.
func TestEntitlementsFreshGrantsRefusedReal(t *testing.T) {
	freshGrantsRefused(t, newEntHarness(t, testenv.RealKafka(t), 1))
}

func freshGrantsRefused(t *testing.T, h *aggHarness) {
	scheduled := func(round int) *schemas.Entitlements {
		return &schemas.Entitlements{CustomerID: "acme", Plan: "p", EffectiveFrom: 1 << 60,
			Grants: bigGrants(fmt.Sprint(round)), Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}}
	}
	t0 := time.Now().Add(-time.Minute).UnixMilli()
	const rounds = 5
	for i := range rounds {
		h.produce(h.entitlement(1, scheduled(i), t0+int64(i)*1000))
	}
	h.runPastRecords(t, "acme", t0+rounds*1000)
	rej := readRejected(t, h)
	if len(rej) != rounds-1 {
		t.Fatalf("%d rejected, want the %d records after the first", len(rej), rounds-1)
	}
	for _, r := range rej {
		if r.Reason != schemas.ReasonInvalid || !strings.Contains(r.Detail, "grants kept alive") {
			t.Errorf("rejected %s %q, want invalid for the grants kept alive", r.Reason, r.Detail)
		}
	}
}

// bigGrants returns entitlements.MaxGrants grants of ids of
// entitlements.MaxNameBytes bytes that start with prefix.
func bigGrants(prefix string) []schemas.Grant {
	var gs []schemas.Grant
	for i := range entitlements.MaxGrants {
		id := fmt.Sprintf("%s-%04d-", prefix, i)
		gs = append(gs, schemas.Grant{ID: id + strings.Repeat("g", entitlements.MaxNameBytes-len(id)), Amount: 1})
	}
	return gs
}

// runPastRecords appends a tick at broker time at to the single
// partition of usage.entitlements and an event of customer before it, then
// runs a stage until it has read usage.deduped, and stops it.
func (h *aggHarness) runPastRecords(t *testing.T, customer string, at int64) {
	t.Helper()
	h.produce(h.shared(1, schemas.TickKey, &schemas.Tick{InstanceID: "test"}, at)...)
	h.produce(h.dedupedEvent(0, &schemas.DedupedEvent{EventID: "e1", CustomerID: customer, Meter: "m", Quantity: 1,
		EventTime: at - 500, IngestTime: at - 500}))
	run := h.start(h.entConfig("a", vfs.NewMem()))
	testenv.WaitCaughtUp(t, h.brokers, h.group, h.names.DedupedTopic(), 45*time.Second)
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
}
