package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestProcess: WaitLog finds a line the child logs after a while, and Stop
// ends it with SIGTERM and sees its status 0.
func TestProcess(t *testing.T) {
	script := `sleep 0.2; echo '{"msg":"serving metrics and health","addr":"127.0.0.1:1234"}'
trap 'exit 0' TERM
while :; do sleep 0.05; done`
	p := StartProcess(t, "sh", filepath.Join(t.TempDir(), "sh.log"), "/bin/sh", "-c", script)
	m := p.WaitLog(t, regexp.MustCompile(`"addr":"([^"]+)"`), 10*time.Second)
	if m[1] != "127.0.0.1:1234" {
		t.Fatalf("WaitLog = %q, want the address", m)
	}
	p.Stop(t)
}

// TestProcessFaultKill: a child that may die kills itself with SIGKILL
// after logging the fault point; ExpectFaultKill accepts that, Tail leaves
// out the TailSkip lines, and LogLines parses the JSON lines.
func TestProcessFaultKill(t *testing.T) {
	script := `echo '{"ts":"2026-01-02T03:04:05.678Z","msg":"partition restored","changelog_records":7}'
echo '{"msg":"noise"}'
echo 'fault point p.q hit'
kill -KILL $$`
	p := StartProcessOpts(t, ProcessOpts{MayDie: true, TailSkip: `"noise"`}, "sh", filepath.Join(t.TempDir(), "sh.log"), "/bin/sh", "-c", script)
	p.ExpectFaultKill(t, "p.q", 10*time.Second)
	if got := p.Tail(2); got != `{"ts":"2026-01-02T03:04:05.678Z","msg":"partition restored","changelog_records":7}`+"\nfault point p.q hit" {
		t.Errorf("Tail(2) = %q", got)
	}
	if rec, n := p.Replayed(); rec != 7 || n != 1 {
		t.Errorf("Replayed() = %d, %d; want 7, 1", rec, n)
	}
	if ls := p.Lines("partition restored"); len(ls) != 1 || ls[0].TS.UnixMilli() != time.Date(2026, 1, 2, 3, 4, 5, 678e6, time.UTC).UnixMilli() {
		t.Errorf("Lines = %+v", ls)
	}
}

func TestMetricsSum(t *testing.T) {
	m := Metrics{`a_total{p="0"}`: 1, `a_total{p="1"}`: 2, "a_total_x": 10, "b": 4}
	if got := m.Sum("a_total"); got != 3 {
		t.Errorf("Sum(a_total) = %v, want 3", got)
	}
	if got := m.Sum("b"); got != 4 {
		t.Errorf("Sum(b) = %v, want 4", got)
	}
}

// fatalOf runs fn with a testing.TB whose Fatalf ends fn and returns the
// message ("" if fn returned without Fatalf).
func fatalOf(t *testing.T, fn func(tb testing.TB)) string {
	r := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(r)
	}()
	<-done
	return r.msg
}

type fatalRecorder struct {
	testing.TB
	msg string
}

func (r *fatalRecorder) Helper() {}

func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// TestExpectFaultKillRejects: ExpectFaultKill fails the test for a child
// that exits cleanly, one killed without the log line of the point, and
// one that does not die in time.
func TestExpectFaultKillRejects(t *testing.T) {
	for _, c := range []struct {
		name, script string
		d            time.Duration
		want         string
	}{
		{"clean exit", `echo 'fault point p.q hit'; exit 0`, 10 * time.Second, "want death by SIGKILL at p.q"},
		{"other point", `echo 'fault point p.r hit'; kill -KILL $$`, 10 * time.Second, `its log does not say "fault point p.q hit"`},
		{"no death", `sleep 60`, 200 * time.Millisecond, "fault point p.q not hit within 200ms"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := StartProcessOpts(t, ProcessOpts{MayDie: true}, "sh", filepath.Join(t.TempDir(), "sh.log"), "/bin/sh", "-c", c.script)
			msg := fatalOf(t, func(tb testing.TB) { p.ExpectFaultKill(tb, "p.q", c.d) })
			if !strings.Contains(msg, c.want) {
				t.Errorf("ExpectFaultKill failed with %q, want a failure saying %q", msg, c.want)
			}
		})
	}
}

// cleanupRecorder is a testing.TB that keeps the cleanups registered on
// it, to run them when the test says, and records Errorf instead of
// failing.
type cleanupRecorder struct {
	testing.TB
	cleanups []func()
	errs     []string
}

