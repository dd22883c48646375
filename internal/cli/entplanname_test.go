package cli

import (
	"context"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/schemas"
)

// TestEntitlementsReservedPlanNames: set and set-default refuse a plan
// named none, unnamed or other, the plan label values of the metrics that
// name no plan of their own, naming the reserved words and writing
// nothing. A record so named written straight to the topic is printed by
// get, with a note that set refuses it as printed.
func TestEntitlementsReservedPlanNames(t *testing.T) {
	a := newAcmeTopic(t)
	v, err := schemas.Encode(&schemas.Entitlements{CustomerID: "acme", Plan: "other", Overdraft: schemas.Overdraft{Policy: schemas.OverdraftAllow},
		Caps: []schemas.Cap{}, Grants: []schemas.Grant{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.cl.ProduceSync(context.Background(), &kgo.Record{Topic: a.topic, Partition: a.canon, Key: a.key, Value: v}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	ent := func(args ...string) (int, string, string) {
		t.Helper()
		return run(t, "", append(append([]string{"entitlements"}, args...), "--brokers", strings.Join(a.brokers, ","), "--topic-prefix", a.prefix)...)
	}
	file := tempFiles(t)
	for _, name := range []string{"none", "unnamed", "other"} {
		for _, cmd := range [][]string{{"set", "globex"}, {"set-default"}} {
			code, out, errOut := ent(append(cmd, "-f", file("doc.yaml", "plan: "+name+"\n"))...)
			if code == 0 || !strings.Contains(errOut, "plan: "+name+" is a reserved word") || !strings.Contains(errOut, "none, unnamed and other") {
				t.Errorf("%v with plan %s: exit %d, want it refused naming the reserved words\n%s\n%s", cmd, name, code, out, errOut)
			}
		}
	}
	code, out, errOut := ent("get", "acme")
	if code != 0 || !strings.Contains(out, "plan: other") || !strings.Contains(errOut, "set refuses this document as printed") ||
		!strings.Contains(errOut, "plan: other is a reserved word") {
		t.Errorf("get acme: exit %d, want the record printed and a note that set refuses its plan\n%s\n%s", code, out, errOut)
	}
	if code, out, errOut := ent("get", "globex"); code == 0 {
		t.Errorf("get globex: exit 0, but set refused its document\n%s\n%s", out, errOut)
	}
}
