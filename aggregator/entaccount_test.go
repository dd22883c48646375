package aggregator

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/entitlements"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// TestLedgerLayoutRefused: with entitlements on, the aggregator refuses
// state whose Ledger keeps the earlier layout (a key per grant state, per
// meter and period, per overdraft), whether that state recorded the
// earlier mode or none (built before the mode was recorded); new state
// and state of this layout are taken, and new state records the mode.
func TestLedgerLayoutRefused(t *testing.T) {
	scheme := string(keyKeyScheme)
	for _, tc := range []struct {
		name    string
		st      mapState
		refused bool
	}{
		{"new state", mapState{}, false},
		{"this layout", mapState{scheme: []byte(schemas.DedupedKeyScheme), string(keyEntMode): []byte(entModeOn),
			"eA4:acme": {1, 0, 0}}, false},
		{"earlier mode", mapState{scheme: []byte(schemas.DedupedKeyScheme), string(keyEntMode): []byte("entitlements"),
			"eG4:acme": {1, 0}}, true},
		{"earlier mode, no ledger key yet", mapState{scheme: []byte(schemas.DedupedKeyScheme), string(keyEntMode): []byte("entitlements")}, true},
		{"no mode, usage keys", mapState{scheme: []byte(schemas.DedupedKeyScheme), "eU\x00\x00\x00\x00\x00\x00\x00\x014:acme3:api": {2}}, true},
		{"no mode, gated records", mapState{scheme: []byte(schemas.DedupedKeyScheme), "q\x00\x00\x00\x00\x00\x00\x00\x00": {0}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := entitlements.New(entitlements.Config{Prefix: []byte{pfxLedger}, Period: dayBoundsMs})
			if err != nil {
				t.Fatal(err)
			}
			pt := &partition{pr: &processor{counts: partitionCountsT{events: 1, deduped: 1, entitlements: 1}, ledger: l, m: newMetrics(prometheus.NewRegistry())}}
			err = pt.load(tc.st)
			switch {
			case tc.refused && !errors.Is(err, ErrLedgerLayout):
				t.Fatalf("load = %v, want ErrLedgerLayout", err)
			case !tc.refused && err != nil:
				t.Fatalf("load = %v", err)
			case tc.refused && !strings.Contains(err.Error(), "new topic names"):
				t.Errorf("the error does not say what to do: %v", err)
			}
			t.Log(err)
			if _, has := tc.st[string(keyEntMode)]; !tc.refused && pt.writeEntMode == has {
				t.Errorf("writeEntMode %v with the mode recorded: %v", pt.writeEntMode, has)
			}
		})
	}
}

func dayBoundsMs(ms int64) (int64, int64) {
	const day = 24 * 3600 * 1000
	s := ms - ((ms%day)+day)%day
	return s, s + day
}

// TestEntitlementsAbortDropsAccounts: a transaction that decided a capped
// customer's events in the partition's in-memory accounts aborts (its
// offset commit fails) while the partition stays; the events are decided
// again from the committed state, not from the aborted decisions: all
// three fit the cap of 3, none is over_limit, the balance says 3, and the
// decisions metric counts each committed decision once.
func TestEntitlementsAbortDropsAccounts(t *testing.T) {
	c, brokers := testenv.KFake(t)
	h := newEntHarness(t, brokers, 1)
	day := ms(t, "2026-05-04")
	reg := prometheus.NewRegistry()
	cfg := h.entConfig("a", vfs.NewMem())
	cfg.EntitlementsTick = -1 // the tick below is the only one: no transaction of the stage's own between
	// No ticks move the broker time on, so the balance that says 3 goes
	// out with the transaction that decides the events.
	cfg.BalanceInterval = BalanceEveryTransaction
	cfg.Stream.Registerer = reg
	run := h.start(cfg)
	h.produce(h.entitlement(1, &schemas.Entitlements{CustomerID: "acme", Plan: "free",
		Caps:      []schemas.Cap{{Meter: "api_calls", Limit: 3, OnLimit: schemas.OnLimitReject}},
		Overdraft: schemas.Overdraft{Policy: schemas.OverdraftDeny}}, day))
	h.produce(h.shared(1, schemas.TickKey, &schemas.Tick{InstanceID: "test"}, day+10_000)...)
	testenv.WaitCaughtUp(t, h.brokers, h.group, h.names.EntitlementsTopic(), time.Minute)
	before := transactionCounts(reg)
	// The next transaction with consumed offsets decides the events and
	// aborts.
	testenv.FailNextTxnOffsetCommit(c)
	for i := range 3 {
		h.produce(h.dedupedEvent(0, &schemas.DedupedEvent{EventID: fmt.Sprint("e", i), CustomerID: "acme", Meter: "api_calls",
			Quantity: 1, EventTime: day + 1000 + int64(i), IngestTime: day + 1000 + int64(i)}))
	}
	h.caughtUp()
	awaitDecided(t, h, 3)
	// The next transaction counts the committed decisions in the metric.
	h.produce(h.dedupedEvent(0, &schemas.DedupedEvent{EventID: "next", CustomerID: "other", Meter: "api_calls",
		Quantity: 1, EventTime: day + 2000, IngestTime: day + 2000}))
	const decisions = "meterline_aggregate_entitlement_decisions_total"
	for deadline := time.Now().Add(30 * time.Second); counterOf(reg, decisions) < 3 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	// acme's 3, the aborted transaction's not; other's maybe.
	if v := counterOf(reg, decisions); v != 3 && v != 4 {
		t.Errorf("%v decisions counted, want 3 or 4 (each committed decision once)", v)
	}
	if after := transactionCounts(reg); after["aborted"] <= before["aborted"] {
		t.Fatalf("no aborted transaction (before %v, after %v): the test did not test anything", before, after)
	}
	if reasons := rejectedReasons(t, h); len(reasons) != 0 {
		t.Fatalf("rejected %v, want none: the aborted transaction's decisions were counted again", reasons)
	}
	if v := openValues(t, h)["acme/api_calls"]; v != 3 {
		t.Errorf("acme counted %d, want 3", v)
	}
	b := latestBalances(t, h)["acme"]
	if b == nil || len(b.Meters) != 1 || b.Meters[0].Usage != 3 {
		t.Fatalf("acme's balance %+v, want api_calls usage 3", b)
	}
}

