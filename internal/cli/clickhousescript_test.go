package cli

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/testenv"
)

// TestRealClickHouseScriptCRLFPassword: a ClickHouse that
// deploy/local/clickhouse.sh starts with a password file whose line ends
// in "\r\n" (written on Windows, or by a tool that does) requires the
// password Meterline reads from that file (secret.FromFile drops one
// "\n", then one "\r"), so `meterline migrate --clickhouse-password-file`
// logs in with the same file. On the test server's port + 122 and + 123.
func TestRealClickHouseScriptCRLFPassword(t *testing.T) {
	_, p, err := net.SplitHostPort(testenv.RealClickHouse(t))
	if err != nil {
		t.Fatal(err)
	}
	base, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	native, httpPort := strconv.Itoa(base+122), strconv.Itoa(base+123)
	dir := t.TempDir()
	pwFile := tempFiles(t)("password", "crlf-Passw0rd\r\n")
	script := func(cmd string) (string, error) {
		c := exec.Command(filepath.Join("..", "..", "deploy", "local", "clickhouse.sh"), cmd)
		c.Env = append(os.Environ(), "CLICKHOUSE_PORT="+native, "CLICKHOUSE_HTTP_PORT="+httpPort,
			"CLICKHOUSE_DATA_DIR="+dir, "CLICKHOUSE_START_TIMEOUT=30", "CLICKHOUSE_PASSWORD_FILE="+pwFile, "CLICKHOUSE_TLS_PORT=")
		out, err := c.CombinedOutput()
		return string(out), err
	}
	t.Cleanup(func() {
		if out, err := script("stop"); err != nil {
			t.Errorf("stop: %v\n%s", err, out)
		}
	})
	if out, err := script("start"); err != nil {
		t.Fatalf("clickhouse.sh start with a CRLF password file: %v\n%s", err, out)
	}
	code, out := command(t, time.Minute, "", "migrate", "--clickhouse", "127.0.0.1:"+native, "--database", "crlf_password",
		"--clickhouse-password-file", pwFile)
	if code != 0 || !strings.Contains(out, "applied now") {
		t.Fatalf("migrate with the password file clickhouse.sh started the server with: exit %d\n%s", code, out)
	}
}
