package demo

import (
	"context"
	"os"
	"path/filepath"
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

// TestDemoRefusesADirItDidNotMake: the demo empties the kafka and state
// directories in its --dir at start. In a directory no demo made (--dir .
// where the stages keep their state in state/, as docs/operations.md's
// example does, or where kafka/ holds configuration) it must refuse
// rather than delete them; in one a demo made, it starts.
func TestDemoRefusesADirItDidNotMake(t *testing.T) {
	for _, sub := range []string{"kafka", "state"} {
		other := t.TempDir()
		if err := os.MkdirAll(filepath.Join(other, sub), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(other, sub, "precious"), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		ok, err := Run(ctx, Config{Dir: other, Duration: time.Second, Rate: 50, Seed: 3})
		cancel()
		if err == nil || !strings.Contains(err.Error(), "no meterline demo made") || !strings.Contains(err.Error(), filepath.Join(other, sub)) {
			t.Errorf("a demo on a directory holding %s/ it did not make: ok %v, error %v; want it refused, naming %s", sub, ok, err, filepath.Join(other, sub))
		}
		if _, err := os.Stat(filepath.Join(other, sub, "precious")); err != nil {
			t.Errorf("the demo deleted %s/ of a directory it did not make: %v", sub, err)
		}
	}
	// A directory a demo ran in (its lock file) is the demo's own.
	l, err := LockDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dirOfDemo := filepath.Dir(l.f.Name())
	l.Close()
	if err := os.MkdirAll(filepath.Join(dirOfDemo, "state", "meterline-dedup"), 0o755); err != nil {
		t.Fatal(err)
	}
	if l, err := LockDir(dirOfDemo); err != nil {
		t.Errorf("a directory a demo made: %v", err)
	} else {
		l.Close()
	}
}

// TestDemoTakesADirAnEarlierDemoMade: a demo run before demos kept a lock
// file in their --dir (the default ./meterline-demo of the README) left
// kafka/ and state/ with files and its demo.log, but no lock file. Run
// again there, the demo's own directory is not one "no demo made".
func TestDemoTakesADirAnEarlierDemoMade(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"demo.log", filepath.Join("kafka", "meta.dat"), filepath.Join("state", "meterline-dedup", "MANIFEST-000001")} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	l, err := LockDir(dir)
	if err != nil {
		t.Fatalf("a directory an earlier demo made (its demo.log, no lock file): %v", err)
	}
	l.Close()
}