// TestEntitlementsOneRecordPerCustomer: the Ledger's changes to a
// customer go to the changelog as one account record per transaction
// that changed it, whatever its meters and grants: 40 events of two
// capped meters paid from a grant make at most one account record per
// committed transaction, and no key of the earlier layout.
func TestEntitlementsOneRecordPerCustomer(t *testing.T) {
	h := newEntHarness(t, nil, 1)
	day := ms(t, "2026-05-04")
	reg := prometheus.NewRegistry()
	cfg := h.entConfig("a", vfs.NewMem())
	cfg.Stream.Registerer = reg
	h.produce(h.entitlement(1, &schemas.Entitlements{CustomerID: "acme", Plan: "pro",
		Caps: []schemas.Cap{{Meter: "api_calls", Limit: 1000, OnLimit: schemas.OnLimitReject},
			{Meter: "tokens", Limit: 1000, OnLimit: schemas.OnLimitReject}},
		Grants:    []schemas.Grant{{ID: "g", Amount: 1_000_000}},
		Overdraft: schemas.Overdraft{Policy: schemas.OverdraftDeny}}, day))
	h.produce(h.shared(1, schemas.RateCardKey, &schemas.RateCard{Versions: []schemas.RateVersion{
		{Rates: []schemas.Rate{{Meter: "api_calls", MicroCredits: 10, PerUnits: 1}, {Meter: "tokens", MicroCredits: 1, PerUnits: 1}}}}}, day)...)
	h.produce(h.shared(1, schemas.TickKey, &schemas.Tick{InstanceID: "test"}, day+time.Hour.Milliseconds())...)
	const n = 40
	for i := range n {
		m := []string{"api_calls", "tokens"}[i%2]
		h.produce(h.dedupedEvent(0, &schemas.DedupedEvent{EventID: fmt.Sprint("e", i), CustomerID: "acme", Meter: m,
			Quantity: 2, EventTime: day + 1000 + int64(i), IngestTime: day + 1000 + int64(i)}))
	}
	run := h.start(cfg)
	h.caughtUp()
	awaitDecided(t, h, n)
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	accountKey := append([]byte{pfxLedger, 'A'}, schemas.CustomerKey("acme")...)
	accounts := 0
	for _, r := range testenv.ReadAll(t, h.brokers, h.names.AggregateChangelogTopic()) {
		// The earlier layout's keys per customer ('G' alone is the default
		// plan's grant expiries).
		if len(r.Key) > 2 && r.Key[0] == pfxLedger && bytes.ContainsRune([]byte("GUO"), rune(r.Key[1])) {
			t.Errorf("changelog key %q of the earlier layout", r.Key)
		}
		if bytes.Equal(r.Key, accountKey) {
			accounts++
		}
	}
	committed := transactionCounts(reg)["committed"]
	if accounts == 0 || float64(accounts) > committed || accounts >= n {
		t.Fatalf("%d account records for %d events in %v committed transactions, want 1 to one per transaction", accounts, n, committed)
	}
	b := latestBalances(t, h)["acme"]
	if b == nil || len(b.Meters) != 2 || b.Meters[0].Usage != n || b.Meters[1].Usage != n || len(b.Grants) != 1 ||
		b.Grants[0].Consumed != n/2*2*10+n/2*2 {
		t.Fatalf("acme's balance %+v, want 40 units of each meter and 440 micro-credits consumed", b)
	}
}

