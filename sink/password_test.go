package sink

import (
	"strings"
	"testing"

	"github.com/meterline/meterline/internal/secret"
	"github.com/meterline/meterline/internal/tlsconfig"
)

// TestPasswordNeedsTLS: the native protocol sends the password in the
// clear, so Validate refuses a password without TLS to any host but this
// machine, as kafka.Config refuses SASL/PLAIN without TLS; the error names
// the address and never the password.
func TestPasswordNeedsTLS(t *testing.T) {
	const pw = "s3cret-password"
	for _, c := range []struct {
		addr string
		tls  bool
		pw   string
		ok   bool
	}{
		{"clickhouse.internal:9000", false, pw, false},
		{"10.0.0.7:9000", false, pw, false},
		{"[2001:db8::1]:9000", false, pw, false},
		{"localhost.example.com:9000", false, pw, false},
		{"clickhouse.internal:9440", true, pw, true},
		{"clickhouse.internal:9000", false, "", true},
		{"127.0.0.1:9000", false, pw, true},
		{"127.0.0.2:9000", false, pw, true},
		{"localhost:9000", false, pw, true},
		{"[::1]:9000", false, pw, true},
	} {
		s := Server{Addr: c.addr, TLS: tlsconfig.Files{Enabled: c.tls}}
		if c.pw != "" {
			s.Password = secret.New(c.pw)
		}
		err := s.Validate()
		if c.ok {
			if err != nil {
				t.Errorf("%s, TLS %v, password %v: %v", c.addr, c.tls, c.pw != "", err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), "in the clear") || !strings.Contains(err.Error(), "TLS") ||
			!strings.Contains(err.Error(), c.addr) || strings.Contains(err.Error(), pw) {
			t.Errorf("%s without TLS: %v; want a refusal naming the address and TLS, without the password", c.addr, err)
		}
	}
}
