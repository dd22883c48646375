package demo

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/testenv"
)

// TestMain removes the meterline binary testenv.Meterline built.
func TestMain(m *testing.M) { testenv.Main(m) }

// TestDemoReconciles runs the demo in-process for a short while and checks
// that its report reconciles: every generated event counted exactly once,
// across the in-process kill and restart of dedup.
func TestDemoReconciles(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIP: the demo runs for ~20 s; drop -short")
	}
	var out syncBuffer
	// The curl command the demo prints, run as printed, twice: one event
	// counted, one duplicate dropped, both apart from the generator's.
	// Then the README's curl and OpenMeter SDK examples, with the demo's
	// key and address: two more events.
	python := testenv.ClientPython(t)
	curl := testenv.DocBlocks(t, "README.md", "sh", "curl ")
	sdk := testenv.DocBlocks(t, "README.md", "python", "from openmeter import Client")
	if len(curl) != 1 || len(sdk) != 1 {
		t.Fatalf("README.md: %d curl blocks and %d SDK blocks; want one each", len(curl), len(sdk))
	}
	posted := make(chan error, 1)
	go func() {
		url, token, err := runPrintedCurl(&out, 2)
		if err == nil {
			err = runReadmeClients(url, token, python, curl[0], sdk[0])
		}
		posted <- err
	}()
	ok, err := Run(context.Background(), Config{Dir: t.TempDir(), Duration: 12 * time.Second, Rate: 300, Seed: 42, Out: &out,
		IngestAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	if err := <-posted; err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if !ok || !strings.Contains(out.String(), "RECONCILED") {
		t.Fatalf("demo did not reconcile:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "dedup killed in-process at") {
		t.Fatalf("the demo did not kill and restart dedup:\n%s", out.String())
	}
	if want := "posted over HTTP (meter http_tokens, not generated): 3 events counted, 1 duplicates dropped, total 71"; !strings.Contains(out.String(), want) {
		t.Fatalf("the report does not say %q:\n%s", want, out.String())
	}
	// Entitlements: the free-tier customer hit its cap and the prepaid
	// one ran out of credits during the run, and both kinds of refusal and
	// the credits drawn reconcile.
	for _, re := range []string{`ok\s+refused by a cap \(over_limit, aggregator\)\s+generated\s+[1-9]\d*\s+counted`,
		`ok\s+refused for want of credit \(no_credit\)\s+generated\s+[1-9]\d*\s+counted`,
		`ok\s+micro-credits drawn \(usage.balances\)\s+generated\s+[1-9]\d*\s+counted`,
		`hooli \(free\) used (\d+) of its cap of (\d+) api_calls`} {
		if !regexp.MustCompile(re).MatchString(out.String()) {
			t.Fatalf("the report does not match %s:\n%s", re, out.String())
		}
	}
}

// TestDemoStoppedBeforeTheCrash: a demo stopped (Ctrl-C) before dedup's
// crash point had no crash; its verdict must not claim that the events
// were counted exactly once through one, as the report's recovery line
// says there was none.
func TestDemoStoppedBeforeTheCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIP: the demo runs for ~10 s; drop -short")
	}
	var out syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(2*time.Second, cancel) // the crash comes about 20 s in
	ok, err := Run(ctx, Config{Dir: t.TempDir(), Rate: 200, Seed: 11, Out: &out})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if !ok || !strings.Contains(out.String(), "RECONCILED") || !strings.Contains(out.String(), "no crash in this run") {
		t.Fatalf("demo did not reconcile without a crash:\n%s", out.String())
	}
	if strings.Contains(out.String(), "through the crash") {
		t.Errorf("the verdict claims a crash the run did not have:\n%s", out.String())
	}
}

// TestDemoCatchesUpWhileBusy: after the generator stops, dedup's ticks
// and the aggregator's keep both stages writing and reading watermark
// records, so their lag and the aggregator's gates are never all zero at
// once; the demo must still see that every generated event was handled.
// Dedup ticking every 20 ms makes that traffic dense.
func TestDemoCatchesUpWhileBusy(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIP: the demo runs for ~15 s; drop -short")
	}
	var out syncBuffer
	ok, err := Run(context.Background(), Config{Dir: t.TempDir(), Duration: 3 * time.Second, Rate: 200, Seed: 7, Out: &out,
		dedupTick: 20 * time.Millisecond})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if !ok || !strings.Contains(out.String(), "RECONCILED") {
		t.Fatalf("demo did not reconcile:\n%s", out.String())
	}
}

// syncBuffer is a bytes.Buffer the demo writes while a test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var curlLine = regexp.MustCompile(`(?m)^  (curl -sS (http://\S+)/api/v1/events -H 'Authorization: Bearer (\S+)' .*)$`)

