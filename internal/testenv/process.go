package testenv

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/fault"
)

// The meterline binary, built at most once per test binary.
var meterline struct {
	once sync.Once
	dir  string // removed by Main
	path string
	err  error
}

// EnvBin names a meterline binary built from this checkout that Meterline
// returns instead of building one (not under the race detector).
const EnvBin = "METERLINE_TEST_BIN"

// mainRuns is set by Main: Meterline needs it to remove what it built.
var mainRuns bool

// Main runs the package's tests and then removes the meterline binary that
// Meterline built, if any. A package whose tests call Meterline has
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
func Main(m *testing.M) {
	mainRuns = true
	code := m.Run()
	if meterline.dir != "" {
		_ = os.RemoveAll(meterline.dir)
	}
	os.Exit(code)
}

// Meterline returns the path of the meterline binary (cmd/meterline),
// built by the first test that asks and shared by the other tests of the
// package; it fails the test if the build fails. Call it after the test's
// skip checks, so that skipped tests build nothing. The package's TestMain
// must be testenv.Main, which removes the binary at the end. Under go test
// -race the binary is built with -race too, and a data race a child
// reports fails the test that started it (docs/testing.md, The race
// detector). Without the race detector, a binary named by
// METERLINE_TEST_BIN (make test builds it once for every package) is used
// instead of building one.
func Meterline(t testing.TB) string {
	t.Helper()
	if !mainRuns {
		t.Fatal("testenv.Meterline: the package needs func TestMain(m *testing.M) { testenv.Main(m) } to remove the binary")
	}
	meterline.once.Do(func() {
		meterline.path, meterline.dir, meterline.err = buildMeterline()
		if meterline.err == nil && meterline.dir != "" {
			t.Logf("built %s (race detector: %v)", meterline.path, raceEnabled)
		}
	})
	if meterline.err != nil {
		t.Fatalf("go build ./cmd/meterline (race detector: %v): %v", raceEnabled, meterline.err)
	}
	return meterline.path
}

// buildMeterline returns the binary named by EnvBin, if set and the race
// detector is off, or else builds one into a new directory dir.
func buildMeterline() (bin, dir string, err error) {
	if bin := os.Getenv(EnvBin); bin != "" && !raceEnabled {
		if _, err := os.Stat(bin); err != nil {
			return "", "", fmt.Errorf("%s: %w", EnvBin, err)
		}
		return bin, "", nil
	}
	dir, err = os.MkdirTemp("", "meterline-test-bin-")
	if err != nil {
		return "", "", err
	}
	bin = filepath.Join(dir, "meterline")
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	out, err := exec.Command("go", append(args, "github.com/meterline/meterline/cmd/meterline")...).CombinedOutput()
	if err != nil {
		return "", dir, fmt.Errorf("%w\n%s", err, out)
	}
	return bin, dir, nil
}

// FreeAddr returns a loopback address with a port that was free a moment
// ago.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// Process is a long-running child process (meterline, prometheus) with its
// output in a log file.
type Process struct {
	name    string
	log     string
	opts    ProcessOpts
	cmd     *exec.Cmd
	started time.Time
	done    chan struct{}
	err     error // of Wait, once done is closed
	stopped bool  // by Stop
}

// ProcessOpts are the options of StartProcessOpts; the zero value is
// StartProcess's.
type ProcessOpts struct {
	// Fault arms a fault point in the child: METERLINE_FAULT (fault.EnvVar).
	Fault string
	// MayDie marks a child of a crash test: it may die at any time (at a
	// fault point, or killed by the test), which is no error; when the test
	// ends it is SIGKILLed if it still runs, not stopped.
	MayDie bool
	// TailSkip: log lines containing it (a frequent, uninformative
	// message) are left out of Tail.
	TailSkip string
	// ExitTimeout bounds Stop's and Kill's waits for the exit; default 60 s.
	ExitTimeout time.Duration
}

// StartProcess runs bin with args, its stdout and stderr in logFile, in the
// test's environment without the METERLINE_* variables (the CLI reads
// METERLINE_<FLAG>). name names it in messages. When the test ends, a
// process still running is stopped with SIGTERM (SIGKILL after 20 s, which
// fails the test); one that exited before without Stop fails the test. The
// tail of its log is printed if the test failed.
func StartProcess(t testing.TB, name, logFile, bin string, args ...string) *Process {
	t.Helper()
	return StartProcessOpts(t, ProcessOpts{}, name, logFile, bin, args...)
}

