package deploy

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"github.com/meterline/meterline/internal/cli"
	"github.com/meterline/meterline/internal/testenv"
)

// clickHouseScript runs deploy/local/clickhouse.sh for a server of the
// test's own, in a data dir of the test's, with env and then a command's
// extra variables added to the environment, and stops the server when the
// test ends.
func clickHouseScript(t *testing.T, env ...string) func(cmd string, extra ...string) (string, error) {
	t.Helper()
	env = append(append(os.Environ(), "CLICKHOUSE_DATA_DIR="+t.TempDir(), "CLICKHOUSE_START_TIMEOUT=30"), env...)
	script := func(cmd string, extra ...string) (string, error) {
		c := exec.Command("local/clickhouse.sh", cmd)
		c.Env = append(append([]string(nil), env...), extra...)
		out, err := c.CombinedOutput()
		return string(out), err
	}
	t.Cleanup(func() {
		if out, err := script("stop"); err != nil {
			t.Errorf("stop: %v\n%s", err, out)
		}
	})
	return script
}

// TestRealClickHouseScriptKeepsHTTPPort: a server that
// deploy/local/clickhouse.sh started with CLICKHOUSE_HTTP_PORT is found
// healthy by start and status given only its CLICKHOUSE_PORT (as the docs'
// blocks run `deploy/local/clickhouse.sh start` with the test server's
// native port), and stopped by stop: the script takes the HTTP port from
// the running server's config rather than probe 8123.
func TestRealClickHouseScriptKeepsHTTPPort(t *testing.T) {
	// Ports 120 and 121 above the test server's native port: the block of
	// ports its runner owns.
	addr := testenv.RealClickHouse(t)
	native, httpPort := testenv.PortAbove(t, addr, 120), testenv.PortAbove(t, addr, 121)
	script := clickHouseScript(t, "CLICKHOUSE_PORT="+native, "CLICKHOUSE_HTTP_PORT="+httpPort)
	if out, err := script("start"); err != nil {
		t.Fatalf("start: %v\n%s", err, out)
	}
	out, err := script("status", "CLICKHOUSE_HTTP_PORT=")
	if err != nil || !strings.Contains(out, "http 127.0.0.1:"+httpPort+", answering /ping") {
		t.Errorf("status without CLICKHOUSE_HTTP_PORT: %v\n%s", err, out)
	}
	if out, err := script("start", "CLICKHOUSE_HTTP_PORT="); err != nil || !strings.Contains(out, "already running") {
		t.Errorf("start without CLICKHOUSE_HTTP_PORT: %v\n%s", err, out)
	}
}

