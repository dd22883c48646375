package kafka_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/secret"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/tlsconfig"
)

// TestAwaitClusterWaitsThroughClosedConnections: without SASL, the only
// seed closing every connection after reading its first request (a broker
// shutting down or restarting, a proxy before a broker that is not up
// yet), or resetting it, is no refusal of the client's settings:
// AwaitCluster waits, calling waiting, and returns nil once the seed
// serves, and CheckCredentials returns nil, as for a seed it cannot reach
// (a sink or an ingest started then waits in its clients). With TLS, so
// is a close after a finished handshake.
func TestAwaitClusterWaitsThroughClosedConnections(t *testing.T) {
	certs := testenv.NewCerts(t)
	for _, c := range []struct {
		name  string
		tls   bool
		reset bool
	}{{"plaintext", false, false}, {"plaintext, reset", false, true}, {"TLS, closed after the handshake", true, false}} {
		t.Run(c.name, func(t *testing.T) {
			_, brokers := testenv.KFake(t)
			var tc *tls.Config
			cfg := kafka.Config{}
			if c.tls {
				tc = certs.ServerTLS(false)
				cfg.TLS = tlsconfig.Files{CAFile: certs.CAFile}
			}
			addr, forward := closingThenForwarding(t, brokers[0], tc, c.reset)
			cfg.Brokers = []string{addr}
			var waits atomic.Int32
			done := make(chan error, 1)
			go func() {
				done <- kafka.AwaitCluster(ctx(t), cfg, func(err error) {
					t.Logf("waiting: %v", err)
					waits.Add(1)
				})
			}()
			deadline := time.After(10 * time.Second)
			for waits.Load() < 2 {
				select {
				case err := <-done:
					t.Fatalf("AwaitCluster = %v while the only seed closed every connection; want it to wait", err)
				case <-deadline:
					t.Fatalf("AwaitCluster called waiting %d times in 10 s, want 2", waits.Load())
				case <-time.After(20 * time.Millisecond):
				}
			}
			if err := kafka.CheckCredentials(ctx(t), cfg); err != nil {
				t.Fatalf("CheckCredentials = %v while the only seed closed every connection; want nil, as for a seed that cannot be reached", err)
			}
			forward()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("AwaitCluster = %v once the seed forwards to the cluster, want nil", err)
				}
			case <-time.After(15 * time.Second):
				t.Fatal("AwaitCluster still waiting 15 s after the seed forwards to the cluster")
			}
		})
	}
}

// TestAwaitClusterStopsOnClosedLogin: a seed that closes (or resets) the
// connection during the TLS handshake (a listener without TLS), or, with SASL, while
// the client authenticates (a wrong password on some servers) refuses the
// client's settings: AwaitCluster stops at once, without waiting, with
// CheckCredentials' error.
func TestAwaitClusterStopsOnClosedLogin(t *testing.T) {
	certs := testenv.NewCerts(t)
	for _, c := range []struct {
		name  string
		cfg   kafka.Config
		reset bool
		want  error
	}{
		{"TLS, closed during the handshake", kafka.Config{TLS: tlsconfig.Files{CAFile: certs.CAFile}}, false, kafka.ErrTLS},
		{"TLS, reset during the handshake", kafka.Config{TLS: tlsconfig.Files{CAFile: certs.CAFile}}, true, kafka.ErrTLS},
		{"SASL, closed while authenticating", kafka.Config{
			SASL: kafka.SASL{Mechanism: kafka.ScramSHA512, User: "admin", Password: secret.New(password)}}, false, kafka.ErrAuthentication},
		{"SASL over TLS, closed during the handshake", kafka.Config{TLS: tlsconfig.Files{CAFile: certs.CAFile},
			SASL: kafka.SASL{Mechanism: kafka.Plain, User: "admin", Password: secret.New(password)}}, false, kafka.ErrTLS},
		{"SASL over TLS, reset during the handshake", kafka.Config{TLS: tlsconfig.Files{CAFile: certs.CAFile},
			SASL: kafka.SASL{Mechanism: kafka.Plain, User: "admin", Password: secret.New(password)}}, true, kafka.ErrTLS},
	} {
		t.Run(c.name, func(t *testing.T) {
			addr, _ := closingThenForwarding(t, "", nil, c.reset)
			cfg := c.cfg
			cfg.Brokers = []string{addr}
			var waits atomic.Int32
			err := kafka.AwaitCluster(ctx(t), cfg, func(err error) {
				t.Logf("waiting: %v", err)
				waits.Add(1)
			})
			if !errors.Is(err, c.want) || waits.Load() > 0 {
				t.Fatalf("AwaitCluster = %v after %d waits, want %v at once", err, waits.Load(), c.want)
			}
			if err := kafka.CheckCredentials(ctx(t), cfg); !errors.Is(err, c.want) {
				t.Fatalf("CheckCredentials = %v, want %v", err, c.want)
			}
		})
	}
}

