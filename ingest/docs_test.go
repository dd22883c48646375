package ingest

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/aggregator"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/producer"
)

// TestRealDocsClients runs the clients of docs/ingest.md's quick start and
// of the README against the ingest on the real broker, with the page's
// meters file: the curl lines, then OpenMeter's Python SDK and its Node
// SDK (the published packages, with their own API-key header), each as
// written but for the address.
// Every event is written once per meter its type feeds.
func TestRealDocsClients(t *testing.T) {
	brokers := testenv.RealKafka(t)
	python := testenv.ClientPython(t)
	node := testenv.ClientNode(t)
	metersYAML := testenv.DocBlocks(t, "docs/ingest.md", "yaml", "event_type: prompt")
	curls := testenv.DocBlocks(t, "docs/ingest.md", "sh", "curl ")
	sdks := testenv.DocBlocks(t, "docs/ingest.md", "python", "from openmeter import Client")
	nodeSDKs := testenv.DocBlocks(t, "docs/ingest.md", "js", "from '@openmeter/sdk'")
	if len(metersYAML) != 1 || len(curls) != 1 || len(sdks) != 1 || len(nodeSDKs) != 1 {
		t.Fatalf("docs/ingest.md: %d meters files, %d curl blocks, %d Python SDK blocks, %d Node SDK blocks; want one each",
			len(metersYAML), len(curls), len(sdks), len(nodeSDKs))
	}
	// The README's example posts one more event, with the same meters.
	readme := testenv.DocBlocks(t, "README.md", "sh", "curl ")
	if len(readme) != 1 {
		t.Fatalf("README.md: %d curl blocks, want one", len(readme))
	}
	curls = append(curls, readme...)
	readmeSDK := testenv.DocBlocks(t, "README.md", "python", "from openmeter import Client")
	if len(readmeSDK) != 1 {
		t.Fatalf("README.md: %d SDK blocks, want one", len(readmeSDK))
	}
	sdks = append(sdks, readmeSDK...)
	cat, err := aggregator.ParseMeters([]byte(metersYAML[0]))
	if err != nil {
		t.Fatal(err)
	}
	e := newEnvOn(t, brokers, nil, func(c *Config) { c.Meters = cat })
	env := append(os.Environ(), "TOKEN="+e.token)
	const docURL = "http://127.0.0.1:8888"

	for _, c := range curls {
		sh := exec.Command("bash", "-euo", "pipefail", "-c", strings.ReplaceAll(c, docURL, e.srv.URL()))
		sh.Env = env
		if out, err := sh.CombinedOutput(); err != nil {
			t.Fatalf("the curl block failed: %v\n%s\n%s", err, c, out)
		}
	}
	for _, sdk := range sdks {
		py := exec.Command(python, "-c", strings.ReplaceAll(sdk, docURL, e.srv.URL()))
		py.Env = env
		if out, err := py.CombinedOutput(); err != nil {
			t.Fatalf("the OpenMeter SDK block failed: %v\n%s\n%s", err, sdk, out)
		}
	}
	for _, sdk := range nodeSDKs {
		if out, err := runNode(t, node, strings.ReplaceAll(sdk, docURL, e.srv.URL()), "TOKEN="+e.token); err != nil {
			t.Fatalf("the OpenMeter Node SDK block failed: %v\n%s\n%s", err, sdk, out)
		}
	}

	var tokens, prompts int64
	ids := map[string]bool{}
	for _, ue := range e.records() {
		ids[ue.EventID] = true
		switch ue.Meter {
		case "tokens":
			tokens += ue.Quantity
		case "prompts":
			prompts += ue.Quantity
		default:
			t.Errorf("record of meter %s", ue.Meter)
		}
		if ue.Source != "chat-api" || !strings.HasPrefix(ue.CustomerID, "acme-") || time.Since(time.UnixMilli(ue.EventTime)) > time.Minute {
			t.Errorf("record %+v", ue)
		}
	}
	if tokens != 12+30+7+5+8+13+40+3+6+20+9 || prompts != 11 || len(ids) != 11 || !ids[producer.EventID("chat-api", "req-42")] || !ids[producer.EventID("chat-api", "req-43")] {
		t.Errorf("tokens %d, prompts %d, %d event IDs (req-42 and req-43 among them: %v, %v); want 153, 11 and 11", tokens, prompts, len(ids),
			ids[producer.EventID("chat-api", "req-42")], ids[producer.EventID("chat-api", "req-43")])
	}
}
