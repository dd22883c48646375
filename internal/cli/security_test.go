package cli

import (
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/alecthomas/kong"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/testenv"
)

func flagsOf(t *testing.T) map[string][]*kong.Flag {
	t.Helper()
	var cli CLI
	p, err := Parser(&cli, IO{}, func(int) {})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]*kong.Flag{}
	var walk func(n *kong.Node)
	walk = func(n *kong.Node) {
		for _, f := range n.Flags {
			out[f.Name] = append(out[f.Name], f)
		}
		for _, c := range n.Children {
			walk(c)
		}
	}
	walk(p.Model.Node)
	return out
}

// TestHTTPServersBindLoopbackByDefault: every HTTP server of the command
// (a stage's, run's and the sink's metrics and status server, the demo's
// page, the HTTP ingest's API) listens on 127.0.0.1 unless told otherwise (docs/operations.md,
// HTTP servers).
func TestHTTPServersBindLoopbackByDefault(t *testing.T) {
	flags := flagsOf(t)
	n := 0
	for _, name := range []string{"metrics-addr", "http", "addr", "ingest-addr"} {
		for _, f := range flags[name] {
			n++
			host, _, err := net.SplitHostPort(f.Default)
			if err != nil || host != "127.0.0.1" {
				t.Errorf("--%s default %q: want 127.0.0.1:<port>", name, f.Default)
			}
		}
	}
	if n < 9 { // dedup, aggregate, sink, run, demo, ingest; the ingest's API of ingest, run, demo
		t.Fatalf("found %d HTTP address flags, want every command's", n)
	}
}

// TestNoSecretFlags: no flag takes a secret's value. A password on the
// command line is visible to every user of the machine (ps,
// /proc/<pid>/cmdline); the flags name files instead, and the
// environment holds the rest (docs/operations.md, Secrets).
func TestNoSecretFlags(t *testing.T) {
	for name := range flagsOf(t) {
		if strings.HasPrefix(name, "topic-") {
			continue // topic names (--topic-keys names the API keys' topic)
		}
		for _, word := range []string{"password", "secret", "token", "key"} {
			if strings.Contains(name, word) && !strings.HasSuffix(name, "-file") {
				t.Errorf("--%s takes a secret on the command line; name a file (--%s-file) or use the environment", name, name)
			}
		}
	}
	for _, flag := range []string{"--kafka-sasl-password", "--clickhouse-password"} {
		code, _, errOut := run(t, "", "topics", "check", flag, "hunter2")
		if code != 2 || !strings.Contains(errOut, "unknown flag "+flag) {
			t.Errorf("%s hunter2: exit %d, want 2 and an unknown flag: %s", flag, code, errOut)
		}
	}
}

