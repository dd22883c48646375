package demo

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/tlsconfig"
	"github.com/meterline/meterline/sink"
)

// TestTryCommandTLS: the clickhouse-client command the report prints
// reaches the sink's ClickHouse as the sink does: --secure over TLS, the
// user, and the certificate files named for clickhouse-client's
// configuration file; plain and as user default, the command as before.
func TestTryCommandTLS(t *testing.T) {
	plain := tryCommand(sink.Server{Addr: "127.0.0.1:9000"}, "meterline_demo")
	if !strings.HasPrefix(plain, "clickhouse-client --host 127.0.0.1 --port 9000 --database meterline_demo --query ") || strings.Contains(plain, "\n") {
		t.Errorf("plain: %q", plain)
	}
	srv := sink.Server{Addr: "ch.example:9440", User: "analyst",
		TLS: tlsconfig.Files{CAFile: "/etc/ca.pem", CertFile: "/etc/client.pem", KeyFile: "/etc/client.key"}}
	got := tryCommand(srv, "meterline_demo")
	first, rest, _ := strings.Cut(got, "\n")
	for _, want := range []string{"--host ch.example --port 9440 --secure", "--user analyst --password", "--database meterline_demo"} {
		if !strings.Contains(first, want) {
			t.Errorf("TLS: %q lacks %q", first, want)
		}
	}
	for _, want := range []string{"<caConfig>/etc/ca.pem</caConfig>", "<certificateFile>/etc/client.pem</certificateFile>", "<privateKeyFile>/etc/client.key</privateKeyFile>"} {
		if !strings.Contains(rest, want) {
			t.Errorf("TLS: the line after the command, %q, lacks %q", rest, want)
		}
	}
	if got := tryCommand(sink.Server{Addr: "127.0.0.1:9440", TLS: tlsconfig.Files{Enabled: true}}, "d"); !strings.Contains(got, "--port 9440 --secure --database d") || strings.Contains(got, "\n") {
		t.Errorf("TLS with the system's CAs: %q", got)
	}
}

// TestPrepareDatabaseHint: the demo suggests starting a ClickHouse only
// when nothing answers at --clickhouse; a server that answers and fails
// the TLS session (its certificate not trusted) is not one to start.
func TestPrepareDatabaseHint(t *testing.T) {
	ts := httptest.NewTLSServer(http.NotFoundHandler())
	defer ts.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := prepareDatabase(ctx, sink.Server{Addr: ts.Listener.Addr().String(), TLS: tlsconfig.Files{Enabled: true}}, "meterline_demo")
	if err == nil {
		t.Fatal("prepareDatabase succeeded against an HTTPS server with an untrusted certificate")
	}
	if strings.Contains(err.Error(), "clickhouse.sh start") {
		t.Errorf("a TLS server answers, the error suggests starting one: %v", err)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	_, err = prepareDatabase(ctx, sink.Server{Addr: closed}, "meterline_demo")
	if err == nil || !strings.Contains(err.Error(), "start one with deploy/local/clickhouse.sh start") {
		t.Errorf("nothing answers at %s: %v, want the hint to start one", closed, err)
	}
}
