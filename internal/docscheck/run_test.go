package docscheck

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/topics"
)

// blockTimeout bounds one block; the longest (a shortened benchmark) takes
// well under a minute.
const blockTimeout = 5 * time.Minute

// stopTimeout is how long commands a block left in the background get to
// exit after SIGTERM before SIGKILL.
const stopTimeout = 20 * time.Second

// TestRealDocsCommands runs every block marked run or run-in-repo, in
// document order, against the real Kafka and ClickHouse named by
// METERLINE_TEST_KAFKA and METERLINE_TEST_CLICKHOUSE. Each block gets its
// own topic prefix, ClickHouse database, state directories and free HTTP
// ports through METERLINE_* variables (a flag written in the block wins
// over them), and `meterline` on the PATH. A block passes when bash exits 0
// and every command it left in the background is still running at its end.
func TestRealDocsCommands(t *testing.T) {
	brokers := testenv.RealKafka(t)
	chAddr := testenv.RealClickHouse(t)
	root, _, blocks := docs(t)
	bin := testenv.Meterline(t)
	ran := 0
	for _, b := range blocks {
		if b.ann == nil || (b.ann.kind != kindRun && b.ann.kind != kindRunInRepo) {
			continue
		}
		ran++
		t.Run(strings.ReplaceAll(b.where(), "/", "_"), func(t *testing.T) {
			runBlock(t, root, bin, brokers, chAddr, b)
		})
	}
	if ran == 0 {
		t.Fatal("no block of README.md or docs/ is marked run")
	}
}

func runBlock(t *testing.T, root, bin string, brokers []string, chAddr string, b block) {
	tmp := t.TempDir()
	prefix := testenv.Name(t, "docs") + "."
	db := strings.NewReplacer("-", "_", ".", "").Replace(testenv.Name(t, "docs"))
	t.Cleanup(func() { dropTopics(t, brokers, prefix) })
	t.Cleanup(func() { dropDatabase(t, chAddr, db) })

	text := b.text
	for _, r := range b.ann.replace {
		text = strings.ReplaceAll(text, r[0], r[1])
	}
	script := text
	if n := backgroundCommands(text); n > 0 {
		script += fmt.Sprintf("\n__running=$(jobs -rp | wc -l)\n"+
			"if [ \"$__running\" -lt %d ]; then echo \"docs-check: $((%d - __running)) of %d background command(s) exited before the block ended\" >&2; exit 97; fi\n", n, n, n)
	}

	dir := tmp
	var before map[string]bool
	if b.ann.kind == kindRunInRepo {
		dir = root
		before = gitStatus(t, root)
	}
	env := blockEnv(t, bin, brokers, chAddr, prefix, db, tmp)

	logPath := filepath.Join(tmp, "output.log")
	out, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	ctx, cancel := context.WithTimeout(context.Background(), blockTimeout)
	defer cancel()
	cmd := exec.Command("bash", "-euo", "pipefail", "-c", script)
	cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = dir, env, out, out
	cmd.Stdin = nil
	// Its own process group, so that what the block leaves in the
	// background is stopped with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var runErr error
	var stopping time.Duration
	select {
	case runErr = <-done:
		t0 := time.Now()
		stopGroup(t, cmd.Process.Pid)
		stopping = time.Since(t0)
	case <-ctx.Done():
		runErr = fmt.Errorf("still running after %s", blockTimeout)
		stopGroup(t, cmd.Process.Pid)
		<-done
	}
	t.Logf("%s: ran for %.1fs (%.1fs of it stopping what it left running), bash: %v", b.where(),
		time.Since(start).Seconds(), stopping.Seconds(), exitString(runErr))
	if runErr != nil {
		log, _ := os.ReadFile(logPath)
		t.Errorf("%s: %v\n--- the block, as run (in %s):\n%s--- its output (last 60 lines):\n%s", b.where(), runErr, dir, text, testenv.Tail(string(log), 60))
	}
	if before != nil {
		for f := range gitStatus(t, root) {
			if !before[f] && !strings.HasPrefix(f, "bin/") {
				t.Errorf("%s: the block left %s in the repository", b.where(), f)
			}
		}
	}
}

func exitString(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

// blockEnv is the environment of a block: this process's, without its
// METERLINE_* settings, plus the services, the block's own names and
// directories, and meterline on the PATH.
func blockEnv(t *testing.T, bin string, brokers []string, chAddr, prefix, db, tmp string) []string {
	t.Helper()
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "METERLINE_") || strings.HasPrefix(kv, "KAFKA_PORT=") ||
			strings.HasPrefix(kv, "CLICKHOUSE_PORT=") || strings.HasPrefix(kv, "PATH=") {
			continue
		}
		env = append(env, kv)
	}
	port := func(addr string) string {
		_, p, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatalf("%s: %v", addr, err)
		}
		return p
	}
	return append(env,
		"PATH="+filepath.Dir(bin)+string(os.PathListSeparator)+os.Getenv("PATH"),
		"KAFKA_PORT="+port(brokers[0]),
		"CLICKHOUSE_PORT="+port(chAddr),
		"METERLINE_BROKERS="+strings.Join(brokers, ","),
		"METERLINE_CLICKHOUSE="+chAddr,
		"METERLINE_TOPIC_PREFIX="+prefix,
		"METERLINE_DATABASE="+db,
		"METERLINE_SINK_DATABASE="+db,
		"METERLINE_STATE_DIR="+filepath.Join(tmp, "state"),
		"METERLINE_DIR="+filepath.Join(tmp, "demo"),
		"METERLINE_METRICS_ADDR=127.0.0.1:0",
		"METERLINE_HTTP=127.0.0.1:0",
		"METERLINE_DURATION=8s",
	)
}

// stopGroup stops every process of the group pgid: SIGTERM, then SIGKILL
// after stopTimeout.
func stopGroup(t *testing.T, pgid int) {
	t.Helper()
	alive := func() bool { return syscall.Kill(-pgid, 0) == nil }
	if !alive() {
		return
	}
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	deadline := time.Now().Add(stopTimeout)
	for alive() && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if alive() {
		t.Logf("process group %d still running %s after SIGTERM; SIGKILL", pgid, stopTimeout)
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	}
}

// gitStatus lists the repository's untracked, changed and ignored files.
func gitStatus(t *testing.T, root string) map[string]bool {
	t.Helper()
	cmd := exec.Command("git", "status", "--porcelain", "--ignored", "--untracked-files=all")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git status in %s: %v", root, err)
	}
	files := map[string]bool{}
	for _, l := range strings.Split(string(out), "\n") {
		if len(l) > 3 {
			files[l[3:]] = true
		}
	}
	return files
}

// dropTopics deletes the topics a block made under its prefix.
func dropTopics(t *testing.T, brokers []string, prefix string) {
	adm := testenv.Admin(t, brokers)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	listed, err := adm.ListTopics(ctx)
	if err != nil {
		t.Errorf("list topics: %v", err)
		return
	}
	var mine []string
	for _, name := range listed.Names() {
		if strings.HasPrefix(name, prefix) {
			mine = append(mine, name)
		}
	}
	if len(mine) == 0 {
		return
	}
	if err := topics.Delete(ctx, adm, mine...); err != nil {
		t.Error(err)
	}
}

// dropDatabase drops the database a block's sink, migrate or demo made.
func dropDatabase(t *testing.T, addr, db string) {
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{addr}, Auth: clickhouse.Auth{Database: "default", Username: "default"}})
	if err != nil {
		t.Errorf("clickhouse: %v", err)
		return
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+db); err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("clickhouse: drop database %s: %v", db, err)
	}
}