// TestKafkaPasswordSources: the SASL password comes from the file named
// by --kafka-sasl-password-file or from METERLINE_KAFKA_SASL_PASSWORD;
// both at once, neither, or an empty file is a configuration error (exit
// 2) that names the setting; a wrong password ends the command (exit 1)
// before it does anything, naming the user and never the password.
func TestKafkaPasswordSources(t *testing.T) {
	const pw = "c0rrect-horse"
	_, brokers := testenv.KFake(t, kfake.EnableSASL(), kfake.Superuser(kafka.ScramSHA512, "ops", pw))
	file := tempFiles(t)
	good, wrong, empty := file("good", pw+"\n"), file("wrong", "not-"+pw), file("empty", "\n")
	base := []string{"topics", "create", "--partitions", "2", "--brokers", strings.Join(brokers, ","),
		"--kafka-sasl-mechanism", "SCRAM-SHA-512", "--kafka-sasl-user", "ops", "--timeout", "10s"}

	code, out, errOut := run(t, "", append(base, "--kafka-sasl-password-file", good)...)
	if code != 0 || !strings.Contains(out, "created  usage.events") {
		t.Fatalf("password from a file: exit %d\n%s\n%s", code, out, errOut)
	}
	t.Setenv(EnvKafkaSASLPassword, pw)
	code, out, errOut = run(t, "", "topics", "check", "--partitions", "2", "--brokers", strings.Join(brokers, ","),
		"--kafka-sasl-mechanism", "SCRAM-SHA-512", "--kafka-sasl-user", "ops")
	if code != 0 || !strings.Contains(out, "topics match") {
		t.Fatalf("password from %s: exit %d\n%s\n%s", EnvKafkaSASLPassword, code, out, errOut)
	}
	code, _, errOut = run(t, "", append(base, "--kafka-sasl-password-file", good)...)
	if code != 2 || !strings.Contains(errOut, "--kafka-sasl-password-file and "+EnvKafkaSASLPassword) {
		t.Fatalf("file and environment both set: exit %d, want 2 naming both: %s", code, errOut)
	}
	os.Unsetenv(EnvKafkaSASLPassword)
	code, _, errOut = run(t, "", base...)
	if code != 2 || !strings.Contains(errOut, "sasl-password: required") {
		t.Fatalf("no password: exit %d, want 2 naming sasl-password: %s", code, errOut)
	}
	code, _, errOut = run(t, "", append(base, "--kafka-sasl-password-file", empty)...)
	if code != 2 || !strings.Contains(errOut, empty) {
		t.Fatalf("empty password file: exit %d, want 2 naming the file: %s", code, errOut)
	}
	code, out, errOut = run(t, "", append(base, "--kafka-sasl-password-file", wrong)...)
	if code != 1 || !strings.Contains(errOut, "authentication failed") || !strings.Contains(errOut, `"ops"`) {
		t.Fatalf("wrong password: exit %d, want 1 with an authentication error naming the user:\n%s\n%s", code, out, errOut)
	}
	if strings.Contains(out+errOut, "not-"+pw) || strings.Contains(out+errOut, "created") {
		t.Fatalf("wrong password: the output shows the password or claims work done:\n%s\n%s", out, errOut)
	}
}

// TestPlainNeedsTLS: SASL/PLAIN sends the password in the clear, so the
// command refuses it without TLS, before connecting.
func TestPlainNeedsTLS(t *testing.T) {
	t.Setenv(EnvKafkaSASLPassword, "x")
	code, _, errOut := run(t, "", "lag", "--brokers", "127.0.0.1:1", "--kafka-sasl-mechanism", "PLAIN", "--kafka-sasl-user", "u")
	if code != 2 || !strings.Contains(errOut, "PLAIN") || !strings.Contains(errOut, "TLS") {
		t.Fatalf("exit %d, want 2 saying PLAIN needs TLS: %s", code, errOut)
	}
}

// TestClickHousePasswordNeedsTLS: ClickHouse's native protocol sends the
// password in the clear, so a command refuses one without TLS to another
// machine (exit status 2, before connecting), as it refuses SASL/PLAIN
// without TLS; to a loopback address it is allowed.
func TestClickHousePasswordNeedsTLS(t *testing.T) {
	const pw = "ch-password-not-to-show"
	t.Setenv(EnvClickHousePassword, pw)
	for _, args := range [][]string{
		{"migrate", "--clickhouse", "clickhouse.internal:9000"},
		{"sink", "--validate", "--instance-id", "a", "--clickhouse", "10.1.2.3:9000"},
		{"run", "--validate", "--instance-id", "a", "--clickhouse", "clickhouse.internal:9000", "--dedup-keys-file", testenv.DedupKeysFile(t)},
	} {
		code, out, errOut := run(t, "", args...)
		if code != 2 || !strings.Contains(errOut, "in the clear") || !strings.Contains(errOut, "--clickhouse-tls") {
			t.Errorf("%s: exit %d, want 2 saying the password needs TLS:\n%s%s", args, code, out, errOut)
		}
		if strings.Contains(out+errOut, pw) {
			t.Errorf("%s: the output shows the password", args)
		}
	}
	// Over TLS, or to this machine, the configuration is valid.
	for _, args := range [][]string{
		{"sink", "--validate", "--instance-id", "a", "--clickhouse", "clickhouse.internal:9440", "--clickhouse-tls"},
		{"sink", "--validate", "--instance-id", "a", "--clickhouse", "127.0.0.1:9000"},
	} {
		if code, out, errOut := run(t, "", args...); code != 0 {
			t.Errorf("%s: exit %d, want 0:\n%s%s", args, code, out, errOut)
		}
	}
}