// StartProcessOpts is StartProcess with options: a fault point armed, and
// for crash tests, a child that may die (see ProcessOpts).
func StartProcessOpts(t testing.TB, o ProcessOpts, name, logFile, bin string, args ...string) *Process {
	t.Helper()
	if o.ExitTimeout <= 0 {
		o.ExitTimeout = 60 * time.Second
	}
	f, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	p := &Process{name: name, log: logFile, opts: o, cmd: exec.Command(bin, args...), done: make(chan struct{})}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "METERLINE_") {
			p.cmd.Env = append(p.cmd.Env, kv)
		}
	}
	if o.Fault != "" {
		p.cmd.Env = append(p.cmd.Env, fault.EnvVar+"="+o.Fault)
	}
	p.cmd.Stdout, p.cmd.Stderr = f, f
	if err := p.cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	p.started = time.Now()
	go func() {
		p.err = p.cmd.Wait()
		f.Close()
		close(p.done)
	}()
	t.Logf("started %s (pid %d, fault %q)", name, p.cmd.Process.Pid, o.Fault)
	t.Cleanup(func() {
		p.end(t)
		p.reportRaces(t)
	})
	return p
}

// end is the cleanup of StartProcessOpts: a child that may die is killed,
// any other stopped with SIGTERM; one that exited without Stop fails the
// test.
func (p *Process) end(t testing.TB) {
	t.Helper()
	switch {
	case p.opts.MayDie:
		if !p.Exited() {
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("---- tail of %s (%s) ----\n%s", p.name, p.ExitString(), p.Tail(40))
		}
		return
	case p.Exited():
		if !p.stopped {
			t.Errorf("%s exited early: %v\n%s", p.name, p.err, p.Tail(40))
			return
		}
	default:
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		if !p.Wait(20 * time.Second) {
			_ = p.cmd.Process.Kill()
			<-p.done
			t.Errorf("%s did not stop within 20s of SIGTERM\n%s", p.name, p.Tail(40))
		} else if p.err != nil {
			t.Logf("%s stopped: %v", p.name, p.err)
		}
	}
	if t.Failed() {
		t.Logf("%s log tail:\n%s", p.name, p.Tail(40))
	}
}

// raceReport is the line with which the race detector starts each report
// on a race-built child's stderr.
const raceReport = "WARNING: DATA RACE"

// reportRaces fails the test if the child's log holds a report of the race
// detector, giving the first. A child killed (a crash test's SIGKILL, a
// fault point) never reaches the exit status the detector gives a run with
// races (66), so its log is what tells.
func (p *Process) reportRaces(t testing.TB) {
	t.Helper()
	text := p.LogText()
	i := strings.Index(text, raceReport)
	if i < 0 {
		return
	}
	n := strings.Count(text, raceReport)
	report := text[i:]
	if end := strings.Index(report, "\n==================\n"); end >= 0 {
		report = report[:end]
	}
	t.Errorf("%s: the race detector reported %d data race(s) (log %s); the first:\n%s", p.name, n, p.log, report)
}

// Name is the process's name in messages.
func (p *Process) Name() string { return p.name }

// Started is when the process was started.
func (p *Process) Started() time.Time { return p.started }

// Exited reports whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// ExitString is how the process exited ("exit status 1", "signal:
// killed"), or "running".
func (p *Process) ExitString() string {
	if !p.Exited() {
		return "running"
	}
	return p.cmd.ProcessState.String()
}

// Wait waits up to d for the process to exit and reports whether it did.
func (p *Process) Wait(d time.Duration) bool {
	if p.Exited() {
		return true
	}
	if d <= 0 {
		return false
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-p.done:
		return true
	case <-tm.C:
		return false
	}
}

// Signal sends sig to the process.
func (p *Process) Signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v to %s: %v", sig, p.name, err)
	}
	t.Logf("sent %v to %s", sig, p.name)
}

// Kill SIGKILLs the process and waits for it to die.
func (p *Process) Kill(t testing.TB) {
	t.Helper()
	p.Signal(t, syscall.SIGKILL)
	if !p.Wait(p.opts.ExitTimeout) {
		t.Fatalf("%s did not die within %s of SIGKILL", p.name, p.opts.ExitTimeout)
	}
}

// Stop ends the process with SIGTERM, as an operator would, and fails the
// test unless it exits with status 0 within the exit timeout (60 s unless
// ProcessOpts say otherwise).
func (p *Process) Stop(t testing.TB) {
	t.Helper()
	p.stopped = true
	p.Signal(t, syscall.SIGTERM)
	start := time.Now()
	if !p.Wait(p.opts.ExitTimeout) {
		t.Fatalf("%s did not stop within %s of SIGTERM", p.name, p.opts.ExitTimeout)
	}
	if !p.cmd.ProcessState.Success() {
		t.Fatalf("%s exited with %v after SIGTERM, want status 0\n%s", p.name, p.cmd.ProcessState, p.Tail(30))
	}
	t.Logf("%s stopped %s after SIGTERM", p.name, time.Since(start).Round(time.Millisecond))
}

