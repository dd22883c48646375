package kafka_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/secret"
	"github.com/meterline/meterline/internal/testenv"
)

// closingBroker returns the address of a listener that closes every
// connection it accepts at once: a broker shutting down, or a proxy in
// front of a broker that is down.
func closingBroker(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String()
}

// TestSeedBrokerClosingUnderSASL: with SASL, a seed that closes the
// connection (a broker shutting down, a proxy before a broker that is
// down) while another seed serves the login is no wrong password:
// CheckCredentials and AwaitCluster are served by the other, as kgo's
// Ping was before the seeds were asked at once. A closed connection says
// "wrong password" (ErrAuthentication) only when no seed serves.
func TestSeedBrokerClosingUnderSASL(t *testing.T) {
	_, brokers := testenv.KFake(t, kfake.EnableSASL(), kfake.Superuser(kafka.ScramSHA512, "admin", password))
	cfg := kafka.Config{Brokers: []string{closingBroker(t), brokers[0]},
		SASL: kafka.SASL{Mechanism: kafka.ScramSHA512, User: "admin", Password: secret.New(password)}}
	for i := range 5 {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := kafka.CheckCredentials(cctx, cfg); err != nil {
			t.Fatalf("check %d: CheckCredentials with a seed that closes connections: %v", i, err)
		}
		if err := kafka.AwaitCluster(cctx, cfg, func(err error) { t.Logf("waiting: %v", err) }); err != nil {
			t.Fatalf("check %d: AwaitCluster with a seed that closes connections: %v", i, err)
		}
		cancel()
	}
}
