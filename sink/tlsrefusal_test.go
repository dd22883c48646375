package sink

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/secret"
	"github.com/meterline/meterline/internal/testenv"
)

// TestRealSecuredTLSRefusals: on the real ClickHouse's tcp_port_secure
// (a client certificate required), a client whose TLS settings are wrong
// is refused at once, with an error that names TLS or the certificate,
// both by CheckLogin (what the commands check first) and by a sink's
// connect (which must stop, not retry for ever): a CA that did not sign
// the server's certificate, the system's CAs only (--clickhouse-tls), no
// TLS at all, a server name the certificate does not carry, no client
// certificate, a client certificate of another CA, and TLS to a port
// that does not speak it (a tcp_port, not the tcp_port_secure). The right
// settings with the server name the certificate carries (localhost,
// dialling 127.0.0.1) connect.
func TestRealSecuredTLSRefusals(t *testing.T) {
	ch := testenv.RealClickHouseSecure(t)
	other := testenv.NewCerts(t)
	good := Server{Addr: ch.Addr, Password: secret.New(ch.Password(t)), TLS: ch.TLS()}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	named := good
	named.TLS.ServerName = "localhost"
	if err := named.CheckLogin(ctx); err != nil {
		t.Fatalf("server name localhost (on the certificate): %v", err)
	}

	wrongCA := good
	wrongCA.TLS.CAFile = other.CAFile
	systemCAs := good
	systemCAs.TLS.CAFile = ""
	systemCAs.TLS.Enabled = true
	wrongName := good
	wrongName.TLS.ServerName = "clickhouse.invalid"
	noCert := good
	noCert.TLS.CertFile, noCert.TLS.KeyFile = "", ""
	otherCert := good
	otherCert.TLS.CertFile, otherCert.TLS.KeyFile = other.ClientCertFile, other.ClientKeyFile
	// No TLS at all: the password must not go out (Validate allows it to
	// a loopback address, so it is left out here: the server never sees
	// a login).
	plain := Server{Addr: ch.Addr}
	// TLS to a port that does not speak it: the plain ClickHouse's
	// tcp_port.
	tlsAtPlain := Server{Addr: testenv.RealClickHouse(t), TLS: ch.TLS()}

	cases := []struct {
		name string
		s    Server
		want []string // the error names one of these
	}{
		{"CA that did not sign the server", wrongCA, []string{"certificate"}},
		{"system CAs only", systemCAs, []string{"certificate"}},
		{"server name not on the certificate", wrongName, []string{"certificate", "clickhouse.invalid"}},
		{"no client certificate", noCert, []string{"TLS"}},
		{"client certificate of another CA", otherCert, []string{"TLS"}},
		{"no TLS", plain, []string{"speaks TLS", "--clickhouse-tls"}},
		{"TLS to a port without it", tlsAtPlain, []string{"does not speak TLS", "tcp_port_secure"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			start := time.Now()
			err := c.s.CheckLogin(ctx)
			took := time.Since(start)
			if err == nil {
				t.Fatal("CheckLogin passed; want a TLS refusal")
			}
			if took > 15*time.Second {
				t.Errorf("CheckLogin took %v to fail; want a prompt refusal", took)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("CheckLogin: %v; want it to name %q", err, w)
				}
			}
			if p := ch.Password(t); strings.Contains(err.Error(), p) {
				t.Errorf("CheckLogin's error shows the password: %v", err)
			}
			if err := connectWith(t, c.s); err == nil {
				t.Error("a sink's connect succeeded")
			} else if errors.Is(err, ErrAuthentication) {
				t.Errorf("a sink's connect: %v; want the TLS error, not a refused login", err)
			}
			t.Logf("%s: %v (%v)", c.name, err, took.Round(time.Millisecond))
		})
	}
}