// ExpectFaultKill waits up to d for the process to kill itself at the
// armed fault point and checks that it did: death by SIGKILL, and the log
// saying "fault point <point> hit".
func (p *Process) ExpectFaultKill(t testing.TB, point string, d time.Duration) {
	t.Helper()
	if !p.Wait(d) {
		t.Fatalf("%s: fault point %s not hit within %s\n%s", p.name, point, d, p.Tail(30))
	}
	ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("%s exited with %s, want death by SIGKILL at %s\n%s", p.name, p.cmd.ProcessState, point, p.Tail(30))
	}
	if want := "fault point " + point + " hit"; !strings.Contains(p.LogText(), want) {
		t.Fatalf("%s died by SIGKILL but its log does not say %q\n%s", p.name, want, p.Tail(30))
	}
	t.Logf("%s killed itself at %s after %s", p.name, point, time.Since(p.started).Round(time.Millisecond))
}

// WaitLog waits until a line of the process's log matches re and returns
// the submatches, failing the test if the process exits first or after d.
func (p *Process) WaitLog(t testing.TB, re *regexp.Regexp, d time.Duration) []string {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		if f, err := os.Open(p.log); err == nil {
			sc := bufio.NewScanner(f)
			sc.Buffer(make([]byte, 1<<20), 1<<24)
			for sc.Scan() {
				if m := re.FindStringSubmatch(sc.Text()); m != nil {
					f.Close()
					return m
				}
			}
			f.Close()
		}
		select {
		case <-p.done:
			t.Fatalf("%s exited (%v) before logging a line matching %s\n%s", p.name, p.cmd.ProcessState, re, p.Tail(40))
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no line matching %s in the log of %s after %s", re, p.name, d)
		}
	}
}

// LogText returns the process's whole log.
func (p *Process) LogText() string {
	b, _ := os.ReadFile(p.log)
	return string(b)
}

// Tail returns the last n lines of the process's log, leaving out the
// lines that contain ProcessOpts.TailSkip.
func (p *Process) Tail(n int) string {
	text := p.LogText()
	if skip := p.opts.TailSkip; skip != "" {
		var kept []string
		for _, l := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
			if !strings.Contains(l, skip) {
				kept = append(kept, l)
			}
		}
		text = strings.Join(kept, "\n")
	}
	return Tail(text, n)
}

// LogLine is one JSON line of a meterline log.
type LogLine struct {
	TS     time.Time
	Msg    string
	Fields map[string]any // every field, ts and msg included
}

// Int returns the numeric field k (0 if absent).
func (l LogLine) Int(k string) int64 {
	v, _ := l.Fields[k].(float64)
	return int64(v)
}

// LogLines parses the JSON lines of the process's log (other lines are
// skipped).
func (p *Process) LogLines() []LogLine {
	f, err := os.Open(p.log)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []LogLine
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		b := sc.Bytes()
		if !bytes.HasPrefix(b, []byte("{")) {
			continue
		}
		var m map[string]any
		if json.Unmarshal(b, &m) != nil {
			continue
		}
		l := LogLine{Fields: m}
		l.Msg, _ = m["msg"].(string)
		if ts, ok := m["ts"].(string); ok {
			l.TS, _ = time.Parse("2006-01-02T15:04:05.000Z0700", ts)
		}
		out = append(out, l)
	}
	return out
}

// Lines returns the JSON log lines with message msg.
func (p *Process) Lines(msg string) []LogLine {
	var out []LogLine
	for _, l := range p.LogLines() {
		if l.Msg == msg {
			out = append(out, l)
		}
	}
	return out
}

// Replayed sums changelog_records over the stage's "partition restored"
// log lines, and counts them.
func (p *Process) Replayed() (records int64, restores int) {
	for _, l := range p.Lines("partition restored") {
		records += l.Int("changelog_records")
		restores++
	}
	return records, restores
}

// Metrics are the series of a /metrics scrape: `name{labels}` (or just
// name) → value.
type Metrics map[string]float64

// Sum returns the sum of the metric over all its series (labels).
func (m Metrics) Sum(name string) float64 {
	var v float64
	for series, x := range m {
		if series == name || strings.HasPrefix(series, name+"{") {
			v += x
		}
	}
	return v
}

// Metrics scrapes the /metrics of a meterline process, at the address of
// its last "serving metrics and health" log line.
func (p *Process) Metrics() (Metrics, error) {
	var addr string
	for _, l := range p.Lines("serving metrics and health") {
		addr, _ = l.Fields["addr"].(string)
	}
	if addr == "" {
		return nil, errors.New("no metrics address in the log yet")
	}
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	out := Metrics{}
	for _, line := range strings.Split(string(body), "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			continue
		}
		out[line[:sp]] = v
	}
	return out, nil
}

// LogDir returns a new directory for the logs of the test's children. It
// is removed when the test ends, unless the test failed: then it is kept
// and its path logged.
func LogDir(t testing.TB, pattern string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("full child logs kept in %s", dir)
			return
		}
		_ = os.RemoveAll(dir)
	})
	return dir
}

// Tail returns the last n lines of s.
func Tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// SyncBuffer is a bytes.Buffer safe for concurrent writers, for the output
// of a command run in-process.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
