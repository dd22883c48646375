package cli

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/meterline/meterline/internal/testenv"
)

// TestEntitlementsCommitOutcomeUnknown: a commit of `meterline entitlements
// set` that the coordinator answers only after the command's deadline (a
// broker that stalls, or stops, once it has the EndTxn) has an unknown
// outcome: the command fails, saying the record may have been written and
// how to find out, never "nothing was written" — here the coordinator
// committed it.
func TestEntitlementsCommitOutcomeUnknown(t *testing.T) {
	c, brokers := testenv.KFake(t)
	names := testenv.Topics(t, brokers, "ent", testenv.TopicsOpts{})
	var stalled atomic.Bool
	c.ControlKey(int16(kmsg.EndTxn), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if stalled.CompareAndSwap(false, true) {
			// Answered (committed) after the command gave up.
			c.SleepControl(func() { time.Sleep(4 * time.Second) })
		}
		return nil, nil, false
	})
	file := tempFiles(t)
	doc := file("acme.yaml", "customer: acme\nplan: free\ncaps:\n  api_calls: {limit: 1000}\n")
	code, out, errOut := run(t, "", "entitlements", "set", "-f", doc, "--timeout", "2s",
		"--brokers", strings.Join(brokers, ","), "--topic-prefix", names.Prefix,
		"--transactional-id", testenv.Name(t, "ent-writer"))
	if code == 0 {
		t.Fatalf("set whose commit was not answered in time: exit 0\n%s\n%s", out, errOut)
	}
	if strings.Contains(errOut, "nothing was written") {
		t.Errorf("set says nothing was written, but the outcome of its commit is unknown:\n%s", errOut)
	}
	for _, want := range []string{"may have been written", "entitlements get acme"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr does not say %q:\n%s", want, errOut)
		}
	}
	time.Sleep(3 * time.Second) // the commit lands
	if recs := testenv.ReadAll(t, brokers, names.EntitlementsTopic()); len(recs) != 1 {
		t.Fatalf("records in %s after the late commit: %d, want 1 (the case this test is about)", names.EntitlementsTopic(), len(recs))
	}
}
