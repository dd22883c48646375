package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// TestEntitlementsDeleteAfterMisroutedRecord: a customer deleted on its
// own partition, then given a record on another partition (a billing
// system with another partitioner) that the aggregator has not moved
// yet, is not "deleted already": moved, that record applies after the
// delete (aggregator.DecideRecord: its original arrived later), so
// `delete` must write a delete, after which the copy is stale and the
// customer stays deleted (docs/entitlements.md: a record on another
// partition that the aggregator moves to the customer's is deleted).
// A misrouted record older than the delete is superseded by it already:
// delete writes nothing, as for any customer deleted already.
func TestEntitlementsDeleteAfterMisroutedRecord(t *testing.T) {
	onKafkas(t, func(t *testing.T, brokers []string) {
		for _, newer := range []bool{true, false} {
			t.Run(map[bool]string{true: "newer misrouted record", false: "older misrouted record"}[newer], func(t *testing.T) {
				testDeleteAfterMisroutedRecord(t, brokers, newer)
			})
		}
	})
}

func testDeleteAfterMisroutedRecord(t *testing.T, brokers []string, newer bool) {
	names, ent, must := entCommands(t, brokers, "entdelmis")
	topic := names.EntitlementsTopic()
	key := schemas.CustomerKey("acme")
	canon := schemas.Partition(key, 4)
	wrong := (canon + 1) % 4
	cl := manualClient(t, brokers)
	misroute := func() {
		t.Helper()
		time.Sleep(20 * time.Millisecond) // another broker millisecond than the delete's
		if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: topic, Partition: wrong, Key: key, Value: entPlan(t, "acme", 5)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	must("", "set", "acme", "-f", tempFiles(t)("acme.yaml", "plan: pro\ncaps: {api_calls: {limit: 100}}\n"))
	if !newer {
		misroute()
	}
	must("", "delete", "acme")
	if newer {
		misroute()
	}
	onCanon := func() (n int, misrouted *kgo.Record) {
		for _, r := range testenv.ReadAll(t, brokers, topic) {
			switch r.Partition {
			case canon:
				n++
			case wrong:
				misrouted = r
			}
		}
		return n, misrouted
	}
	before, _ := onCanon()
	code, out, errOut := ent("", "delete", "acme")
	if code != 0 {
		t.Fatalf("delete acme: exit %d\n%s\n%s", code, out, errOut)
	}
	after, orig := onCanon()
	if newer && (after-before != 1 || strings.Contains(errOut, "deleted already")) {
		t.Fatalf("delete acme with a misrouted record newer than its delete: %d records written, stderr %q; want the delete written", after-before, errOut)
	}
	if !newer && (after != before || !strings.Contains(errOut, "deleted already")) {
		t.Fatalf("delete acme with a misrouted record older than its delete: %d records written, stderr %q; want nothing written, deleted already", after-before, errOut)
	}
	// The aggregator moves the misrouted record now (a copy with its
	// origin): the copy must not bring the customer's entitlements back.
	if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: topic, Partition: canon, Key: key, Value: orig.Value,
		Headers: originHeaders(orig)}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := ent("", "get", "acme"); code != 1 || !strings.Contains(errOut, "the entitlements of acme were deleted at") {
		t.Errorf("get acme after delete and the move of its misrouted record: exit %d, want 1 (deleted)\n%s\n%s", code, out, errOut)
	}
}
