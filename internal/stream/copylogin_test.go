package stream

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"go.uber.org/zap/zaptest"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/secret"
	"github.com/meterline/meterline/internal/session"
	"github.com/meterline/meterline/internal/testenv"
)

// TestCopyLoginRefusedStopsStage: a client the runtime opens while the
// stage runs (a restore's or a standby's copy of the changelog) whose SASL
// login the brokers refuse (the password changed on the cluster; the
// stage reads it at start only) stops the stage with an authentication
// error, as the session's refusal does. The copy itself sees nothing but
// polls that end empty, as when the brokers are down: without this the
// partition would wait restoring for ever. kfake answers the login
// SASL_AUTHENTICATION_FAILED, as a broker does.
func TestCopyLoginRefusedStopsStage(t *testing.T) {
	const changelog = "bind.changelog"
	cluster, brokers := testenv.KFake(t, kfake.EnableSASL(), kfake.SeedTopics(1, changelog),
		kfake.Superuser(kafka.ScramSHA512, "dedup", "pw"))
	kc := kafka.Config{Brokers: brokers, SASL: kafka.SASL{Mechanism: kafka.ScramSHA512, User: "dedup", Password: secret.New("pw")}}
	rt, err := New(Config{Stage: "login", Config: session.Config{Kafka: kc, Group: "g", InstanceID: "i1"},
		InputTopic: "in", ChangelogTopic: changelog, StateDir: "state", FS: vfs.NewMem(),
		Logger: zaptest.NewLogger(t), Registerer: prometheus.NewRegistry()}, keepProc{})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.store.Close()
	testenv.RefuseLogins(cluster)
	c, err := rt.newChangelogCopy(0, "restore", 0, 1, -1, time.Now(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for rt.takeFatal() == nil && ctx.Err() == nil {
		_, _ = c.fetch(ctx, 500*time.Millisecond, nil)
	}
	err = rt.takeFatal()
	if !errors.Is(err, kafka.ErrAuthentication) || !strings.Contains(err.Error(), `user "dedup"`) || !strings.Contains(err.Error(), "read at start") {
		t.Fatalf("fatal error %v; want an authentication error naming the user and saying the password is read at start", err)
	}
}
