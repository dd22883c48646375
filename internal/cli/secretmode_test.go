package cli

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/meterline/meterline/internal/testenv"
)

// TestWarnsOfSecretFilesOthersCanRead: at start, a command logs one
// warning for each secret file that every user of the machine may read
// (o+r: Kubernetes mounts secrets 0644 unless told otherwise), naming the
// file, its mode and the flag or flags that name it, never its content;
// it still runs. A file of mode 0600 or 0640 draws none, and neither do
// non-secret files (a certificate) nor a secret given where the name of
// its file belongs. The flags here are every secret file flag of
// `meterline run --ingest`, one through its environment variable.
func TestWarnsOfSecretFilesOthersCanRead(t *testing.T) {
	file := tempFiles(t)
	chmod := func(p string, mode os.FileMode) string {
		t.Helper()
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const kafkaPW, chPW = "kafka-Secret-1", "ch-Secret-2"
	// The ingest's certificate and key load (--validate loads them).
	certs := testenv.NewCerts(t)
	keyPEM, err := os.ReadFile(certs.ServerKeyFile)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, err := os.ReadFile(certs.ServerCertFile)
	if err != nil {
		t.Fatal(err)
	}
	keyMaterial := strings.Split(string(keyPEM), "\n")[1]
	ring, err := os.ReadFile(testenv.DedupKeysFile(t))
	if err != nil {
		t.Fatal(err)
	}
	kafkaPWFile := chmod(file("kafka.pw", kafkaPW+"\n"), 0o644)
	chPWFile := chmod(file("ch.pw", chPW+"\n"), 0o600)
	keys := chmod(file("dedup.keys", string(ring)), 0o604)
	key := chmod(file("ingest-key.pem", string(keyPEM)), 0o640)
	cert := chmod(file("ingest.pem", string(certPEM)), 0o644)
	t.Setenv("METERLINE_KAFKA_SASL_PASSWORD_FILE", kafkaPWFile)
	args := []string{"run", "--validate", "--instance-id", "a", "--ingest",
		"--kafka-sasl-mechanism", "SCRAM-SHA-512", "--kafka-sasl-user", "u",
		"--clickhouse-password-file", chPWFile, "--dedup-keys-file", keys,
		"--ingest-tls-cert-file", cert, "--ingest-tls-key-file", key}
	code, out, errOut := run(t, "", args...)
	if code != 0 || !strings.Contains(out, "configuration ok") {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	type warning struct {
		Level, Msg, File, Mode string
		Flags                  []string
	}
	var got []warning
	for _, l := range strings.Split(strings.TrimSpace(errOut), "\n") {
		var w warning
		if err := json.Unmarshal([]byte(l), &w); err != nil || !strings.Contains(w.Msg, "secret file") {
			continue
		}
		got = append(got, w)
	}
	want := []warning{
		{Level: "warn", File: kafkaPWFile, Mode: "0644", Flags: []string{"--kafka-sasl-password-file"}},
		{Level: "warn", File: keys, Mode: "0604", Flags: []string{"--dedup-keys-file"}},
	}
	slices.SortFunc(got, func(a, b warning) int { return strings.Compare(a.File, b.File) })
	slices.SortFunc(want, func(a, b warning) int { return strings.Compare(a.File, b.File) })
	if len(got) != len(want) {
		t.Fatalf("%d warnings about secret files, want %d:\n%s", len(got), len(want), errOut)
	}
	for i, w := range want {
		g := got[i]
		if g.Level != w.Level || g.File != w.File || g.Mode != w.Mode || !slices.Equal(g.Flags, w.Flags) ||
			!strings.Contains(g.Msg, "chmod 600") || !strings.Contains(g.Msg, "defaultMode") {
			t.Errorf("warning %+v, want %+v and a message that says how to fix it", g, w)
		}
	}
	for _, s := range []string{kafkaPW, chPW, keyMaterial, strings.Fields(string(ring))[1]} {
		if strings.Contains(out+errOut, s) {
			t.Errorf("the output shows a secret's content %q:\n%s", s, errOut)
		}
	}

	// One file under two flags: one warning naming both. A secret given
	// as a file's name: none. The warning comes before the command runs.
	chmod(chPWFile, 0o644)
	code, out, errOut = run(t, "", "sink", "run", "--validate", "--clickhouse-password-file", chPWFile,
		"--kafka-sasl-mechanism", "SCRAM-SHA-512", "--kafka-sasl-user", "u",
		"--kafka-sasl-password-file", chPWFile, "--clickhouse-tls-key-file", chPW)
	if strings.Count(errOut, "secret file") != 1 || !strings.Contains(errOut, `"flags":["--kafka-sasl-password-file","--clickhouse-password-file"]`) {
		t.Errorf("one file under two flags: exit %d, want one warning naming both flags\n%s%s", code, out, errOut)
	}
}

// TestSecretFileWarningsOnlyForFilesTheCommandReads: a secret file's flag
// set for every command (in the environment, in --config) draws a warning
// only from a command that reads it. `version` reads no secret file;
// `entitlements set` reads the Kafka flags, not the ClickHouse ones.
func TestSecretFileWarningsOnlyForFilesTheCommandReads(t *testing.T) {
	file := tempFiles(t)
	kafkaPWFile, chPWFile := file("kafka.pw", "k\n"), file("ch.pw", "c\n")
	for _, p := range []string{kafkaPWFile, chPWFile} {
		if err := os.Chmod(p, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("METERLINE_CLICKHOUSE_PASSWORD_FILE", chPWFile)
	t.Setenv("METERLINE_KAFKA_SASL_PASSWORD_FILE", kafkaPWFile)
	code, out, errOut := run(t, "", "version")
	if code != 0 || strings.Contains(errOut, "secret file") {
		t.Errorf("version: exit %d, want no warning about a secret file it does not read\n%s%s", code, out, errOut)
	}
	doc := file("acme.yaml", "customer: acme\nplan: free\n")
	code, out, errOut = run(t, "", "entitlements", "set", "--validate", "-f", doc)
	if code != 0 || strings.Count(errOut, "secret file") != 1 || !strings.Contains(errOut, kafkaPWFile) || strings.Contains(errOut, chPWFile) {
		t.Errorf("entitlements set: exit %d, want one warning, about the Kafka password file only\n%s%s", code, out, errOut)
	}
}