// closingThenForwarding returns the address of a listener that reads the
// first bytes of each connection it accepts and closes it, as a broker
// shutting down does, or a proxy before a broker that is not up yet,
// until forward is called; from then on it forwards each connection to
// target. With tc it is a TLS listener: it completes the handshake before
// it reads and closes, and forwards the decrypted stream. With reset it
// resets each connection instead of closing it (as a proxy may). It
// closes when the test ends.
func closingThenForwarding(t *testing.T, target string, tc *tls.Config, reset bool) (addr string, forward func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if tc != nil {
		ln = tls.NewListener(ln, tc)
	}
	var forwarding atomic.Bool
	var mu sync.Mutex
	var conns []net.Conn
	track := func(c net.Conn) {
		mu.Lock()
		defer mu.Unlock()
		conns = append(conns, c)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			track(c)
			go func() {
				defer c.Close()
				if !forwarding.Load() {
					// Reading the request first closes with a FIN, not
					// the reset a close with unread data sends.
					_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
					_, _ = c.Read(make([]byte, 4096))
					if tcp, ok := c.(*net.TCPConn); ok && reset {
						_ = tcp.SetLinger(0)
					}
					return
				}
				b, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				track(b)
				defer b.Close()
				go func() { _, _ = io.Copy(b, c); _ = b.Close() }()
				_, _ = io.Copy(c, b)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String(), func() { forwarding.Store(true) }
}

// TestRealSecuredBrokerWithoutSASL: on the real SASL_SSL broker, a client
// with TLS but without SASL is waited for (the broker closes each
// connection after the first request, as one restarting does), the
// waiting error carrying kgo's guess (is SASL missing?); a client without
// TLS is refused at once, SASL or not: the broker answers it with a TLS
// alert (docs/operations.md, Kafka: SASL and TLS).
func TestRealSecuredBrokerWithoutSASL(t *testing.T) {
	k := testenv.RealKafkaSASL(t)
	withTLS := kafka.Config{Brokers: k.Brokers, TLS: k.TLS()}
	if err := kafka.CheckCredentials(ctx(t), withTLS); err != nil {
		t.Fatalf("TLS without SASL: CheckCredentials = %v, want nil (waited for)", err)
	}
	actx, cancel := context.WithTimeout(ctx(t), 3*time.Second)
	defer cancel()
	var waited error
	if err := kafka.AwaitCluster(actx, withTLS, func(err error) { waited = err }); !errors.Is(err, context.DeadlineExceeded) ||
		waited == nil || !strings.Contains(waited.Error(), "is SASL missing?") {
		t.Fatalf("TLS without SASL: AwaitCluster = %v after waiting on %v, want it waiting on kgo's guess (is SASL missing?)", err, waited)
	}
	for _, c := range []kafka.Config{{Brokers: k.Brokers}, {Brokers: k.Brokers, SASL: k.Config(t, "admin", kafka.ScramSHA512).SASL}} {
		err := kafka.AwaitCluster(ctx(t), c, func(err error) { t.Errorf("%s: waiting on %v, want it refused at once", c, err) })
		if err == nil || !strings.Contains(err.Error(), "plaintext connection speaking to a tls endpoint") {
			t.Errorf("%s: AwaitCluster = %v, want the refusal of a client without TLS", c, err)
		}
		if err := kafka.CheckCredentials(ctx(t), c); err == nil {
			t.Errorf("%s: CheckCredentials = nil, want the refusal of a client without TLS", c)
		}
	}
}
