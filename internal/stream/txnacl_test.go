package stream

import (
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestTransactionalIDNotAuthorizedStops: a principal without Write on the
// stage's transactional ID (a missing ACL) stops the stage at start with
// an error naming the transactional ID and the ACL, instead of retrying
// for ever with a warning a second: no restart grants the ACL.
func TestTransactionalIDNotAuthorizedStops(t *testing.T) {
	t.Parallel()
	s := newSuite(t, nil, nil)
	s.cluster.ControlKey(kmsg.InitProducerID.Int16(), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		s.cluster.KeepControl()
		req := kreq.(*kmsg.InitProducerIDRequest)
		resp := req.ResponseKind().(*kmsg.InitProducerIDResponse)
		resp.ErrorCode = kerr.TransactionalIDAuthorizationFailed.Code
		return resp, nil, true
	})
	in := s.start("a", vfs.NewMem())
	err := in.exit()
	if err == nil || !strings.Contains(err.Error(), "TRANSACTIONAL_ID_AUTHORIZATION_FAILED") {
		t.Fatalf("Run = %v, want it to stop on TRANSACTIONAL_ID_AUTHORIZATION_FAILED", err)
	}
	txnID := s.group + "-a"
	for _, want := range []string{"Write on transactional ID " + txnID, s.group + "-", "Security and ACLs"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}