// TestSecretGivenAsItsFileName: a secret set where the name of its file
// belongs — a flag's value, or its METERLINE_*_FILE variable set where
// the secret's own variable was meant — names no file. The command ends
// with an error that names the setting and never shows the secret, kong's
// expansion of a path flag included.
func TestSecretGivenAsItsFileName(t *testing.T) {
	t.Chdir(t.TempDir()) // a relative name resolves to a directory that exists
	keys := testenv.DedupKeysFile(t)
	ring := "k1 " + strings.Repeat("5ec7", 16)
	pem := "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgKat5/ON697XatOCF\n-----END PRIVATE KEY-----\n"
	validate := []string{"run", "--validate", "--instance-id", "a", "--dedup-keys-file", keys}
	// lag reads the TLS files before it connects (run --validate does not).
	certs := testenv.NewCerts(t)
	lag := []string{"lag", "--brokers", "127.0.0.1:1", "--kafka-tls-ca-file", certs.CAFile, "--kafka-tls-cert-file", certs.ClientCertFile}
	for _, c := range []struct {
		flag, env, secret, shown string
		cmd                      []string
	}{
		{"--kafka-sasl-password-file", "METERLINE_KAFKA_SASL_PASSWORD_FILE", "hunter2-Secret", "hunter2", validate},
		{"--clickhouse-password-file", "METERLINE_CLICKHOUSE_PASSWORD_FILE", "hunter3-Secret", "hunter3", validate},
		{"--dedup-keys-file", "METERLINE_DEDUP_KEYS_FILE", ring, "5ec75ec7", validate[:4]},
		{"--kafka-tls-key-file", "METERLINE_KAFKA_TLS_KEY_FILE", pem, "MIGHAgEA", lag},
		{"--clickhouse-tls-key-file", "METERLINE_CLICKHOUSE_TLS_KEY_FILE", pem, "MIGHAgEA",
			[]string{"sink", "run", "--validate", "--instance-id", "a", "--clickhouse-tls-cert-file", certs.ClientCertFile}},
		{"--tls-key-file", "METERLINE_TLS_KEY_FILE", pem, "MIGHAgEA", []string{"ingest", "--validate", "--tls-cert-file", certs.ServerCertFile}},
		{"--ingest-tls-key-file", "METERLINE_INGEST_TLS_KEY_FILE", pem, "MIGHAgEA",
			append(slices.Clone(validate), "--ingest", "--ingest-tls-cert-file", certs.ServerCertFile)},
	} {
		// "flag arg": the secret as the flag's next argument. One that
		// starts with "-" (every PEM key, a password such as "-x9…") is
		// refused by the parser, whose error would quote it.
		for _, how := range []string{"flag", "flag arg", "flag arg -", "env"} {
			args := append(slices.Clone(c.cmd), c.flag+"="+c.secret)
			switch how {
			case "flag arg":
				args = append(slices.Clone(c.cmd), c.flag, c.secret)
			case "flag arg -":
				args = append(slices.Clone(c.cmd), c.flag, "-"+c.secret)
			case "env":
				args = c.cmd
				t.Setenv(c.env, c.secret)
			}
			code, out, errOut := run(t, "", args...)
			os.Unsetenv(c.env)
			if code == 0 || strings.Contains(out+errOut, c.shown) || !strings.Contains(errOut, "is not shown") {
				t.Errorf("%s by %s: exit %d, want an error that does not show the secret:\n%s%s", c.flag, how, code, out, errOut)
			}
		}
	}
}

