package testenv

import (
	"fmt"
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