func (r *cleanupRecorder) Helper()          {}
func (r *cleanupRecorder) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }
func (r *cleanupRecorder) Failed() bool     { return len(r.errs) > 0 }
func (r *cleanupRecorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// runCleanups runs the recorded cleanups, last registered first, as the
// testing package does, and returns the errors they reported.
func (r *cleanupRecorder) runCleanups() []string {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
	return r.errs
}

// raceScript prints what the race detector prints to a race-built child's
// stderr for one race.
const raceScript = `printf '==================\nWARNING: DATA RACE\nWrite at 0x00c000012345 by goroutine 7:\n  main.main.func1()\n==================\n' >&2; `

// TestProcessReportsDataRace: a child whose log holds a report of the race
// detector fails the test that started it, whether it was killed (a crash
// test's child), stopped, or still running when the test ended; a child
// without one does not.
func TestProcessReportsDataRace(t *testing.T) {
	const loop = `trap 'exit 0' TERM; while :; do sleep 0.05; done`
	for _, c := range []struct {
		name, script string
		o            ProcessOpts
		stop         bool // with Stop before the test ends
	}{
		{"killed", raceScript + `kill -KILL $$`, ProcessOpts{MayDie: true}, false},
		{"stopped", raceScript + loop, ProcessOpts{}, true},
		{"running", raceScript + loop, ProcessOpts{}, false},
		{"no race", `echo 'WARNING: not a race'; kill -KILL $$`, ProcessOpts{MayDie: true}, false},
	} {
		race := strings.HasPrefix(c.script, raceScript)
		t.Run(c.name, func(t *testing.T) {
			r := &cleanupRecorder{TB: t}
			p := StartProcessOpts(r, c.o, "sh", filepath.Join(t.TempDir(), "sh.log"), "/bin/sh", "-c", c.script)
			if c.o.MayDie {
				if !p.Wait(10 * time.Second) {
					t.Fatal("the child did not kill itself")
				}
			} else {
				p.WaitLog(t, regexp.MustCompile(`WARNING`), 10*time.Second)
			}
			if c.stop {
				p.Stop(t)
			}
			errs := r.runCleanups()
			switch {
			case !race && len(errs) > 0:
				t.Errorf("the cleanup failed the test: %q", errs)
			case race && (len(errs) != 1 || !strings.Contains(errs[0], "reported 1 data race(s)") || !strings.Contains(errs[0], "main.main.func1()")):
				t.Errorf("the cleanup reported %q, want one error giving the race", errs)
			}
		})
	}
}

// TestProcessReportsRealDataRace: the report of a real race-built child,
// a program with a data race, fails the test that started it. The
// detector's report is what reportRaces looks for.
func TestProcessReportsRealDataRace(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a program with -race")
	}
	dir := t.TempDir()
	src := `package main

import "time"

var n int

func main() {
	go func() { n++ }()
	n++
	time.Sleep(100 * time.Millisecond)
	println("done", n)
	time.Sleep(time.Hour)
}
`
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "racy")
	cmd := exec.Command("go", "build", "-race", "-o", bin, "main.go")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GO111MODULE=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build -race: %v\n%s", err, out)
	}
	r := &cleanupRecorder{TB: t}
	p := StartProcessOpts(r, ProcessOpts{MayDie: true}, "racy", filepath.Join(dir, "racy.log"), bin)
	p.WaitLog(t, regexp.MustCompile(`^done`), 30*time.Second)
	errs := r.runCleanups()
	if len(errs) != 1 || !strings.Contains(errs[0], "data race(s)") || !strings.Contains(errs[0], "main.main") {
		t.Errorf("the cleanup reported %q, want one error giving the race\n%s", errs, p.LogText())
	}
}

// A binary named by METERLINE_TEST_BIN is used as it is (nothing built,
// nothing for Main to remove); one that does not exist is an error that
// names the variable.
func TestBuildMeterlineUsesNamedBinary(t *testing.T) {
	if raceEnabled {
		t.Skip("under the race detector the binary is always built with -race")
	}
	bin := filepath.Join(t.TempDir(), "meterline")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvBin, bin)
	got, dir, err := buildMeterline()
	if err != nil || got != bin || dir != "" {
		t.Fatalf("buildMeterline() = %q, %q, %v; want %q, \"\", nil", got, dir, err, bin)
	}
	t.Setenv(EnvBin, bin+".missing")
	if _, _, err := buildMeterline(); err == nil || !strings.Contains(err.Error(), EnvBin) {
		t.Fatalf("buildMeterline() with a missing binary: err %v, want one naming %s", err, EnvBin)
	}
}
