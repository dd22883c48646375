package testenv

import (
	"path/filepath"
	"regexp"
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
