package producer

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/meterline/meterline/internal/testenv"
)

// TestSASLOverTLS: WithSASL and WithTLS reach the client. A broker that
// requires TLS with a client certificate and SASL/PLAIN takes an event
// from a producer with both, and none from a producer without SASL.
func TestSASLOverTLS(t *testing.T) {
	certs := testenv.NewCerts(t)
	const pw = "pl41n-over-tls"
	_, brokers := testenv.KFake(t, kfake.TLS(certs.ServerTLS(true)), kfake.EnableSASL(),
		kfake.Superuser("PLAIN", "svc", pw), kfake.SeedTopics(2, DefaultTopic))
	ca, err := os.ReadFile(certs.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	cert, err := tls.LoadX509KeyPair(certs.ClientCertFile, certs.ClientKeyFile)
	if err != nil {
		t.Fatal(err)
	}
	tc := &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}

	send := func(opts ...Option) error {
		p, err := New(append([]Option{WithBrokers(brokers...)}, opts...)...)
		if err != nil {
			return err
		}
		defer p.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		e := goodEvent()
		e.EventTime = time.Now()
		return p.Send(ctx, e)
	}
	if err := send(WithTLS(tc), WithSASL(plain.Auth{User: "svc", Pass: pw}.AsMechanism())); err != nil {
		t.Fatalf("with TLS and SASL: %v", err)
	}
	if err := send(WithTLS(tc)); err == nil {
		t.Fatal("without SASL the send succeeded")
	}
	if err := send(WithSASL(plain.Auth{User: "svc", Pass: pw}.AsMechanism())); err == nil {
		t.Fatal("without TLS the send succeeded")
	}
}

// TestPlainNeedsTLS: New refuses SASL/PLAIN on a client that would dial
// without TLS, as the CLI refuses --kafka-sasl-mechanism PLAIN without
// --kafka-tls: PLAIN sends the password in the clear. The mechanism may
// come from WithSASL or from kgo.SASL in WithClientOptions, and TLS from
// WithTLS, kgo.DialTLSConfig or a dialer of the caller's (kgo.Dialer,
// which the producer cannot look into) other than a net.Dialer's, which
// is plaintext. SCRAM needs no TLS.
func TestPlainNeedsTLS(t *testing.T) {
	pl := plain.Auth{User: "svc", Pass: "s3cret-pl41n"}.AsMechanism()
	sc := scram.Auth{User: "svc", Pass: "s3cret-scram"}.AsSha512Mechanism()
	dialer := func(ctx context.Context, network, host string) (net.Conn, error) {
		return tls.DialWithDialer(new(net.Dialer), network, host, new(tls.Config))
	}
	for _, c := range []struct {
		name   string
		opts   []Option
		refuse bool
	}{
		{"WithSASL PLAIN", []Option{WithSASL(pl)}, true},
		{"WithSASL PLAIN, nil WithTLS", []Option{WithSASL(pl), WithTLS(nil)}, true},
		{"kgo.SASL PLAIN", []Option{WithClientOptions(kgo.SASL(pl))}, true},
		{"PLAIN among mechanisms", []Option{WithClientOptions(kgo.SASL(sc, pl))}, true},
		{"WithSASL PLAIN, net.Dialer", []Option{WithSASL(pl), WithClientOptions(kgo.Dialer(new(net.Dialer).DialContext))}, true},
		{"WithSASL PLAIN, WithTLS", []Option{WithSASL(pl), WithTLS(new(tls.Config))}, false},
		{"WithSASL PLAIN, kgo.DialTLS", []Option{WithSASL(pl), WithClientOptions(kgo.DialTLS())}, false},
		{"WithSASL PLAIN, kgo.Dialer", []Option{WithSASL(pl), WithClientOptions(kgo.Dialer(dialer))}, false},
		{"WithSASL SCRAM", []Option{WithSASL(sc)}, false},
		{"no SASL", nil, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := New(append([]Option{WithBrokers("127.0.0.1:1")}, c.opts...)...)
			if !c.refuse {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				p.Close()
				return
			}
			if err == nil {
				p.Close()
				t.Fatal("accepted")
			}
			if !errors.Is(err, ErrPlainWithoutTLS) {
				t.Errorf("error %v is not ErrPlainWithoutTLS", err)
			}
			const want = "PLAIN sends the password in the clear; it needs TLS"
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not say %q", err, want)
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("error %q shows the password", err)
			}
		})
	}
}
