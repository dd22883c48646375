package testenv

import (
	"bytes"
	"context"
	"fmt"
	"html"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// EnvChromium names the headless Chromium binary for browser tests.
// scripts/test.sh sets it from deploy/local/chromium.sh.
const EnvChromium = "METERLINE_TEST_CHROMIUM"

// Chromium returns the path of the Chromium binary named by
// METERLINE_TEST_CHROMIUM, or skips the test, saying so plainly, when it is
// not set. With -short it always skips.
func Chromium(t testing.TB) string {
	t.Helper()
	v := os.Getenv(EnvChromium)
	if v == "" || testing.Short() {
		t.Skipf("SKIP: real browser test; set %s=$(deploy/local/chromium.sh) (make test does) and drop -short", EnvChromium)
	}
	if _, err := os.Stat(v); err != nil {
		t.Fatalf("%s=%s: %v", EnvChromium, v, err)
	}
	return v
}

// chromiumArgs are the flags every headless run takes: no sandbox (tests
// run as root in containers), no GPU, a throwaway profile.
func chromiumArgs(profile string) []string {
	return []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--no-first-run", "--hide-scrollbars", "--user-data-dir=" + profile}
}

func runChromium(t testing.TB, bin string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append(chromiumArgs(t.TempDir()), args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %s: %v\n%s", strings.Join(args, " "), err, Tail(stderr.String(), 20))
	}
	return stdout.Bytes()
}

// DumpDOM loads url in headless Chromium and returns the DOM after the
// page rendered (chromium --dump-dom).
func DumpDOM(t testing.TB, chromium, url string) string {
	t.Helper()
	return string(runChromium(t, chromium, "--dump-dom", url))
}

// Screenshot loads url in headless Chromium and writes a PNG of the
// viewport, width × height CSS pixels, to path.
func Screenshot(t testing.TB, chromium, url, path string, width, height int) {
	t.Helper()
	runChromium(t, chromium, "--screenshot="+path, fmt.Sprintf("--window-size=%d,%d", width, height), url)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("chromium wrote no screenshot: %v", err)
	}
	if !bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")) {
		t.Fatalf("screenshot %s is not a PNG", path)
	}
}

var dataK = regexp.MustCompile(`data-k="([^"]+)"[^>]*>([^<]*)<`)

// PageValues returns the values a Meterline status page shows, keyed by
// their data-k attribute ("stage/dedup/owned", "part/dedup/3/state",
// "table/aggregates/acme/tokens"), text unescaped and trimmed.
func PageValues(dom string) map[string]string {
	out := map[string]string{}
	for _, m := range dataK.FindAllStringSubmatch(dom, -1) {
		out[html.UnescapeString(m[1])] = strings.TrimSpace(html.UnescapeString(m[2]))
	}
	return out
}

// ExpectPageValue fails the test (and goes on) unless the page values v,
// from PageValues, show key with the value want: the real state.
func ExpectPageValue(t testing.TB, v map[string]string, key, want string) {
	t.Helper()
	got, ok := v[key]
	switch {
	case !ok:
		t.Errorf("the page does not show %s", key)
	case got != want:
		t.Errorf("the page shows %s = %q; the real state is %q", key, got, want)
	}
}
