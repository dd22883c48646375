// Package crashtest is the real-broker crash suite of the dedup stage
// (DESIGN §6, "Crash windows"): it runs the real `meterline dedup` binary as
// child processes against the real Kafka broker named by
// METERLINE_TEST_KAFKA, kills them at the named fault points (or with
// SIGKILL, SIGTERM, SIGSTOP from outside), restarts them, and counts the
// outputs afterwards: every identity exactly once in usage.deduped, every
// other copy in usage.duplicates, nothing lost.
//
// Every test calls testenv.RealKafka, so `go test -short ./...` skips the
// package; `make test` runs it.
package crashtest

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/meterline/meterline/internal/testenv"
)

// binPath is the meterline binary TestMain built; empty when the real-broker
// tests skip.
var binPath string

// TestMain builds the real binary once for the whole package, unless the
// tests are going to skip (-short, or no real broker).
func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() || os.Getenv(testenv.EnvKafka) == "" {
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "meterline-crashtest-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "crashtest:", err)
		os.Exit(1)
	}
	bin := filepath.Join(dir, "meterline")
	build := exec.Command("go", "build", "-o", bin, "github.com/meterline/meterline/cmd/meterline")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "crashtest: building the meterline binary:", err)
		_ = os.RemoveAll(dir)
		os.Exit(1)
	}
	binPath = bin
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}
