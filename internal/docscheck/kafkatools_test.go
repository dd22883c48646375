package docscheck

import (
	"context"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/testenv"
)

// kafkaTool matches a Kafka command-line tool the docs tell an operator
// to run (kafka-consumer-groups.sh).
var kafkaTool = regexp.MustCompile(`\bkafka-[a-z-]+\.sh\b`)

// kafkaToolRow is a row of the table of docs/operations.md, Kafka's
// command-line tools: the script and the class it runs.
var kafkaToolRow = regexp.MustCompile("^\\| `(kafka-[a-z-]+\\.sh)` \\| `((?:org\\.apache\\.)?kafka(?:\\.[a-z]+)*\\.[A-Z][A-Za-z]*)` \\|")

// TestKafkaToolsHaveTheirClass: every Kafka tool the docs name (a
// runbook's kafka-consumer-groups.sh, the ACLs' kafka-acls.sh) has a row
// in docs/operations.md, Kafka's command-line tools, naming the class it
// runs: deploy/local/kafka.sh fetches Kafka's jars, not its scripts, so
// on the local broker a runbook's command runs as that class.
func TestKafkaToolsHaveTheirClass(t *testing.T) {
	_, files, _ := docs(t)
	rows := kafkaToolClasses(files)
	named := map[string][]string{}
	for name, text := range files {
		for _, tool := range kafkaTool.FindAllString(text, -1) {
			named[tool] = append(named[tool], name)
		}
	}
	var tools []string
	for tool := range named {
		tools = append(tools, tool)
	}
	sort.Strings(tools)
	for _, tool := range tools {
		if rows[tool] == "" {
			t.Errorf("%s names %s, which has no row in docs/operations.md, Kafka's command-line tools (the class it runs)", named[tool][0], tool)
		}
	}
	if len(tools) < 5 {
		t.Fatalf("found %d Kafka tools named in the docs: %v", len(tools), tools)
	}
}

// kafkaToolClasses reads the table of docs/operations.md, Kafka's
// command-line tools: the class of each script.
func kafkaToolClasses(files map[string]string) map[string]string {
	rows := map[string]string{}
	for _, l := range strings.Split(files["docs/operations.md"], "\n") {
		if m := kafkaToolRow.FindStringSubmatch(l); m != nil {
			rows[m[1]] = m[2]
		}
	}
	return rows
}

// TestRealKafkaToolClasses: each class of docs/operations.md, Kafka's
// command-line tools, runs from the jars deploy/local/kafka.sh fetches,
// as the tool it is named for, and the section's example describes a
// consumer group of a real broker.
func TestRealKafkaToolClasses(t *testing.T) {
	brokers := testenv.RealKafka(t)
	root, files, _ := docs(t)
	out, err := exec.Command(filepath.Join(root, "deploy/local/kafka.sh"), "libs").Output()
	if err != nil {
		t.Fatalf("deploy/local/kafka.sh libs: %v", err)
	}
	cp := strings.TrimSpace(string(out)) + "/*"
	java := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, "java", append([]string{"-cp", cp}, args...)...).CombinedOutput()
		return string(out), err
	}
	rows := kafkaToolClasses(files)
	if len(rows) < 5 {
		t.Fatalf("%d rows in docs/operations.md, Kafka's command-line tools", len(rows))
	}
	for tool, class := range rows {
		// --help prints the tool's usage (and exits 1); a class that is
		// not there exits 1 too, saying so.
		out, _ := java(class, "--help")
		if strings.Contains(out, "Could not find or load main class") || !strings.Contains(out, "--bootstrap-server") {
			t.Errorf("%s: java -cp <libs> %s --help did not print a tool's usage:\n%s", tool, class, out)
		}
	}
	out2, err := java(rows["kafka-consumer-groups.sh"], "--bootstrap-server", strings.Join(brokers, ","), "--list")
	if err != nil {
		t.Fatalf("kafka-consumer-groups.sh --list: %v\n%s", err, out2)
	}
}
