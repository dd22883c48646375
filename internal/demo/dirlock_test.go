package demo

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestDemoRefusesADirInUse: a second demo on the directory of one that
// runs refuses it, rather than emptying the running demo's broker data
// and state under it; the running demo carries on and reconciles.
func TestDemoRefusesADirInUse(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIP: runs a demo for ~10 s; drop -short")
	}
	dir := t.TempDir()
	var first syncBuffer
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	type result struct {
		ok  bool
		err error
	}
	done := make(chan result, 1)
	go func() {
		ok, err := Run(ctx, Config{Dir: dir, Rate: 50, Seed: 7, Out: &first})
		done <- result{ok, err}
	}()
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(first.String(), "events in"); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the first demo did not start generating:\n%s", first.String())
		}
	}
	var second syncBuffer
	ok, err := Run(context.Background(), Config{Dir: dir, Duration: 2 * time.Second, Rate: 50, Seed: 8, Out: &second})
	if err == nil || !strings.Contains(err.Error(), "in use by another meterline demo") {
		t.Errorf("a second demo on %s: ok %v, error %v; want it refused as in use\n%s", dir, ok, err, second.String())
	}
	time.Sleep(3 * time.Second)
	stop()
	r := <-done
	if r.err != nil || !r.ok {
		t.Fatalf("the first demo: ok %v, error %v\n%s", r.ok, r.err, first.String())
	}
}
