package testenv

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
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
// Read it with KafkaServerLogLines: log4j rolls it (server.log.1, …).
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

// KafkaServerLogLines returns the lines the broker logged at path since
// the given time that contain every one of the substrings, oldest first.
//
// log4j2 rolls the log into path.1 … path.5 (deploy/local/kafka/
// log4j2.properties; with the default fileIndex=max, path.1 is the oldest).
// Every rolled file modified at or after since, less a second for file
// systems that keep coarse times, is read too, in the order of their
// modification times; path itself is always read. A file may hold lines
// from before since: callers match on names that are unique to their test.
func KafkaServerLogLines(t testing.TB, path string, since time.Time, substrings ...string) []string {
	t.Helper()
	type rolled struct {
		path string
		mod  time.Time
	}
	var files []rolled
	for i := 1; i <= 5; i++ {
		p := fmt.Sprintf("%s.%d", path, i)
		if fi, err := os.Stat(p); err == nil && !fi.ModTime().Before(since.Add(-time.Second)) {
			files = append(files, rolled{p, fi.ModTime()})
		}
	}
	// Stable: equal times keep fileIndex=max's order (lower index older).
	slices.SortStableFunc(files, func(a, b rolled) int { return a.mod.Compare(b.mod) })
	paths := make([]string, 0, len(files)+1)
	for _, f := range files {
		paths = append(paths, f.path)
	}
	var out []string
	for _, p := range append(paths, path) {
		b, err := os.ReadFile(p)
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