// TestAccountsBoundedKeepChanged: the partition's accounts are bounded:
// past maxAccounts the unchanged ones are dropped, never one the open
// transaction changed (Flush has yet to write it).
func TestAccountsBoundedKeepChanged(t *testing.T) {
	e := &entPart{accounts: map[string]*heldAccount{}}
	s := ledgerStore{e: e}
	changed := &entitlements.Account{}
	s.KeepAccount("changed", changed)
	s.ChangedAccount("changed", changed)
	for i := 1; i < maxAccounts; i++ {
		s.KeepAccount(fmt.Sprint("c", i), &entitlements.Account{})
	}
	if len(e.accounts) != maxAccounts {
		t.Fatalf("%d accounts kept, want %d", len(e.accounts), maxAccounts)
	}
	s.KeepAccount("one more", &entitlements.Account{})
	if len(e.accounts) != 2 {
		t.Fatalf("%d accounts kept past the bound, want the changed one and the new one", len(e.accounts))
	}
	if a, ok := s.Account("changed"); !ok || a != changed || !e.accounts["changed"].dirty {
		t.Fatal("the changed account was dropped")
	}
	if len(e.dirtyAccounts) != 1 || e.dirtyAccounts[0].customer != "changed" || e.dirtyAccounts[0].h != e.accounts["changed"] {
		t.Fatalf("changed accounts %v", e.dirtyAccounts)
	}
}

// TestAccountsSweptOncePerQuarter: a transaction that changes more than
// maxAccounts accounts (a month end's balances for a large partition)
// keeps them all, and KeepAccount does not sweep the map again for each
// account it keeps (which made such a transaction quadratic): once per
// maxAccounts/4 unchanged accounts at most.
func TestAccountsSweptOncePerQuarter(t *testing.T) {
	e := &entPart{accounts: map[string]*heldAccount{}}
	s := ledgerStore{e: e}
	const changed = maxAccounts + maxAccounts/2
	for i := range changed {
		c, a := fmt.Sprint("d", i), &entitlements.Account{}
		s.KeepAccount(c, a)
		s.ChangedAccount(c, a)
	}
	for i := range maxAccounts {
		s.KeepAccount(fmt.Sprint("c", i), &entitlements.Account{})
	}
	if e.accountSweeps > 4 {
		t.Fatalf("%d sweeps for %d accounts kept, want at most 4", e.accountSweeps, changed+maxAccounts)
	}
	for i := range changed {
		if h := e.accounts[fmt.Sprint("d", i)]; h == nil || !h.dirty {
			t.Fatalf("changed account d%d was dropped", i)
		}
	}
	if len(e.accounts) > changed+maxAccounts/4 {
		t.Fatalf("%d accounts kept, want at most the %d changed and %d unchanged", len(e.accounts), changed, maxAccounts/4)
	}
}

// TestEntMetricsRuns: the decisions and credits counted in runs add up to
// what counting each decision in the maps gives, whatever the order.
func TestEntMetricsRuns(t *testing.T) {
	var m entMetrics
	want := map[[2]string]float64{}
	wantCredits := map[string]float64{}
	outcomes := []string{"accepted", "over_limit", "no_credit"}
	plans := []string{"free", "pro", "none"}
	for i := range 1000 {
		o, p := outcomes[i*7%11%3], plans[i/3%3]
		cost := int64(0)
		if o == "accepted" {
			cost = int64(i % 5)
		}
		m.add(o, p, cost)
		want[[2]string{o, p}]++
		if cost > 0 {
			wantCredits[p] += float64(cost)
		}
		if i%97 == 0 {
			m.fold()
		}
	}
	m.fold()
	if fmt.Sprint(m.decisions) != fmt.Sprint(want) || fmt.Sprint(m.credits) != fmt.Sprint(wantCredits) {
		t.Fatalf("decisions %v credits %v, want %v %v", m.decisions, m.credits, want, wantCredits)
	}
}

