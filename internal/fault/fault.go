// Package fault puts named crash points at the crash windows
// (docs/design.md, Exactly-once, "Crash windows").
//
// A point costs one atomic load when nothing is armed. In the real binary,
// METERLINE_FAULT=<point>[@<n>] arms one point: its n-th hit (default 1)
// kills the process with SIGKILL, exactly as `kill -9` would — no deferred
// function runs, no transaction is ended, nothing is flushed. Tests that run
// a stage in-process install a Handler instead.
package fault

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
)

// EnvVar arms a point in the real binary.
const EnvVar = "METERLINE_FAULT"

// The points, one per crash window of a stage (docs/design.md,
// Exactly-once, "Crash windows") plus the restore path.
const (
	// BeforeCommit: outputs and changelog produced, transaction not ended.
	BeforeCommit = "stream.before-commit"
	// AfterCommit: transaction committed, Pebble not yet updated.
	AfterCommit = "stream.after-commit"
	// DuringApply: half of the state batch built, nothing applied.
	DuringApply = "stream.during-apply"
	// AfterApply: Pebble updated, before the next poll.
	AfterApply = "stream.after-apply"
	// DuringRestore: part of the changelog replayed into Pebble.
	DuringRestore = "stream.during-restore"
	// FinalDecided: the aggregator decided a period final (its marker) in
	// the open transaction, which is not committed yet.
	FinalDecided = "aggregate.final-decided"
	// BetweenChunks: a chunk of a period's FINAL revisions (or queued
	// adjustments, or expiry) is committed with its cursor; the next chunk
	// has not started.
	BetweenChunks = "aggregate.between-chunks"
	// ChargeDecided: the aggregator decided an event's entitlements (a cap
	// counter moved, credits drawn, or the event rejected) in the open
	// transaction, which is not committed yet.
	ChargeDecided = "aggregate.charge-decided"
)

// Crash is the panic value of CrashHandler: a stage that recovers it stops
// at once, as if the process had been killed there — no transaction is
// ended and no state is applied.
type Crash struct{ Point string }

// CrashHandler is a Handler for in-process tests: it panics with Crash.
func CrashHandler(point string) { panic(Crash{Point: point}) }

var (
	armed   atomic.Bool
	mu      sync.Mutex
	target  string
	hitsFor int64
	hits    atomic.Int64
	handler func(point string)
)

func init() {
	if v := os.Getenv(EnvVar); v != "" {
		if err := Arm(v); err != nil {
			fmt.Fprintf(os.Stderr, "meterline: %s: %v\n", EnvVar, err)
			os.Exit(2)
		}
	}
}

// Arm arms "point" or "point@n" (trigger on the n-th hit, n ≥ 1). Arm("")
// disarms.
func Arm(spec string) error {
	mu.Lock()
	defer mu.Unlock()
	if spec == "" {
		armed.Store(false)
		target = ""
		return nil
	}
	name, n := spec, int64(1)
	if i := strings.LastIndexByte(spec, '@'); i >= 0 {
		v, err := strconv.ParseInt(spec[i+1:], 10, 64)
		if err != nil || v < 1 {
			return fmt.Errorf("fault: bad hit count in %q", spec)
		}
		name, n = spec[:i], v
	}
	target, hitsFor = name, n
	hits.Store(0)
	armed.Store(true)
	return nil
}

// SetHandler replaces the SIGKILL with f, for in-process tests; nil
// restores SIGKILL. f must not return normally if the caller is to stop
// where it is (panic, runtime.Goexit).
func SetHandler(f func(point string)) {
	mu.Lock()
	defer mu.Unlock()
	handler = f
}

// Hit marks that execution reached point. If the point is armed and this is
// its n-th hit, the process dies here.
func Hit(point string) {
	if !armed.Load() {
		return
	}
	mu.Lock()
	if point != target {
		mu.Unlock()
		return
	}
	n := hits.Add(1)
	h := handler
	fire := n == hitsFor
	if fire {
		armed.Store(false)
	}
	mu.Unlock()
	if !fire {
		return
	}
	if h != nil {
		h(point)
		return
	}
	fmt.Fprintf(os.Stderr, "meterline: fault point %s hit (%s): killing the process\n", point, EnvVar)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // SIGKILL is not deliverable late; never return
}
