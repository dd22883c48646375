package kafka_test

import (
	"errors"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/secret"
	"github.com/meterline/meterline/internal/testenv"
)

// TestAwaitClusterChecksCredentialsOnceReachable: a stage started while
// no broker serves waits (AwaitCluster calls waiting), and once a broker
// listens, a wrong password ends the wait with ErrAuthentication, not a
// start with credentials nobody checked; the right one ends it with nil.
func TestAwaitClusterChecksCredentialsOnceReachable(t *testing.T) {
	for _, c := range []struct {
		name     string
		password string
		want     error
	}{{"wrong password", "wrong-" + password, kafka.ErrAuthentication}, {"right password", password, nil}} {
		t.Run(c.name, func(t *testing.T) {
			addr := testenv.FreeAddr(t)
			_, port, err := net.SplitHostPort(addr)
			if err != nil {
				t.Fatal(err)
			}
			cfg := kafka.Config{Brokers: []string{addr},
				SASL: kafka.SASL{Mechanism: kafka.ScramSHA512, User: "admin", Password: secret.New(c.password)}}
			var waits atomic.Int32
			done := make(chan error, 1)
			go func() { done <- kafka.AwaitCluster(ctx(t), cfg, func(error) { waits.Add(1) }) }()
			deadline := time.Now().Add(10 * time.Second)
			for waits.Load() == 0 {
				if time.Now().After(deadline) {
					t.Fatal("AwaitCluster never reported waiting for an unreachable broker")
				}
				time.Sleep(20 * time.Millisecond)
			}
			select {
			case err := <-done:
				t.Fatalf("AwaitCluster returned %v with no broker listening", err)
			default:
			}
			p, _ := strconv.Atoi(port)
			testenv.KFake(t, kfake.Ports(p), kfake.EnableSASL(), kfake.Superuser(kafka.ScramSHA512, "admin", password))
			select {
			case err := <-done:
				if c.want == nil && err != nil || c.want != nil && !errors.Is(err, c.want) {
					t.Fatalf("AwaitCluster = %v, want %v", err, c.want)
				}
			case <-time.After(15 * time.Second):
				t.Fatal("AwaitCluster still waiting 15 s after the broker started")
			}
		})
	}
}
