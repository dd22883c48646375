package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/meterline/meterline/internal/testenv"
)

// TestIngestPlaintextWarning: `meterline ingest --addr 0.0.0.0:…`
// without TLS logs a warning at start that names the address and the
// flags that serve HTTPS (API keys would cross the network in the
// clear); on 127.0.0.1 it does not.
func TestIngestPlaintextWarning(t *testing.T) {
	_, brokers := testenv.KFake(t, kfake.SeedTopics(2, "usage.events", "meterline.keys", "usage.balances"))
	ingest := func(addr string) string {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		var out, errb testenv.SyncBuffer
		go func() { // stop once it serves
			for ctx.Err() == nil && !strings.Contains(errb.String(), `"msg":"ingest serving"`) {
				time.Sleep(10 * time.Millisecond)
			}
			cancel()
		}()
		code := Main(ctx, []string{"ingest", "--brokers", strings.Join(brokers, ","), "--addr", addr, "--metrics-addr", "127.0.0.1:0"},
			IO{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb})
		if code != 0 || !strings.Contains(errb.String(), `"msg":"ingest serving"`) {
			t.Fatalf("ingest --addr %s: exit %d\n%s", addr, code, errb.String())
		}
		return errb.String()
	}
	var warning string
	for _, l := range strings.Split(ingest("0.0.0.0:0"), "\n") {
		if strings.Contains(l, "in the clear") {
			warning = l
		}
	}
	for _, want := range []string{`"level":"warn"`, `"addr":"0.0.0.0:0"`, "--tls-cert-file", "--tls-key-file", "API keys"} {
		if !strings.Contains(warning, want) {
			t.Errorf("warning line %q does not have %s", warning, want)
		}
	}
	if errOut := ingest("127.0.0.1:0"); strings.Contains(errOut, "in the clear") {
		t.Errorf("warned on 127.0.0.1:\n%s", errOut)
	}
}
