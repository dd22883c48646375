package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/meterline/meterline/internal/testenv"
)

// TestRealSecuredSinkNoTransactionalIDWrite: a sink whose principal lacks
// Write on its transactional ID (the documented ACLs but that one) stops
// at start with exit status 1, naming the transactional ID and the ACL,
// as dedup and the aggregator do; it does not wait for its first
// transaction, which a sink with no input to write never reaches.
func TestRealSecuredSinkNoTransactionalIDWrite(t *testing.T) {
	w := newSecuredSink(t, "sectxn")
	group := w.group
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	revokeACL(t, ctx, w.adm, kadm.NewACLs().Allow("User:sink").AllowHosts("*").Operations(kadm.OpWrite).
		TransactionalIDs(group+"-").ResourcePatternType(kadm.ACLPatternPrefixed))
	sink := w.start(t)
	select {
	case code := <-sink.done:
		sink.cancel = nil
		if code != 1 {
			t.Errorf("sink exit %d, want 1", code)
		}
		for _, want := range []string{"TRANSACTIONAL_ID_AUTHORIZATION_FAILED", "Write on transactional ID " + group + "-node-1",
			"prefix " + group + "-", "Security and ACLs"} {
			if !strings.Contains(sink.logs.String(), want) {
				t.Errorf("the sink's error does not say %q:\n%s", want, testenv.Tail(sink.logs.String(), 10))
			}
		}
	case <-time.After(45 * time.Second):
		t.Errorf("the sink did not stop within 45 s of its start without Write on its transactional ID:\n%s", testenv.Tail(sink.logs.String(), 10))
		sink.stop(t)
	}
}
