package testenv

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestKafkaServerLogLinesReadsRolledFiles: log4j2 (fileIndex=max) rolls
// server.log into server.log.1 (oldest) … server.log.5 (newest). The lines
// since a time come from every file written to since then, oldest first.
func TestKafkaServerLogLinesReadsRolledFiles(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "server.log")
	write := func(p, s string, mod time.Time) {
		t.Helper()
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, mod, mod); err != nil {
			t.Fatal(err)
		}
	}
	since := time.Now().Add(-time.Minute)
	write(path+".1", "x refused a\n", since.Add(-time.Hour)) // rolled before since: not read
	write(path+".2", "x refused b\nx fine c\n", since.Add(time.Second))
	write(path+".3", "x refused d\n", since.Add(2*time.Second))
	write(path, "y refused e\nx refused f", time.Now())

	got := KafkaServerLogLines(t, path, since, "x", "refused")
	if want := []string{"x refused b", "x refused d", "x refused f"}; !slices.Equal(got, want) {
		t.Fatalf("lines = %q, want %q", got, want)
	}

	// Oldest first by modification time, whatever the indexes say.
	write(path+".1", "x refused g\n", since.Add(4*time.Second))
	write(path+".4", "x refused h\n", since.Add(3*time.Second))
	got = KafkaServerLogLines(t, path, since, "x", "refused")
	if want := []string{"x refused b", "x refused d", "x refused h", "x refused g", "x refused f"}; !slices.Equal(got, want) {
		t.Fatalf("lines = %q, want %q", got, want)
	}
}
