package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/schemas"
)

// TestEntitlementsGetSaysWhatSetRefuses: a record written straight to
// usage.entitlements may hold values the aggregator accepts and a
// document cannot: a time after 9999 in UTC (which get prints with a
// five-digit year, not RFC 3339) or before 2000-01-01. get prints the
// record as it is, and says on stderr that set refuses the document as
// printed, naming each such field and why; set does refuse it. A record
// set wrote gets no such note.
func TestEntitlementsGetSaysWhatSetRefuses(t *testing.T) {
	a := newAcmeTopic(t)
	ctx := context.Background()
	year10000 := time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	acme, err := schemas.Encode(&schemas.Entitlements{CustomerID: "acme", Plan: "direct", Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow},
		Caps: []schemas.Cap{}, Grants: []schemas.Grant{{ID: "forever", Amount: 5, ExpiresAt: year10000}, {ID: "old", Amount: 5, EffectiveFrom: 1000}}})
	if err != nil {
		t.Fatal(err)
	}
	card, err := schemas.Encode(&schemas.RateCard{Versions: []schemas.RateVersion{{EffectiveFrom: 0,
		Rates: []schemas.Rate{{Meter: "tokens", MicroCredits: 1, PerUnits: 1}}}}})
	if err != nil {
		t.Fatal(err)
	}
	recs := []*kgo.Record{{Topic: a.topic, Partition: a.canon, Key: a.key, Value: acme}}
	for p := range int32(4) {
		recs = append(recs, &kgo.Record{Topic: a.topic, Partition: p, Key: []byte(schemas.RateCardKey), Value: card})
	}
	if err := a.cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	ent := func(args ...string) (int, string, string) {
		t.Helper()
		return run(t, "", append(append([]string{"entitlements"}, args...), "--brokers", strings.Join(a.brokers, ","), "--topic-prefix", a.prefix)...)
	}
	file := tempFiles(t)
	for _, c := range []struct {
		get, set []string
		fields   []string
	}{
		{[]string{"get", "acme"}, []string{"set"}, []string{"grants.forever.expires_at: 10000-01-01T00:00:00.000Z is after 9999-12-31T23:59:59.999Z", "grants.old.effective_from: "}},
		{[]string{"list"}, []string{"set"}, []string{"acme: ", "grants.forever.expires_at: "}},
		{[]string{"get", "--rates"}, []string{"set-rates"}, []string{"versions[0].effective_from: "}},
	} {
		code, out, errOut := ent(c.get...)
		asIs := c.set[0] == "set-rates" || strings.Contains(out, "expires_at: 10000-01-01T00:00:00.000Z")
		if code != 0 || !asIs || !strings.Contains(errOut, "set refuses this document as printed") {
			t.Errorf("%v: exit %d, want 0, the record printed as it is and a note that set refuses it\n%s\n%s", c.get, code, out, errOut)
		}
		for _, f := range c.fields {
			if !strings.Contains(errOut, f) {
				t.Errorf("%v: the note does not name %q:\n%s", c.get, f, errOut)
			}
		}
		if c.get[0] == "list" {
			continue
		}
		t.Logf("%v:\n%s", c.get, errOut)
		if code, _, setErr := ent(append(c.set, "--validate", "-f", file("doc.yaml", out))...); code == 0 || !strings.Contains(setErr, c.fields[0]) {
			t.Errorf("%v of what %v printed: exit %d, want it refused naming %q\n%s", c.set, c.get, code, c.fields[0], setErr)
		}
	}
	if code, _, errOut := ent("set", "acme", "-f", file("ok.yaml", "plan: pro\ngrants:\n  g: {amount: 5, expires_at: \"9999-12-31T23:59:59.999Z\"}\n")); code != 0 {
		t.Fatalf("set acme: exit %d\n%s", code, errOut)
	}
	if code, out, errOut := ent("get", "acme"); code != 0 || strings.Contains(errOut, "set refuses") {
		t.Errorf("get acme after set: exit %d, want 0 and no note that set refuses it\n%s\n%s", code, out, errOut)
	}
}
