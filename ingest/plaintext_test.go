package ingest

import (
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// TestPlaintextWarning: an ingest that serves plain HTTP on an address
// other hosts can reach (every interface, or one not loopback) warns at
// start, naming the address and the flags that serve HTTPS: API keys
// would cross the network in the clear. On a loopback address, a name
// that is one included, or with TLS, it does not.
func TestPlaintextWarning(t *testing.T) {
	certFile, keyFile, _ := selfSigned(t, t.TempDir())
	for _, c := range []struct {
		addr string
		tls  bool
		warn bool
	}{
		{"0.0.0.0:0", false, true},
		{":0", false, true},
		{"127.0.0.1:0", false, false},
		{"localhost:0", false, false},
		{"0.0.0.0:0", true, false},
	} {
		t.Run(c.addr+map[bool]string{true: " tls"}[c.tls], func(t *testing.T) {
			core, logs := observer.New(zap.InfoLevel)
			e := newEnv(t, func(cfg *Config) {
				cfg.Addr, cfg.Logger = c.addr, zap.New(core)
				if c.tls {
					cfg.TLSCertFile, cfg.TLSKeyFile = certFile, keyFile
				}
			})
			if err := e.stop(); err != nil {
				t.Fatal(err)
			}
			var warns []observer.LoggedEntry
			for _, l := range logs.FilterLevelExact(zap.WarnLevel).All() {
				if strings.Contains(l.Message, "in the clear") {
					warns = append(warns, l)
				}
			}
			if !c.warn {
				if len(warns) > 0 {
					t.Fatalf("warned: %s", warns[0].Message)
				}
				return
			}
			if len(warns) != 1 {
				t.Fatalf("%d warnings of plain HTTP, want 1; logs: %v", len(warns), logs.All())
			}
			w := warns[0]
			for _, want := range []string{"API keys", "--tls-cert-file", "--tls-key-file"} {
				if !strings.Contains(w.Message, want) {
					t.Errorf("warning %q does not name %q", w.Message, want)
				}
			}
			f := w.ContextMap()
			if f["addr"] != c.addr || f["bound"] != e.srv.Addr() {
				t.Errorf("warning's fields %v, want addr %s and bound %s", f, c.addr, e.srv.Addr())
			}
		})
	}
}
