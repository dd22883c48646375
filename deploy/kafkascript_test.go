package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meterline/meterline/internal/testenv"
)

// TestKafkaScriptHintNamesItsBroker: local/kafka.sh refuses to start a
// data dir formatted with another KAFKA_SECURITY, and the command its
// message tells to run acts on that broker: with the KAFKA_PORT and
// KAFKA_DATA_DIR it was given, not a bare "kafka.sh clean", which deletes
// the data of the default port's broker. The refusal comes before the
// script fetches Kafka's jars.
func TestKafkaScriptHintNamesItsBroker(t *testing.T) {
	if _, err := exec.LookPath("java"); err != nil {
		t.Skip("SKIP: kafka.sh start needs java on PATH")
	}
	dir := filepath.Join(t.TempDir(), "kafka")
	for _, f := range []string{".meterline-kafka", "kraft-data/meta.properties"} { // formatted, plaintext
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	_, port, _ := strings.Cut(testenv.FreeAddr(t), ":")
	c := exec.Command("local/kafka.sh", "start")
	c.Env = append(os.Environ(), "KAFKA_PORT="+port, "KAFKA_CONTROLLER_PORT=1" /* never listening */, "KAFKA_DATA_DIR="+dir,
		"KAFKA_SECURITY=sasl_ssl", "METERLINE_CACHE_DIR="+t.TempDir())
	out, err := c.CombinedOutput()
	if err == nil {
		t.Fatalf("start succeeded on a data dir formatted without SASL:\n%s", out)
	}
	want := "run 'KAFKA_PORT=" + port + " KAFKA_DATA_DIR=" + dir + " "
	if !strings.Contains(string(out), "formatted with KAFKA_SECURITY=plaintext") || !strings.Contains(string(out), want) {
		t.Fatalf("kafka.sh start said:\n%s\nwant the refusal, with a command that starts %q", out, want)
	}
}
