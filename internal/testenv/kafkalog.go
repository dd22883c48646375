package testenv

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// EnvKafkaLog names the server.log of the real test broker. scripts/test.sh
// sets it; without it, RealKafkaServerLog looks where deploy/local/kafka.sh
// puts the log of a broker on the port of METERLINE_TEST_KAFKA.
const EnvKafkaLog = "METERLINE_TEST_KAFKA_LOG"

// RealKafkaServerLog returns the path of the real test broker's server.log,
// for tests that assert on what the broker logged. It fails the test when
// the log cannot be found: a check of the broker's log that silently passed
// without one would check nothing. Call it after RealKafka.
//
// Read the log with KafkaServerLogLines: log4j rolls it (server.log.1, …).
func RealKafkaServerLog(t testing.TB) string {
	t.Helper()
	if p := os.Getenv(EnvKafkaLog); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s=%s: %v", EnvKafkaLog, p, err)
		}
		return p
	}
	seed := strings.Split(os.Getenv(EnvKafka), ",")[0]
	_, port, err := net.SplitHostPort(seed)
	if err != nil {
		t.Fatalf("cannot find the broker's server.log: %s=%q has no port (%v); set %s", EnvKafka, seed, err, EnvKafkaLog)
	}
	// deploy/local/kafka.sh's default KAFKA_DATA_DIR (not os.TempDir: the
	// script does not read TMPDIR).
	p := filepath.Join("/tmp", "meterline-kafka-"+port, "server.log")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("cannot find the broker's server.log at %s (%v); set %s to its path", p, err, EnvKafkaLog)
	}
	return p
}

// KafkaServerLogLines returns the lines of the broker log at path and of its
// rolled predecessor (path.1, written before it) that contain every one of
// the substrings, oldest first.
func KafkaServerLogLines(t testing.TB, path string, substrings ...string) []string {
	t.Helper()
	var out []string
	for _, p := range []string{path + ".1", path} {
		b, err := os.ReadFile(p)
		if os.IsNotExist(err) && p != path {
			continue
		}
		if err != nil {
			t.Fatalf("read broker log: %v", err)
		}
	line:
		for l := range strings.SplitSeq(string(b), "\n") {
			for _, s := range substrings {
				if !strings.Contains(l, s) {
					continue line
				}
			}
			out = append(out, l)
		}
	}
	return out
}
