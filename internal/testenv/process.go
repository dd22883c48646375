package testenv

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The meterline binary, built at most once per test binary.
var meterline struct {
	once sync.Once
	dir  string // removed by Main
	path string
	err  error
}

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
// must be testenv.Main, which removes the binary at the end.
func Meterline(t testing.TB) string {
	t.Helper()
	if !mainRuns {
		t.Fatal("testenv.Meterline: the package needs func TestMain(m *testing.M) { testenv.Main(m) } to remove the binary")
	}
	meterline.once.Do(func() {
		dir, err := os.MkdirTemp("", "meterline-test-bin-")
		if err != nil {
			meterline.err = err
			return
		}
		meterline.dir = dir
		bin := filepath.Join(dir, "meterline")
		out, err := exec.Command("go", "build", "-o", bin, "github.com/meterline/meterline/cmd/meterline").CombinedOutput()
		if err != nil {
			meterline.err = fmt.Errorf("%w\n%s", err, out)
			return
		}
		meterline.path = bin
	})
	if meterline.err != nil {
		t.Fatalf("go build ./cmd/meterline: %v", meterline.err)
	}
	return meterline.path
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
	cmd     *exec.Cmd
	done    chan struct{}
	err     error // of Wait, once done is closed
	stopped bool  // by Stop
}

// StartProcess runs bin with args, its stdout and stderr in logFile, in the
// test's environment without the METERLINE_* variables (the CLI reads
// METERLINE_<FLAG>). name names it in messages. When the test ends, a
// process still running is stopped with SIGTERM (SIGKILL after 20 s, which
// fails the test); one that exited before without Stop fails the test. The
// tail of its log is printed if the test failed.
func StartProcess(t testing.TB, name, logFile, bin string, args ...string) *Process {
	t.Helper()
	f, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	p := &Process{name: name, log: logFile, cmd: exec.Command(bin, args...), done: make(chan struct{})}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "METERLINE_") {
			p.cmd.Env = append(p.cmd.Env, kv)
		}
	}
	p.cmd.Stdout, p.cmd.Stderr = f, f
	if err := p.cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		f.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
			if !p.stopped {
				t.Errorf("%s exited early: %v\n%s", name, p.err, p.LogTail())
				return
			}
		default:
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.done:
				if p.err != nil {
					t.Logf("%s stopped: %v", name, p.err)
				}
			case <-time.After(20 * time.Second):
				_ = p.cmd.Process.Kill()
				<-p.done
				t.Errorf("%s did not stop within 20s of SIGTERM\n%s", name, p.LogTail())
			}
		}
		if t.Failed() {
			t.Logf("%s log tail:\n%s", name, p.LogTail())
		}
	})
	return p
}

// Stop ends the process with SIGTERM, as an operator would, and fails the
// test unless it exits with status 0 within 60 s.
func (p *Process) Stop(t testing.TB) {
	t.Helper()
	p.stopped = true
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("%s did not stop within 60s of SIGTERM", p.name)
	}
	if !p.cmd.ProcessState.Success() {
		t.Fatalf("%s exited with %v after SIGTERM\n%s", p.name, p.cmd.ProcessState, p.LogTail())
	}
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
			t.Fatalf("%s exited (%v) before logging a line matching %s\n%s", p.name, p.cmd.ProcessState, re, p.LogTail())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no line matching %s in the log of %s after %s", re, p.name, d)
		}
	}
}

// LogTail returns the last 4000 bytes of the process's log.
func (p *Process) LogTail() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
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
