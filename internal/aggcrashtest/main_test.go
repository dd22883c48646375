// Package aggcrashtest is the real-broker suite of the aggregator (issue 4,
// "On the real broker"): it runs the real `meterline aggregate` (and, for
// the idle-partition test, `meterline dedup`) binary as child processes
// against the real Kafka broker named by METERLINE_TEST_KAFKA, kills them
// at the named fault points (METERLINE_FAULT) or from outside, restarts
// them, and then checks every aggregate against a model of DESIGN §3 kept
// in the test: exactly one FINAL per key, with the exact value, and the
// late events as adjustments whose deltas add up to the period's value.
//
// Every test calls testenv.RealKafka, so `go test -short ./...` skips the
// package.
package aggcrashtest

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/meterline/meterline/internal/testenv"
)

// binPath is the meterline binary TestMain built; empty when the tests
// skip.
var binPath string

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() || os.Getenv(testenv.EnvKafka) == "" {
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "meterline-aggcrashtest-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "aggcrashtest:", err)
		os.Exit(1)
	}
	bin := filepath.Join(dir, "meterline")
	build := exec.Command("go", "build", "-o", bin, "github.com/meterline/meterline/cmd/meterline")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "aggcrashtest: building the meterline binary:", err)
		_ = os.RemoveAll(dir)
		os.Exit(1)
	}
	binPath = bin
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}
