package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestFailuresScript: scripts/test-failures.sh, which make test runs last
// when a test failed, prints for each failed test (and subtest) what it
// logged from its test files, continuation lines included, without the
// loggers' lines or the passing tests' lines; the last MAX_LINES of them;
// and every panic with what follows it.
func TestFailuresScript(t *testing.T) {
	log := strings.Join([]string{
		"=== RUN   TestGood",
		"    good_test.go:10: fine",
		"--- PASS: TestGood (0.00s)",
		"=== RUN   TestBad",
		"    logger.go:146: 2026-12-03T13:22:00Z INFO noise",
		"    bad_test.go:20: kafka.sh start (1s):",
		"        kafka: starting broker",
		"        kafka: broker exited during startup",
		"    logger.go:146: more noise",
		"        not the test's",
		"    bad_test.go:30: want 1, got 2",
		"--- FAIL: TestBad (7.38s)",
		"=== RUN   TestParent",
		"=== RUN   TestParent/sub",
		"    parent_test.go:5: sub broke",
		"=== PAUSE TestParent/sub",
		"=== RUN   TestOther",
		"    other_test.go:1: other's line",
		"=== CONT  TestParent/sub",
		"    parent_test.go:6: again",
		"    --- FAIL: TestParent/sub (0.01s)",
		"--- FAIL: TestParent (0.02s)",
		"--- PASS: TestOther (0.01s)",
		"panic: boom",
		"goroutine 1 [running]:",
		"FAIL\tgithub.com/meterline/meterline/x\t1.0s",
		"",
	}, "\n")
	path := filepath.Join(t.TempDir(), "test.log")
	if err := os.WriteFile(path, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(maxLines string) string {
		t.Helper()
		c := exec.Command(filepath.Join("..", "..", "scripts", "test-failures.sh"), path)
		c.Env = append(os.Environ(), "MAX_LINES="+maxLines)
		out, err := c.CombinedOutput()
		if err != nil {
			t.Fatalf("test-failures.sh: %v\n%s", err, out)
		}
		return string(out)
	}
	want := strings.Join([]string{
		"--- TestBad said:",
		"    bad_test.go:20: kafka.sh start (1s):",
		"        kafka: starting broker",
		"        kafka: broker exited during startup",
		"    bad_test.go:30: want 1, got 2",
		"--- TestParent/sub said:",
		"    parent_test.go:5: sub broke",
		"    parent_test.go:6: again",
		"--- panics:",
		"panic: boom",
		"goroutine 1 [running]:",
		"FAIL\tgithub.com/meterline/meterline/x\t1.0s",
		"",
	}, "\n")
	if got := run("60"); got != want {
		t.Errorf("test-failures.sh printed\n%s\nwant\n%s", got, want)
	}
	if got := run("2"); !strings.HasPrefix(got, strings.Join([]string{
		"--- TestBad said:",
		"    (the last 2 of its 4 lines)",
		"        kafka: broker exited during startup",
		"    bad_test.go:30: want 1, got 2",
		"--- TestParent/sub said:",
	}, "\n")) {
		t.Errorf("with MAX_LINES=2, test-failures.sh printed\n%s", got)
	}
}
