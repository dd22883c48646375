package cli

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestConfigUnknownKey: a key of the --config file that is no flag of any
// command (a misspelt "brokres") is refused, naming it, rather than
// ignored, which would leave the flag at its default (another broker).
// A key of another command's flag is accepted, so that one file can
// serve every command.
func TestConfigUnknownKey(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	bad := write("bad.yaml", "brokres: [kafka-1:9092]\nlog_level: warn\ntopic_prefx: prod.\n")
	code, _, errOut := run(t, "", "version", "--config", bad)
	if code != 2 || !strings.Contains(errOut, "brokres") || !strings.Contains(errOut, "topic_prefx") {
		t.Errorf("misspelt keys: exit %d, want 2 naming brokres and topic_prefx:\n%s", code, errOut)
	}
	good := write("good.yaml", "brokers: [kafka-1:9092]\naggregate_period: day\nsink_database: m\nwindow: 840h\ningest_addr: 127.0.0.1:1\n")
	if code, _, errOut := run(t, "", "version", "--config", good); code != 0 {
		t.Errorf("keys of other commands' flags: exit %d\n%s", code, errOut)
	}
}

// TestConfigKeysKongIgnores: config and help name flags, but kong reads
// neither from the file (the file is loaded before resolvers run, and help
// acts only on the command line): such a key would pass yet do nothing, so
// it is refused like a misspelt one.
func TestConfigKeysKongIgnores(t *testing.T) {
	for _, body := range []string{"config: other.yaml\n", "help: true\n"} {
		p := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		key := strings.SplitN(body, ":", 2)[0]
		code, _, errOut := run(t, "", "version", "--config", p)
		if code != 2 || !strings.Contains(errOut, key) {
			t.Errorf("key %s: exit %d, want 2 naming it:\n%s", key, code, errOut)
		}
	}
}

// TestSharedConfigMeansTheSameToEach: one config file holding a stage's
// keys (its meters file, the bench's customers, run's ingest switch and
// the ingest's address) serves every command with the same meaning:
// `keys create` and `tenants set` take a key's scope from their own
// flags (allow_customers, allow_meters), never from a stage's meters
// file (which made every key able to write only a meter named
// "meters.yaml") or the bench's number of customers, and the demo's
// ingest address is ingest_addr, as for run.
func TestSharedConfigMeansTheSameToEach(t *testing.T) {
	dir := t.TempDir()
	meters, p := filepath.Join(dir, "meters.yaml"), filepath.Join(dir, "meterline.yaml")
	body := "meters: " + meters + "\ncustomers: 5000\ningest: true\ningest_addr: 127.0.0.1:9999\n"
	for name, b := range map[string]string{meters: "meters: []\n", p: body} {
		if err := os.WriteFile(name, []byte(b), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	k := parseCLI(t, "keys", "create", "--tenant", "acme", "--config", p).Keys.Create
	if len(k.Meters) != 0 || len(k.Customers) != 0 {
		t.Errorf("keys create with a shared config: meters %q, customers %q; want no scope from it", k.Meters, k.Customers)
	}
	if ts := parseCLI(t, "tenants", "set", "acme", "--allow-customers", "acme-*", "--config", p).Tenants.Set; strings.Join(ts.Customers, ",") != "acme-*" {
		t.Errorf("tenants set with a shared config: customers %q, want acme-*", ts.Customers)
	}
	if d := parseCLI(t, "demo", "--config", p).Demo; d.Ingest != "127.0.0.1:9999" {
		t.Errorf("demo with a shared config: ingest address %q, want 127.0.0.1:9999", d.Ingest)
	}
	if r := parseCLI(t, "run", "--config", p).Run; !r.Ingest || r.IngestFlags.Addr != "127.0.0.1:9999" {
		t.Errorf("run with a shared config: ingest %v at %q, want on at 127.0.0.1:9999", r.Ingest, r.IngestFlags.Addr)
	}
}

// TestConfigAliasesAreBounded: a --config file whose aliases name a long
// scalar many times is refused before it is converted to JSON, which
// writes the scalar once per alias (a 105 KB file took 11 s and 5 GB).
func TestConfigAliasesAreBounded(t *testing.T) {
	p := filepath.Join(t.TempDir(), "c.yaml")
	body := "log_level: &l \"" + strings.Repeat("z", 64<<10) + "\"\nx: [" + strings.Repeat("*l, ", 1000) + "*l]\n"
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	code, _, errOut := run(t, "", "version", "--config", p)
	runtime.ReadMemStats(&after)
	if code != 2 || !strings.Contains(errOut, "expands to more than 16 MiB of text") {
		t.Errorf("a config file expanding to 62 MiB: exit %d, want 2 saying so:\n%.300s", code, errOut)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 32<<20 {
		t.Errorf("a config file of %d bytes allocated %d MiB", len(body), alloc>>20)
	}
}
