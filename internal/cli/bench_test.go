package cli

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/meterline/meterline/internal/testenv"
)

// TestBenchProduce runs `meterline bench produce` on kfake: the flags reach
// the harness, both paths send every event, the table and the JSON have
// their fields, and no benchmark topic is left.
func TestBenchProduce(t *testing.T) {
	_, brokers := testenv.KFake(t)
	prefix := testenv.Name(t, "")
	code, out, errOut := run(t, "", "bench", "produce", "--brokers", strings.Join(brokers, ","), "--topic-prefix", prefix,
		"--events", "300", "--partitions", "2", "--rounds", "2", "--customers", "7", "--json")
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	lines := strings.Split(out, "\n")
	for i, want := range []string{"events: 300 per run, 2 partitions, 2 rounds (medians)", "baseline raw franz-go: ", "meterline produce:     ", "ratio:                 "} {
		if i >= len(lines) || !strings.HasPrefix(lines[i], want) {
			t.Fatalf("line %d: want %q\n%s", i+1, want, out)
		}
	}
	var res struct {
		Baseline []struct {
			Name   string `json:"name"`
			Events int    `json:"events"`
		} `json:"baseline"`
		Produce []struct {
			Events int     `json:"events"`
			Rate   float64 `json:"events_per_second"`
		} `json:"produce"`
		Ratio float64 `json:"ratio"`
	}
	if err := json.Unmarshal([]byte(lines[4]), &res); err != nil {
		t.Fatalf("JSON: %v\n%s", err, out)
	}
	if len(res.Baseline) != 2 || len(res.Produce) != 2 || res.Baseline[0].Name != "raw-franz-go" ||
		res.Baseline[1].Events != 300 || res.Produce[0].Events != 300 || res.Produce[0].Rate <= 0 || res.Ratio <= 0 {
		t.Errorf("JSON %+v", res)
	}
	tds, err := testenv.Admin(t, brokers).ListTopics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range tds.Names() {
		if strings.HasPrefix(name, prefix) {
			t.Errorf("topic %s left behind", name)
		}
	}
}

// TestBenchFlagsOutOfRange: a benchmark with nonsense flags exits 2 at once,
// naming every flag at fault, before it touches a broker.
func TestBenchFlagsOutOfRange(t *testing.T) {
	code, _, errOut := run(t, "", "bench", "dedup", "--brokers", "127.0.0.1:1", "--rounds=-1", "--events=-1", "--duplicate-rate", "2")
	if code != 2 {
		t.Fatalf("exit %d, want 2\n%s", code, errOut)
	}
	for _, want := range []string{"rounds must be positive", "events must be positive", "duplicate-rate must be from 0 to 1"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr does not say %q:\n%s", want, errOut)
		}
	}
}
