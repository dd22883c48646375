package kafka_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/secret"
	"github.com/meterline/meterline/internal/testenv"
)

// TestSeedBrokerSilent: with a seed broker that accepts connections and
// never answers (paused, its host cut off, while the cluster runs on
// without it) first in the seeds, CheckCredentials and AwaitCluster ask
// the other seeds at the same time: they are served, and see a wrong
// password, well under the request timeout (10 s) kgo's Ping waited on
// the silent seed before it asked the next one; and ListedBrokers lists
// the cluster's brokers, not the silent one.
func TestSeedBrokerSilent(t *testing.T) {
	brokers := saslCluster(t)
	silent := testenv.SilentBroker(t)
	for _, c := range []struct {
		name     string
		password string
		want     error
	}{{"right password", password, nil}, {"wrong password", "wrong-" + password, kafka.ErrAuthentication}} {
		t.Run(c.name, func(t *testing.T) {
			cfg := saslConfig(c.password, silent, brokers[0])
			check := func(what string, f func(context.Context) error) {
				t.Helper()
				cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				err := f(cctx)
				if cctx.Err() != nil {
					t.Fatalf("%s with the first seed silent: still waiting after 5 s (%v)", what, err)
				}
				if c.want == nil && err != nil || c.want != nil && !errors.Is(err, c.want) {
					t.Fatalf("%s with the first seed silent = %v, want %v", what, err, c.want)
				}
			}
			check("CheckCredentials", func(ctx context.Context) error { return kafka.CheckCredentials(ctx, cfg) })
			check("AwaitCluster", func(ctx context.Context) error {
				return kafka.AwaitCluster(ctx, cfg, func(err error) { t.Logf("waiting: %v", err) })
			})
			if c.want != nil {
				return
			}
			cl, err := kafka.NewClient(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			listed, err := kafka.ListedBrokers(ctx(t), cl.SeedBrokers(), kafka.ListedBrokerWait)
			if err != nil || !slices.Equal(listed, brokers) {
				t.Fatalf("ListedBrokers = %v, %v; want %v", listed, err, brokers)
			}
		})
	}
}

// saslCluster returns the brokers of an in-process cluster whose listener
// takes SCRAM-SHA-512 logins, of user admin with password.
func saslCluster(t *testing.T) []string {
	_, brokers := testenv.KFake(t, kfake.EnableSASL(), kfake.Superuser(kafka.ScramSHA512, "admin", password))
	return brokers
}

// saslConfig connects to the seeds as admin with pw (saslCluster).
func saslConfig(pw string, seeds ...string) kafka.Config {
	return kafka.Config{Brokers: seeds, SASL: kafka.SASL{Mechanism: kafka.ScramSHA512, User: "admin", Password: secret.New(pw)}}
}

// TestSeedBrokerClosingUnderSASL: with SASL, a seed that closes the
// connection (a broker shutting down, a proxy before a broker that is
// down) while another seed serves the login is no wrong password:
// CheckCredentials and AwaitCluster are served by the other, as kgo's
// Ping was before the seeds were asked at once. A closed connection says
// "wrong password" (ErrAuthentication) only when no seed serves within
// a second of it (TestSeedBrokerSilent).
func TestSeedBrokerClosingUnderSASL(t *testing.T) {
	cfg := saslConfig(password, testenv.ClosingBroker(t), saslCluster(t)[0])
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
