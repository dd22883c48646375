package session

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap/zaptest"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/secret"
	"github.com/meterline/meterline/internal/testenv"
)

// TestRealSecuredInitProducerIDCredentialsRefused: a session whose user or password
// the brokers refuse (the password changed on the cluster after the
// stage started: it is read at start only) stops the stage with an error
// naming the user, as at start, instead of rebuilding the session for
// ever: no retry makes the old password right.
func TestRealSecuredInitProducerIDCredentialsRefused(t *testing.T) {
	k := testenv.RealKafkaSASL(t)
	kc := k.Config(t, "dedup", kafka.ScramSHA512)
	kc.SASL.Password = secret.New("the-old-password")
	c := Config{Kafka: kc, Group: testenv.Name(t, "group"), InstanceID: "i"}
	c.EnsureDefaults()
	l, err := NewLoop(c, zaptest.NewLogger(t), NewMetrics(prometheus.NewRegistry(), testNames, "test records"), "then nothing")
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(append(l.Conn(), kgo.TransactionalID(c.TransactionalID()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = l.InitProducerID(ctx, cl)
	if err == nil || errors.Is(err, ErrRestart) {
		t.Fatalf("InitProducerID with a refused password = %v, want an error that stops the stage", err)
	}
	if !errors.Is(err, kafka.ErrAuthentication) {
		t.Errorf("error does not wrap kafka.ErrAuthentication: %v", err)
	}
	for _, want := range []string{`user "dedup"`, "SCRAM-SHA-512", "read at start"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q: %v", want, err)
		}
	}
	if strings.Contains(err.Error(), "the-old-password") {
		t.Errorf("error shows the password: %v", err)
	}
}
