package deploy

import (
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/meterline/meterline/internal/testenv"
)

// TestRealClickHouseScriptKeepsHTTPPort: a server that
// deploy/local/clickhouse.sh started with CLICKHOUSE_HTTP_PORT is found
// healthy by start and status given only its CLICKHOUSE_PORT (as the docs'
// blocks run `deploy/local/clickhouse.sh start` with the test server's
// native port), and stopped by stop: the script takes the HTTP port from
// the running server's config rather than probe 8123.
func TestRealClickHouseScriptKeepsHTTPPort(t *testing.T) {
	// Ports 120 and 121 above the test server's native port: the block of
	// ports its runner owns.
	_, p, err := net.SplitHostPort(testenv.RealClickHouse(t))
	if err != nil {
		t.Fatal(err)
	}
	base, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	native, httpPort := strconv.Itoa(base+120), strconv.Itoa(base+121)
	dir := t.TempDir()
	script := func(cmd string, withHTTP bool) (string, error) {
		c := exec.Command("local/clickhouse.sh", cmd)
		c.Env = append(os.Environ(), "CLICKHOUSE_PORT="+native, "CLICKHOUSE_DATA_DIR="+dir, "CLICKHOUSE_START_TIMEOUT=30")
		if withHTTP {
			c.Env = append(c.Env, "CLICKHOUSE_HTTP_PORT="+httpPort)
		} else {
			c.Env = append(c.Env, "CLICKHOUSE_HTTP_PORT=")
		}
		out, err := c.CombinedOutput()
		return string(out), err
	}
	if out, err := script("start", true); err != nil {
		t.Fatalf("start: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if out, err := script("stop", true); err != nil {
			t.Errorf("stop: %v\n%s", err, out)
		}
	})
	out, err := script("status", false)
	if err != nil || !strings.Contains(out, "http 127.0.0.1:"+httpPort+", answering /ping") {
		t.Errorf("status without CLICKHOUSE_HTTP_PORT: %v\n%s", err, out)
	}
	if out, err := script("start", false); err != nil || !strings.Contains(out, "already running") {
		t.Errorf("start without CLICKHOUSE_HTTP_PORT: %v\n%s", err, out)
	}
}
