package cli

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/meterline/meterline/aggregator"
)

// TestEntitlementsOrderReachesConfig: --entitlements-order, or
// METERLINE_ENTITLEMENTS_ORDER (run: --aggregate-entitlements-order,
// METERLINE_AGGREGATE_ENTITLEMENTS_ORDER), sets the aggregator's
// Config.EntitlementsOrder; input by default.
func TestEntitlementsOrderReachesConfig(t *testing.T) {
	t.Setenv("METERLINE_DEDUP_KEYS", "k1 "+strings.Repeat("ab", 32)) // run's dedup needs a key
	aggregate := func(args ...string) string {
		t.Helper()
		c := parseCLI(t, append([]string{"aggregate", "--entitlements"}, args...)...)
		cfg, err := c.Aggregate.config(&c.Globals, zap.NewNop(), prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		return cfg.EntitlementsOrder
	}
	run := func(args ...string) string {
		t.Helper()
		c := parseCLI(t, append([]string{"run", "--aggregate-entitlements"}, args...)...)
		_, cfg, err := c.Run.stageConfigs(&c.Globals, zap.NewNop(), prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		return cfg.EntitlementsOrder
	}
	if got := aggregate(); got != aggregator.EntitlementsOrderInput {
		t.Errorf("aggregate: %q by default, want input", got)
	}
	if got := aggregate("--entitlements-order", "arrival"); got != aggregator.EntitlementsOrderArrival {
		t.Errorf("aggregate --entitlements-order arrival: %q", got)
	}
	if got := run("--aggregate-entitlements-order", "arrival"); got != aggregator.EntitlementsOrderArrival {
		t.Errorf("run --aggregate-entitlements-order arrival: %q", got)
	}
	t.Setenv("METERLINE_ENTITLEMENTS_ORDER", "arrival")
	t.Setenv("METERLINE_AGGREGATE_ENTITLEMENTS_ORDER", "arrival")
	if got := aggregate(); got != aggregator.EntitlementsOrderArrival {
		t.Errorf("aggregate with METERLINE_ENTITLEMENTS_ORDER=arrival: %q", got)
	}
	if got := run(); got != aggregator.EntitlementsOrderArrival {
		t.Errorf("run with METERLINE_AGGREGATE_ENTITLEMENTS_ORDER=arrival: %q", got)
	}
	var c CLI
	k, err := Parser(&c, IO{}, func(int) {})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.Parse([]string{"aggregate", "--entitlements-order", "fetch"}); err == nil {
		t.Error("aggregate --entitlements-order fetch accepted")
	}
	cfg := aggregator.Config{EntitlementsOrder: "fetch"}
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err == nil {
		t.Error("Config.Validate accepted EntitlementsOrder fetch")
	}
}
