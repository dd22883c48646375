package ingest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/aggregator"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/producer"
)

// docBlocks returns the code blocks of a Markdown file of the repository
// in lang that contain needle.
func docBlocks(t *testing.T, file, lang, needle string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", file))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	lines := strings.Split(string(b), "\n")
	for i := 0; i < len(lines); i++ {
		if lines[i] != "```"+lang {
			continue
		}
		var text strings.Builder
		for i++; i < len(lines) && lines[i] != "```"; i++ {
			text.WriteString(lines[i] + "\n")
		}
		if strings.Contains(text.String(), needle) {
			out = append(out, text.String())
		}
	}
	return out
}

// clientPython returns the python of the project's client virtualenv
// (scripts/client-venv.sh: OpenMeter's SDK, CloudEvents, confluent-kafka,
// fastavro), making it on first use.
func clientPython(t *testing.T) string {
	t.Helper()
	cmd := exec.Command("bash", filepath.Join("..", "scripts", "client-venv.sh"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("scripts/client-venv.sh: %v\n%s", err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

// TestRealDocsClients runs the clients of docs/ingest.md's quick start
// against the ingest on the real broker, with the page's meters file: the
// curl lines, then OpenMeter's Python SDK (the published package, with its
// own API-key header), each as written on the page but for the address.
// Every event is written once per meter its type feeds.
func TestRealDocsClients(t *testing.T) {
	brokers := testenv.RealKafka(t)
	python := clientPython(t)
	metersYAML := docBlocks(t, "docs/ingest.md", "yaml", "event_type: prompt")
	curls := docBlocks(t, "docs/ingest.md", "sh", "curl ")
	sdks := docBlocks(t, "docs/ingest.md", "python", "from openmeter import Client")
	if len(metersYAML) != 1 || len(curls) != 1 || len(sdks) != 1 {
		t.Fatalf("docs/ingest.md: %d meters files, %d curl blocks, %d SDK blocks; want one each", len(metersYAML), len(curls), len(sdks))
	}
	// The README's example posts one more event, with the same meters.
	readme := docBlocks(t, "README.md", "sh", "curl ")
	if len(readme) != 1 {
		t.Fatalf("README.md: %d curl blocks, want one", len(readme))
	}
	curls = append(curls, readme...)
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
	py := exec.Command(python, "-c", strings.ReplaceAll(sdks[0], docURL, e.srv.URL()))
	py.Env = env
	if out, err := py.CombinedOutput(); err != nil {
		t.Fatalf("the OpenMeter SDK block failed: %v\n%s", err, out)
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
	if tokens != 12+30+7+5+8+13+20 || prompts != 7 || len(ids) != 7 || !ids[producer.EventID("chat-api", "req-42")] {
		t.Errorf("tokens %d, prompts %d, %d event IDs (req-42 among them: %v); want 95, 7 and 7", tokens, prompts, len(ids), ids[producer.EventID("chat-api", "req-42")])
	}
}
