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
	_, brokers := testenv.KFake(t, kfake.EnableSASL(), kfake.Superuser(kafka.ScramSHA512, "admin", password))
	silent := testenv.SilentBroker(t)
	for _, c := range []struct {
		name     string
		password string
		want     error
	}{{"right password", password, nil}, {"wrong password", "wrong-" + password, kafka.ErrAuthentication}} {
		t.Run(c.name, func(t *testing.T) {
			cfg := kafka.Config{Brokers: []string{silent, brokers[0]},
				SASL: kafka.SASL{Mechanism: kafka.ScramSHA512, User: "admin", Password: secret.New(c.password)}}
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
