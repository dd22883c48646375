package cli

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/testenv"
)

// TestRealSecuredClickHouseTLSFlags: the ClickHouse TLS flags of a
// command, on the real ClickHouse's tcp_port_secure (a client certificate
// required, and a password), through `meterline demo --sink`, which
// needs no Kafka. Each wrong setting — --clickhouse-tls alone (the
// system's CAs), a CA file of another CA, a --clickhouse-tls-server-name
// the certificate does not carry, no client certificate, no TLS flag —
// ends the command at once with an error naming TLS or the certificate,
// never the password, before anything is written. The right flags, with
// --clickhouse-tls-server-name localhost (on the certificate, dialling
// 127.0.0.1), write every row.
func TestRealSecuredClickHouseTLSFlags(t *testing.T) {
	ch := testenv.RealClickHouseSecure(t)
	parallelWaitingTest(t, &otherLane)
	conn, db := ch.DB(t)
	f := ch.TLS()
	other := testenv.NewCerts(t)
	pw := ch.Password(t)
	base := []string{"--sink", "--clickhouse", ch.Addr, "--sink-database", db, "--clickhouse-password-file", ch.PasswordFile,
		"--duration", "4s", "--rate", "200", "--seed", "7"}
	certFlags := []string{"--clickhouse-tls-cert-file", f.CertFile, "--clickhouse-tls-key-file", f.KeyFile}
	caFlags := []string{"--clickhouse-tls-ca-file", f.CAFile}
	join := func(parts ...[]string) []string {
		var all []string
		for _, p := range parts {
			all = append(all, p...)
		}
		return all
	}
	demo := func(args []string) (int, string, string, time.Duration) {
		t.Helper()
		start := time.Now()
		code, out, errOut := run(t, "", append([]string{"demo", "--dir", filepath.Join(t.TempDir(), "demo")}, args...)...)
		return code, out, errOut, time.Since(start)
	}

	refused := []struct {
		name string
		args []string
		want string
	}{
		{"--clickhouse-tls alone (system CAs)", join(base, []string{"--clickhouse-tls"}, certFlags), "certificate signed by unknown authority"},
		{"CA file of another CA", join(base, []string{"--clickhouse-tls-ca-file", other.CAFile}, certFlags), "certificate signed by unknown authority"},
		{"server name not on the certificate", join(base, caFlags, certFlags, []string{"--clickhouse-tls-server-name", "clickhouse.invalid"}), "not clickhouse.invalid"},
		{"no client certificate", join(base, caFlags), "TLS handshake failed"},
		{"no TLS flag", base, "speaks TLS"},
	}
	for _, c := range refused {
		code, out, errOut, took := demo(c.args)
		switch {
		case code == 0:
			t.Errorf("%s: exit 0; want a refusal\n%s", c.name, out)
		case !strings.Contains(errOut, c.want):
			t.Errorf("%s: exit %d, stderr %q; want it to say %q", c.name, code, errOut, c.want)
		case took > 15*time.Second:
			t.Errorf("%s: refused after %v; want at once", c.name, took)
		}
		if strings.Contains(out+errOut, pw) {
			t.Errorf("%s: the output shows the password", c.name)
		}
		t.Logf("%s: exit %d in %v: %s", c.name, code, took.Round(time.Millisecond), strings.TrimSpace(errOut))
	}
	var tables uint64
	if err := conn.QueryRow(ctxT(t, 30*time.Second), "SELECT count() FROM system.tables WHERE database = '"+db+"'").Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 0 {
		t.Errorf("the refused commands made %d tables in %s", tables, db)
	}

	code, out, errOut, took := demo(join(base, caFlags, certFlags, []string{"--clickhouse-tls-server-name", "localhost"}))
	if code != 0 || !strings.Contains(out, "== RECONCILED") {
		t.Fatalf("demo --sink over TLS: exit %d\n%s\n%s", code, out, errOut)
	}
	t.Logf("demo --sink over TLS: %v", took.Round(time.Millisecond))
	var events uint64
	if err := conn.QueryRow(ctxT(t, 30*time.Second), "SELECT count() FROM usage_events").Scan(&events); err != nil {
		t.Fatal(err)
	}
	if want := reportLine(t, out, `unique events produced = events counted`); events == 0 || int64(events) != want {
		t.Errorf("usage_events holds %d rows over TLS, the demo produced %d unique events", events, want)
	}
}