// TestValidateReadsTLSFiles: --validate reads the TLS files of the Kafka
// and ClickHouse connections, as a start does: a CA file that is missing
// or holds no certificate, or a client key that is not the certificate's,
// is a configuration error (exit 2) naming the connection, not
// "configuration ok" followed by a failed start.
func TestValidateReadsTLSFiles(t *testing.T) {
	certs := testenv.NewCerts(t)
	file := tempFiles(t)
	notPEM := file("ca.txt", "not a certificate\n")
	keys := testenv.DedupKeysFile(t)
	missing := filepath.Join(t.TempDir(), "missing.pem")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"dedup", "--validate", "--instance-id", "a", "--dedup-keys-file", keys, "--kafka-tls-ca-file", missing}, "kafka: tls: CA file"},
		{[]string{"run", "--validate", "--instance-id", "a", "--dedup-keys-file", keys, "--kafka-tls-ca-file", notPEM}, "holds no PEM certificate"},
		{[]string{"aggregate", "--validate", "--instance-id", "a", "--kafka-tls-cert-file", certs.ClientCertFile, "--kafka-tls-key-file", missing}, "kafka: tls: key file"},
		{[]string{"sink", "--validate", "--instance-id", "a", "--clickhouse-tls-ca-file", missing}, "clickhouse: tls: CA file"},
		{[]string{"sink", "--validate", "--instance-id", "a", "--clickhouse-tls-cert-file", certs.ClientCertFile, "--clickhouse-tls-key-file", certs.CAFile}, "clickhouse: tls: certificate"},
		// The HTTP ingest's own certificate and key.
		{[]string{"ingest", "--validate", "--tls-cert-file", missing, "--tls-key-file", certs.ServerKeyFile}, "--tls-cert-file: stat"},
		{[]string{"ingest", "--validate", "--tls-cert-file", certs.ServerCertFile, "--tls-key-file", certs.ClientKeyFile}, "ingest: tls: certificate"},
		{[]string{"run", "--validate", "--instance-id", "a", "--dedup-keys-file", keys, "--ingest",
			"--ingest-tls-cert-file", notPEM, "--ingest-tls-key-file", certs.ServerKeyFile}, "ingest: tls: certificate"},
	} {
		code, out, errOut := run(t, "", c.args...)
		if code != 2 || !strings.Contains(errOut, c.want) || strings.Contains(out, "configuration ok") {
			t.Errorf("%s: exit %d, want 2 and an error with %q:\n%s%s", c.args, code, c.want, out, errOut)
		}
	}
	// Files that load pass.
	ok := []string{"sink", "--validate", "--instance-id", "a", "--kafka-tls-ca-file", certs.CAFile,
		"--clickhouse-tls-ca-file", certs.CAFile, "--clickhouse-tls-cert-file", certs.ClientCertFile, "--clickhouse-tls-key-file", certs.ClientKeyFile}
	ingest := []string{"ingest", "--validate", "--tls-cert-file", certs.ServerCertFile, "--tls-key-file", certs.ServerKeyFile}
	for _, args := range [][]string{ok, ingest} {
		if code, out, errOut := run(t, "", args...); code != 0 {
			t.Errorf("%s: exit %d, want 0:\n%s%s", args, code, out, errOut)
		}
	}
}

// TestSecretsNeverShownByCommands runs `--help` and, where a command has
// it, `--validate` of every command at debug log level with every secret
// set (the SASL and ClickHouse passwords and dedup's ring in the
// environment, SASL on in --config), and finds none of them in the output:
// no default, help text, validation message or log line shows one
// (docs/operations.md, Secrets).
func TestSecretsNeverShownByCommands(t *testing.T) {
	const kafkaPW, chPW = "kafka-pw-Never-Shown-1", "ch-pw-Never-Shown-2"
	ring := "k1 " + strings.Repeat("5ec7e7", 11) // 33 bytes
	t.Setenv(EnvKafkaSASLPassword, kafkaPW)
	t.Setenv(EnvClickHousePassword, chPW)
	t.Setenv("METERLINE_DEDUP_KEYS", ring)
	file := tempFiles(t)
	config := file("meterline.yaml", "kafka_sasl_mechanism: SCRAM-SHA-512\nkafka_sasl_user: u\nlog_level: debug\ninstance_id: node-1\n")
	var cli CLI
	p, err := Parser(&cli, IO{}, func(int) {})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	var walk func(path []string, node *kong.Node)
	walk = func(path []string, node *kong.Node) {
		if len(node.Children) == 0 {
			n++
			runs := [][]string{append(slices.Clone(path), "--help")}
			for _, f := range node.Flags {
				if f.Name == "validate" {
					runs = append(runs, append(slices.Clone(path), "--validate", "--config", config))
				}
			}
			for _, args := range runs {
				_, out, errOut := run(t, "", args...)
				for _, s := range []string{kafkaPW, chPW, strings.Fields(ring)[1][:16]} {
					if strings.Contains(out+errOut, s) {
						t.Errorf("%s shows a secret:\n%s%s", args, out, errOut)
					}
				}
			}
			return
		}
		for _, c := range node.Children {
			walk(append(slices.Clone(path), c.Name), c)
		}
	}
	walk(nil, p.Model.Node)
	if n < 20 {
		t.Fatalf("%d commands run, want every one", n)
	}
}
