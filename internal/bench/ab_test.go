package bench

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeBinary writes an executable that stands for a meterline binary in
// scripts/bench-ab.sh: its n-th call appends its name and arguments to
// calls and prints the table of a `bench <what>` run whose stage ran at
// stage[n] and baseline (b) at b[n] events/s, as printRates prints it.
func fakeBinary(t *testing.T, dir, name, what, calls string, stage, b []float64) string {
	t.Helper()
	for n := range stage {
		res := &Results{Runs: [][]Result{
			{{Name: "(a) passthrough", Count: 1000, Elapsed: time.Second}},
			{{Name: "(b) passthrough + changelog record per event", Count: int(b[n]), Elapsed: time.Second}},
			{{Name: what, Count: int(stage[n]), Elapsed: time.Second}},
		}}
		var out bytes.Buffer
		fmt.Fprintf(&out, "input: 1000 records in usage.deduped; medians of 1 rounds\n")
		printRates(&out, res)
		fmt.Fprintf(&out, "%s revisions emitted: 12\nlatency produce → visible: p50 1ms, p99 2ms (5 events at 5/s)\n", what)
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-%d.out", name, n)), out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, name)
	script := fmt.Sprintf(`#!/usr/bin/env bash
n=$(cat %[1]q.count 2>/dev/null || echo 0)
echo $((n + 1)) > %[1]q.count
echo "%[2]s $*" >> %[3]q
[ -f %[1]q-$n.out ] || { echo "no run $n" >&2; exit 1; }
cat %[1]q-$n.out
`, bin, name, calls)
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// TestBenchABScript runs scripts/bench-ab.sh on two fake binaries: the
// rounds alternate which runs first, every run gets --rounds 1 and the
// flags after --, and the medians and ratios are those of the rates the
// binaries printed.
func TestBenchABScript(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("SKIP: no bash")
	}
	for _, what := range []string{"dedup", "aggregate"} {
		t.Run(what, func(t *testing.T) {
			dir := t.TempDir()
			calls := filepath.Join(dir, "calls")
			// Stage rates per round, old 100 300 200, new 110 280 240;
			// (b) 200 everywhere but new's last round, 300.
			old := fakeBinary(t, dir, "old", what, calls, []float64{100, 300, 200}, []float64{200, 200, 200})
			new := fakeBinary(t, dir, "new", what, calls, []float64{110, 280, 240}, []float64{200, 200, 300})
			cmd := exec.Command("bash", "../../scripts/bench-ab.sh", old, new, what, "3", "--", "--brokers", "b:1", "--events", "7")
			cmd.Env = append(os.Environ(), "AB_LOG_DIR="+filepath.Join(dir, "logs"))
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("%v\n%s%s", err, stdout.String(), stderr.String())
			}
			got, err := os.ReadFile(calls)
			if err != nil {
				t.Fatal(err)
			}
			args := "bench " + what + " --rounds 1 --brokers b:1 --events 7"
			want := strings.Join([]string{"old " + args, "new " + args, "new " + args, "old " + args, "old " + args, "new " + args}, "\n") + "\n"
			if string(got) != want {
				t.Errorf("calls:\n%s\nwant:\n%s", got, want)
			}
			out := stdout.String()
			for _, line := range []string{
				"    1       100      200       110      200    1.100           1.100",
				"    3       200      200       240      300    1.200           0.800",
				"median old: 200 events/s (1.000 of (b))",
				"median new: 240 events/s (0.800 of (b))", // 0.55, 1.4, 0.8
				"new/old, ratio of medians:         1.200 (of (b): 0.800)",
				"new/old, median of round ratios:   1.100 (of (b): 0.933)",
			} {
				if !strings.Contains(out, line+"\n") {
					t.Errorf("output lacks %q:\n%s", line, out)
				}
			}
		})
	}
	t.Run("a failed run", func(t *testing.T) {
		dir := t.TempDir()
		calls := filepath.Join(dir, "calls")
		old := fakeBinary(t, dir, "old", "dedup", calls, []float64{100}, []float64{200})
		new := fakeBinary(t, dir, "new", "dedup", calls, nil, nil) // no output: exits 1
		cmd := exec.Command("bash", "../../scripts/bench-ab.sh", old, new, "dedup", "2")
		cmd.Env = append(os.Environ(), "AB_LOG_DIR="+filepath.Join(dir, "logs"))
		if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "round 1, new failed") {
			t.Errorf("a failed run: %v\n%s", err, out)
		}
	})
}
