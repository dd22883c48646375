package sink

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/testenv"
)

// TestRealSecuredGroupMembersRefusedNamesACL: `migrate`, `verify` and
// `sink accept-offsets` ask whether the sink's group has members before
// they change anything; a principal the SASL_SSL broker refuses Describe
// on that group (the producer's, or the operator's on a group outside its
// prefix) gets an error naming itself, the ACL and the group, not only
// GROUP_AUTHORIZATION_FAILED.
func TestRealSecuredGroupMembersRefusedNamesACL(t *testing.T) {
	k := testenv.RealKafkaSASL(t)
	conn := k.Config(t, "producer", kafka.ScramSHA512)
	cl, err := kafka.NewClient(conn)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	group := testenv.Name(t, "meterline-sink")
	_, err = GroupMembers(kadm.NewClient(cl), conn.Principal(), group)(ctx)
	if !errors.Is(err, kerr.GroupAuthorizationFailed) {
		t.Fatalf("GroupMembers as User:producer = %v, want GROUP_AUTHORIZATION_FAILED", err)
	}
	if want := "User:producer needs Describe on group " + group; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not say %q", err, want)
	}
}