// TestRealClickHouseScriptCRLFPassword: a ClickHouse that
// deploy/local/clickhouse.sh starts with a password file whose line ends
// in "\r\n" (written on Windows, or by a tool that does) requires the
// password Meterline reads from that file (secret.FromFile drops one
// "\n", then one "\r"), so `meterline migrate --clickhouse-password-file`
// logs in with the same file. On the test server's port + 122 and + 123.
func TestRealClickHouseScriptCRLFPassword(t *testing.T) {
	addr := testenv.RealClickHouse(t)
	native := testenv.PortAbove(t, addr, 122)
	pwFile := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(pwFile, []byte("crlf-Passw0rd\r\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	script := clickHouseScript(t, "CLICKHOUSE_PORT="+native, "CLICKHOUSE_HTTP_PORT="+testenv.PortAbove(t, addr, 123),
		"CLICKHOUSE_PASSWORD_FILE="+pwFile, "CLICKHOUSE_TLS_PORT=")
	if out, err := script("start"); err != nil {
		t.Fatalf("clickhouse.sh start with a CRLF password file: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	code := cli.Main(ctx, []string{"migrate", "--clickhouse", "127.0.0.1:" + native, "--database", "crlf_password",
		"--clickhouse-password-file", pwFile}, cli.IO{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &out})
	if code != 0 || !strings.Contains(out.String(), "applied now") {
		t.Fatalf("migrate with the password file clickhouse.sh started the server with: exit %d\n%s", code, out.String())
	}
}

// TestRealClickHouseScriptReportsACrash: a server deploy/local/clickhouse.sh
// started that aborts (as 18.16 does on some internal errors) is reported
// by stop as gone without a stop, with the lines of its error log that say
// how it ended, so that a run whose every later ClickHouse test failed
// names why. On the ports of TestRealClickHouseScriptKeepsHTTPPort (the
// package's tests run one at a time).
func TestRealClickHouseScriptReportsACrash(t *testing.T) {
	script, dir, _ := startScriptServer(t)
	b, err := os.ReadFile(filepath.Join(dir, "clickhouse-server.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid := strings.TrimSpace(string(b))
	if out, err := exec.Command("kill", "-ABRT", pid).CombinedOutput(); err != nil {
		t.Fatalf("kill -ABRT %s: %v %s", pid, err, out)
	}
	for deadline := time.Now().Add(20 * time.Second); exec.Command("kill", "-0", pid).Run() == nil; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("pid %s alive 20 s after SIGABRT", pid)
		}
	}
	out, err := script("stop")
	if err != nil {
		t.Fatalf("stop: %v\n%s", err, out)
	}
	for _, want := range []string{"(pid " + pid + ") is gone without a stop", "Received signal Aborted (6)", "not running"} {
		if !strings.Contains(out, want) {
			t.Errorf("stop after the server aborted does not say %q:\n%s", want, out)
		}
	}
	if out, err := script("stop"); err != nil || strings.Contains(out, "gone") {
		t.Errorf("a second stop: %v\n%s", err, out)
	}
}

// TestRealClickHouseScriptStartFresh: start-fresh starts a stopped server on
// a new data dir (what `make test` does: the databases and system logs of
// earlier runs, hundreds of parts, once made a start outlast its timeout),
// keeps a running server and its data, and the server writes no
// system.query_thread_log (a new part every 7.5 s that filled long-lived
// data dirs) while system.query_log, which tests read, is still written.
// On the ports of TestRealClickHouseScriptKeepsHTTPPort.
func TestRealClickHouseScriptStartFresh(t *testing.T) {
	script, dir, native := startScriptServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if code := cli.Main(ctx, []string{"migrate", "--clickhouse", "127.0.0.1:" + native, "--database", "fresh_dir"},
		cli.IO{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &out}); code != 0 {
		t.Fatalf("migrate: exit %d\n%s", code, out.String())
	}
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{"127.0.0.1:" + native}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.Exec(ctx, "SYSTEM FLUSH LOGS"); err != nil {
		t.Fatal(err)
	}
	var queryLog, threadLog uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM system.query_log").Scan(&queryLog); err != nil || queryLog == 0 {
		t.Errorf("system.query_log after migrate and SYSTEM FLUSH LOGS: %d rows, %v", queryLog, err)
	}
	if err := conn.QueryRow(ctx, "SELECT count() FROM system.tables WHERE database = 'system' AND name = 'query_thread_log'").
		Scan(&threadLog); err != nil || threadLog != 0 {
		t.Errorf("system.query_thread_log exists (%d tables, %v): the server logs every query's threads", threadLog, err)
	}
	metadata := filepath.Join(dir, "data", "metadata", "fresh_dir.sql")
	if o, err := script("start-fresh"); err != nil || !strings.Contains(o, "already running") {
		t.Errorf("start-fresh on a running server: %v\n%s", err, o)
	}
	if _, err := os.Stat(metadata); err != nil {
		t.Errorf("start-fresh on a running server removed its data: %v", err)
	}
	if o, err := script("stop"); err != nil {
		t.Fatalf("stop: %v\n%s", err, o)
	}
	if o, err := script("start-fresh"); err != nil {
		t.Fatalf("start-fresh: %v\n%s", err, o)
	}
	if _, err := os.Stat(metadata); !os.IsNotExist(err) {
		t.Errorf("start-fresh on a stopped server kept the data of its last run (%s: %v)", metadata, err)
	}
}

// startScriptServer starts a server of the test's own with
// deploy/local/clickhouse.sh on the test server's port + 120 (HTTP + 121)
// in a data dir of the test's, and returns the script, the dir and the
// native port.
func startScriptServer(t *testing.T) (script func(string, ...string) (string, error), dir, native string) {
	t.Helper()
	addr := testenv.RealClickHouse(t)
	native, httpPort := testenv.PortAbove(t, addr, 120), testenv.PortAbove(t, addr, 121)
	dir = t.TempDir()
	script = clickHouseScript(t, "CLICKHOUSE_PORT="+native, "CLICKHOUSE_HTTP_PORT="+httpPort, "CLICKHOUSE_DATA_DIR="+dir)
	if out, err := script("start"); err != nil {
		t.Fatalf("start: %v\n%s", err, out)
	}
	return script, dir, native
}
