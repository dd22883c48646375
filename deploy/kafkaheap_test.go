package deploy

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestLocalBrokerCleanerFitsHeap: the local brokers (local/kafka.sh) run
// with small heaps (KAFKA_HEAP_OPTS: its defaults, and what tests give),
// and Kafka allocates the log cleaner's offset map on the heap, whole, at
// start. At the default 128 MiB in a 256 MiB heap, a start failed now and
// then with OutOfMemoryError (SkimpyOffsetMap). The template sets the map
// to at most a quarter of the smallest -Xmx any script or test starts a
// broker with.
func TestLocalBrokerCleanerFitsHeap(t *testing.T) {
	tmpl, err := os.ReadFile("local/kafka/server.properties.template")
	if err != nil {
		t.Fatal(err)
	}
	buffer := int64(128 << 20) // Kafka's default
	for _, l := range strings.Split(string(tmpl), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "log.cleaner.dedupe.buffer.size="); ok {
			if buffer, err = strconv.ParseInt(v, 10, 64); err != nil {
				t.Fatalf("log.cleaner.dedupe.buffer.size=%s: %v", v, err)
			}
		}
	}
	// Every -Xmx of a broker heap: kafka.sh's defaults, and every
	// KAFKA_HEAP_OPTS a Go test or script of the repository sets.
	xmx := regexp.MustCompile(`-Xmx(\d+)([mg])`)
	heapOpts := regexp.MustCompile(`KAFKA_HEAP_OPTS[^\n]*`)
	smallest, where := int64(0), ""
	err = filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !(strings.HasSuffix(path, ".go") || strings.HasSuffix(path, ".sh")) || strings.HasSuffix(path, "kafkaheap_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, l := range heapOpts.FindAllString(string(b), -1) {
			for _, m := range xmx.FindAllStringSubmatch(l, -1) {
				n, _ := strconv.ParseInt(m[1], 10, 64)
				n <<= 20
				if m[2] == "g" {
					n <<= 10
				}
				if smallest == 0 || n < smallest {
					smallest, where = n, path
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if smallest == 0 {
		t.Fatal("no KAFKA_HEAP_OPTS with -Xmx found: kafka.sh's defaults should be")
	}
	if buffer > smallest/4 {
		t.Errorf("the log cleaner's offset map is %d MiB, more than a quarter of the %d MiB heap of a broker in %s: set log.cleaner.dedupe.buffer.size in local/kafka/server.properties.template",
			buffer>>20, smallest>>20, where)
	}
}