// TestEntitlementsAbortRereadsGate: a transaction lets records of the
// gate the committed state holds through (deleted in it) and
// aborts; the gate is read again from the committed state, so the same
// records go through again, in order, once: the events that arrived
// before the tick's broker time are counted, the one after it waits.
func TestEntitlementsAbortRereadsGate(t *testing.T) {
	c, brokers := testenv.KFake(t)
	h := newEntHarness(t, brokers, 1)
	day := ms(t, "2026-05-04")
	reg := prometheus.NewRegistry()
	cfg := h.entConfig("a", vfs.NewMem())
	cfg.EntitlementsTick = -1 // the ticks below are the only ones
	cfg.Stream.Registerer = reg
	run := h.start(cfg)
	h.produce(h.entitlement(1, &schemas.Entitlements{CustomerID: "acme", Plan: "free",
		Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow}}, day))
	// Three events that arrived after everything read: they wait in the
	// gate, which a committed transaction holds.
	for i, at := range []int64{day + 1000, day + 2000, day + 30_000} {
		h.produce(h.dedupedEvent(0, &schemas.DedupedEvent{EventID: fmt.Sprint("e", i), CustomerID: "acme", Meter: "api_calls",
			Quantity: 1, EventTime: at, IngestTime: at}))
	}
	h.caughtUp()
	testenv.WaitCaughtUp(t, h.brokers, h.group, h.names.EntitlementsTopic(), time.Minute)
	if v := openValues(t, h)["acme/api_calls"]; v != 0 {
		t.Fatalf("acme counted %d before any tick, want 0", v)
	}
	before := transactionCounts(reg)
	// The transaction that reads this tick lets the first two through
	// and aborts; the next one reads it again.
	testenv.FailNextTxnOffsetCommit(c)
	h.produce(h.shared(1, schemas.TickKey, &schemas.Tick{InstanceID: "test"}, day+10_000)...)
	testenv.WaitCaughtUp(t, h.brokers, h.group, h.names.EntitlementsTopic(), time.Minute)
	for deadline := time.Now().Add(30 * time.Second); openValues(t, h)["acme/api_calls"] < 2 && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	if after := transactionCounts(reg); after["aborted"] <= before["aborted"] {
		t.Fatalf("no aborted transaction (before %v, after %v): the test did not test anything", before, after)
	}
	if v := openValues(t, h)["acme/api_calls"]; v != 2 {
		t.Fatalf("acme counted %d, want 2: the events that arrived before the tick, once each", v)
	}
}

// TestEntitlementsAbortThenFlushWritesNoGate: records that entered the gate
// in a transaction that aborts without its Flush (the runtime's abort when
// records of a partition not ready were polled) are read again with its
// input. The partition is stale until its next Process or Work reloads it;
// a transaction that only punctuates it (a stale partition always ticks)
// still flushes it, and that Flush must write nothing: writing the held
// records as gate keys would have them decided twice, once from the state
// and once re-read.
func TestEntitlementsAbortThenFlushWritesNoGate(t *testing.T) {
	l, err := entitlements.New(entitlements.Config{Prefix: []byte{pfxLedger}, Period: dayBoundsMs})
	if err != nil {
		t.Fatal(err)
	}
	pt := &partition{pr: &processor{counts: partitionCountsT{events: 1, deduped: 1, entitlements: 1}, ledger: l, m: newMetrics(prometheus.NewRegistry())}}
	// A committed record waits in the gate: the records after it wait too.
	st := mapState{string(keyKeyScheme): []byte(schemas.DedupedKeyScheme), string(keyEntMode): []byte(entModeOn),
		"q\x00\x00\x00\x00\x00\x00\x00\x00": encodeGateRecord(&kgo.Record{Offset: 0, Value: []byte{1}}),
		string(keyGateNext):                 {0, 0, 0, 0, 0, 0, 0, 1}}
	if err := pt.load(st); err != nil {
		t.Fatal(err)
	}
	if pt.ent.gateN != 1 {
		t.Fatalf("gate holds %d records, want the committed one", pt.ent.gateN)
	}
	for off := int64(1); off <= 3; off++ {
		if gated, _ := pt.gateIn(nil, &kgo.Record{Offset: off, Value: []byte{2}, Timestamp: time.UnixMilli(off)}); !gated {
			t.Fatalf("record %d not gated behind the committed one", off)
		}
	}
	pt.Abort()
	if n := len(pt.ent.fresh) - pt.ent.freshHead; n != 0 {
		t.Errorf("the aborted transaction's %d gated records are still held", n)
	}
	// A nil transaction: any write to it panics.
	func() {
		defer func() {
			if v := recover(); v != nil {
				t.Errorf("Flush of the stale partition reached the transaction: %v", v)
			}
		}()
		if err := pt.Flush(nil); err != nil {
			t.Errorf("Flush of the stale partition: %v", err)
		}
	}()
}
