package producer

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/sasl/plain"

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
			t.Fatal(err)
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
