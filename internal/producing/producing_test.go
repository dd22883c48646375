package producing

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/meterline/meterline/dedup"
	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/session"
	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// root is the repository root: this package is internal/producing.
const root = "../.."

// script runs a project script and returns its standard output, trimmed.
func script(t *testing.T, name string) string {
	t.Helper()
	cmd := exec.Command("bash", filepath.Join(root, "scripts", name))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("scripts/%s: %v\n%s", name, err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

// TestRealProducingExamples runs each producer of docs/producing.md
// (docs/examples/) against the real broker: each sends two events, each
// twice. Dedup then counts every event exactly once, drops every copy as
// an exact copy, and rejects nothing (a wrong fingerprint would be
// unknown_schema, a wrong encoding undecodable, a wrong key misrouted).
func TestRealProducingExamples(t *testing.T) {
	brokers := testenv.RealKafka(t)
	// The topics, and the group, are deleted when the test ends.
	names := testenv.Topics(t, brokers, "", testenv.TopicsOpts{})
	group := names.Prefix + "dedup"

	python := script(t, "client-venv.sh")
	classpath := script(t, "java-clients.sh")
	goBin := filepath.Join(t.TempDir(), "produce-go")
	if out, err := exec.Command("go", "build", "-o", goBin, "github.com/meterline/meterline/docs/examples/go").CombinedOutput(); err != nil {
		t.Fatalf("go build ./docs/examples/go: %v\n%s", err, out)
	}
	examples := []struct {
		name string
		cmd  []string
	}{
		{"python", []string{python, filepath.Join(root, "docs/examples/produce.py")}},
		{"java", []string{"java", "-cp", classpath, filepath.Join(root, "docs/examples/java/Produce.java")}},
		{"go", []string{goBin}},
	}
	for _, ex := range examples {
		cmd := exec.Command(ex.cmd[0], ex.cmd[1:]...)
		cmd.Env = append(os.Environ(), "METERLINE_BROKERS="+strings.Join(brokers, ","), "METERLINE_TOPIC="+names.EventsTopic())
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), `{"sent": 4}`) {
			t.Fatalf("%s example: %v\n%s", ex.name, err, out)
		}
	}

	key, err := dedup.GenerateKey("t")
	if err != nil {
		t.Fatal(err)
	}
	dctx, stop := context.WithCancel(context.Background())
	st, err := dedup.New(dctx, dedup.Config{Topics: names, TickInterval: 200 * time.Millisecond, Keys: []dedup.Key{key},
		Stream: stream.Config{Config: session.Config{Kafka: kafka.Config{Brokers: brokers}, Group: group, InstanceID: "t", SessionTimeout: 6 * time.Second},
			StateDir: filepath.Join(t.TempDir(), "state"), CommitInterval: 50 * time.Millisecond, Logger: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)).Named("dedup")}})
	if err != nil {
		stop()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- st.Run(dctx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("dedup: %v", err)
		}
	}()
	testenv.WaitCaughtUp(t, brokers, group, names.EventsTopic(), 2*time.Minute)

	counted := map[string]int{}
	for _, r := range testenv.ReadAll(t, brokers, names.DedupedTopic()) {
		if k, _ := schemas.PeekKind(r.Value); k != schemas.KindDedupedEvent {
			continue
		}
		var de schemas.DedupedEvent
		if err := schemas.DecodeInto(r.Value, &de); err != nil {
			t.Fatal(err)
		}
		counted[fmt.Sprintf("%s/%s/%s q=%d src=%s props=%v", de.CustomerID, de.Meter, de.EventID, de.Quantity, de.Source, de.Properties)]++
	}
	want := map[string]int{}
	for _, lang := range []string{"py", "java", "go"} {
		src := map[string]string{"py": "python-example", "java": "java-example", "go": "go-example"}[lang]
		want[fmt.Sprintf("acme/api_calls/%s-req-1 q=3 src=%s props=[]", lang, src)] = 1
		props := "[{model m1}]"
		if lang == "java" {
			props = "[]"
		}
		want[fmt.Sprintf("acme/tokens/%s-req-2 q=1200 src=%s props=%s", lang, src, props)] = 1
	}
	if fmt.Sprint(counted) != fmt.Sprint(want) {
		t.Errorf("counted downstream:\n%v\nwant:\n%v", counted, want)
	}
	exact := 0
	for _, r := range testenv.ReadAll(t, brokers, names.DuplicatesTopic()) {
		var d schemas.Duplicate
		if err := schemas.DecodeInto(r.Value, &d); err != nil {
			t.Fatal(err)
		}
		if !d.Conflict {
			exact++
		}
	}
	if exact != 6 {
		t.Errorf("%d exact copies dropped, want 6 (each example's retries)", exact)
	}
	for _, r := range testenv.ReadAll(t, brokers, names.RejectedTopic()) {
		var rej schemas.Rejected
		_ = schemas.DecodeInto(r.Value, &rej)
		t.Errorf("rejected: %s %s (%s/%s/%s)", rej.Reason, rej.Detail, rej.CustomerID, rej.Meter, rej.EventID)
	}
}