// runPrintedCurl waits for the demo's curl command and runs it n times
// with sh, as a reader would paste it; each must answer 204 (OpenMeter's
// success: every event acknowledged by Kafka). It returns the ingest's
// address and the demo key the command carries.
func runPrintedCurl(out *syncBuffer, n int) (url, token string, err error) {
	deadline := time.Now().Add(time.Minute)
	var m []string
	for m = curlLine.FindStringSubmatch(out.String()); m == nil; m = curlLine.FindStringSubmatch(out.String()) {
		if time.Now().After(deadline) {
			return "", "", fmt.Errorf("the demo printed no curl command")
		}
		time.Sleep(100 * time.Millisecond)
	}
	for i := 0; i < n; i++ {
		b, err := exec.Command("sh", "-c", m[1]+` -o /dev/null -w '%{http_code}'`).CombinedOutput()
		if err != nil || string(b) != "204" {
			return "", "", fmt.Errorf("%s: %v, answered %q; want 204", m[1], err, b)
		}
	}
	return m[2], m[3], nil
}

// runReadmeClients runs the README's curl block with bash and its
// OpenMeter SDK block with python, as a reader would against the demo:
// TOKEN set to the demo's key, and the demo's address for the README's.
func runReadmeClients(url, token, python, curl, sdk string) error {
	const readmeURL = "http://127.0.0.1:8888"
	env := append(os.Environ(), "TOKEN="+token)
	for _, c := range []*exec.Cmd{
		exec.Command("bash", "-euo", "pipefail", "-c", strings.ReplaceAll(curl, readmeURL, url)),
		exec.Command(python, "-c", strings.ReplaceAll(sdk, readmeURL, url)),
	} {
		c.Env = env
		if b, err := c.CombinedOutput(); err != nil {
			return fmt.Errorf("the README's example failed against the demo: %v\n%s\n%s", err, strings.Join(c.Args, " "), b)
		}
	}
	return nil
}

// TestDemoInTerminal drives `meterline demo` in a real terminal with tmux:
// the live view must appear and update, and the run must end with the
// reconciled report and exit status 0.
func TestDemoInTerminal(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIP: the demo runs for ~40 s; drop -short")
	}
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Skip("SKIP: tmux is not installed (apt-get install tmux)")
	}
	dir := t.TempDir()
	bin := testenv.Meterline(t)
	session := fmt.Sprintf("meterline-demo-%d", os.Getpid())
	tmux := func(args ...string) string {
		out, err := exec.Command("tmux", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("tmux %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	tmux("new-session", "-d", "-s", session, "-x", "120", "-y", "45")
	t.Cleanup(func() { _ = exec.Command("tmux", "kill-session", "-t", session).Run() })
	cmd := fmt.Sprintf("%s demo --dir %s --duration 20s --rate 250 --seed 3; echo DEMO-EXIT=$?", bin, filepath.Join(dir, "demo"))
	tmux("send-keys", "-t", session, cmd, "Enter")
	screen := func() string { return tmux("capture-pane", "-p", "-t", session) }
	waitFor := func(re *regexp.Regexp, d time.Duration) string {
		deadline := time.Now().Add(d)
		for {
			s := screen()
			if re.MatchString(s) {
				return s
			}
			if time.Now().After(deadline) {
				t.Fatalf("screen never showed %s:\n%s", re, s)
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	// The live view, redrawn in place.
	live := waitFor(regexp.MustCompile(`(?s)events in\s+\d+.*duplicates dropped\s+\d+.*rejected.*lag\s+dedup \d+ records.*this hour, per customer`), 30*time.Second)
	first := regexp.MustCompile(`events in\s+(\d+)`).FindStringSubmatch(live)[1]
	later := waitFor(regexp.MustCompile(`events in\s+\d+`), 5*time.Second)
	time.Sleep(2 * time.Second)
	later = screen()
	if m := regexp.MustCompile(`events in\s+(\d+)`).FindStringSubmatch(later); m == nil || m[1] == first {
		t.Fatalf("the live view did not update (events in stayed %s):\n%s", first, later)
	}
	// The view shows the wall clock's hour: just after an hour begins it
	// has no aggregate of it until the first ones of the new hour are out,
	// so the row may take a moment.
	acme := regexp.MustCompile(`acme\s+\d+\s+\d+\s+\d+`)
	for deadline := time.Now().Add(5 * time.Second); !acme.MatchString(later); later = screen() {
		if time.Now().After(deadline) {
			t.Errorf("the live view shows no current-period aggregates per customer:\n%s", later)
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	// The report.
	end := waitFor(regexp.MustCompile(`DEMO-EXIT=\d+`), 2*time.Minute)
	if !strings.Contains(end, "DEMO-EXIT=0") || !strings.Contains(end, "RECONCILED") {
		t.Fatalf("the demo did not end reconciled with status 0:\n%s", end)
	}
}
