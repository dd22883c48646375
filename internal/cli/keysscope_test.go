package cli

import (
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/meterline/meterline/internal/testenv"
)

// TestKeysCreateRefusesAnEmptyScope: `keys create --allow-customers ”`
// or `--allow-meters ”` (a script's "$CUSTOMER" that came out empty, on
// the command line, in the environment or in --config) is refused and
// makes no key. The parser reads an empty value as an empty list, which
// is also what leaving the flag out gives; without the check such a key
// could write every customer of its tenant, or every meter, where one
// was meant. Leaving the flags out still means all of them.
func TestKeysCreateRefusesAnEmptyScope(t *testing.T) {
	_, brokers := testenv.KFake(t, kfake.SeedTopics(1, "meterline.keys"))
	b := "--brokers=" + strings.Join(brokers, ",")
	if code, out, errOut := run(t, "", "tenants", "set", "acme", "--allow-customers", "acme-*", b); code != 0 {
		t.Fatalf("tenants set: %d %s %s", code, out, errOut)
	}
	file := tempFiles(t)
	for _, c := range []struct {
		name string
		env  string
		args []string
		want string
	}{
		{"customers on the command line", "", []string{"--allow-customers", ""}, "--allow-customers"},
		{"customers as --flag=", "", []string{"--allow-customers="}, "--allow-customers"},
		{"meters on the command line", "", []string{"--allow-customers", "acme-1", "--allow-meters", ""}, "--allow-meters"},
		{"customers in the environment", "METERLINE_ALLOW_CUSTOMERS", nil, "--allow-customers"},
		{"meters in the environment", "METERLINE_ALLOW_METERS", nil, "--allow-meters"},
		{"customers in --config", "", []string{"--config", file("c.yaml", "allow_customers: \"\"\n")}, "--allow-customers"},
		{"meters in --config", "", []string{"--config", file("m.yaml", "allow_meters: []\n")}, "--allow-meters"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.env != "" {
				t.Setenv(c.env, "")
			}
			args := append([]string{"keys", "create", "--tenant", "acme", b}, c.args...)
			code, out, errOut := run(t, "", args...)
			if code == 0 || out != "" || !strings.Contains(errOut, c.want) {
				t.Errorf("keys create %q: exit %d, stdout %q, stderr %s; want it refused naming %s, no token", c.args, code, out, errOut, c.want)
			}
		})
	}
	if code, out, _ := run(t, "", "keys", "list", b); code != 0 || !strings.Contains(out, "0 keys, 1 tenants") {
		t.Errorf("keys list after the refusals: %d\n%s", code, out)
	}
	// Left out, the flags still mean all of the tenant's customers and
	// every meter.
	code, _, errOut := run(t, "", "keys", "create", "--tenant", "acme", b)
	if code != 0 || !strings.Contains(errOut, "customers *; meters any") {
		t.Errorf("keys create without a scope: %d %s", code, errOut)
	}
	// A comma inside a value is escaped (docs/ingest.md); a value on the
	// command line wins over an empty variable.
	t.Setenv("METERLINE_ALLOW_CUSTOMERS", "")
	code, _, errOut = run(t, "", "keys", "create", "--tenant", "acme", "--allow-customers", `acme-a\,b`, b)
	if code != 0 || !strings.Contains(errOut, "customers acme-a,b; meters any") {
		t.Errorf("keys create --allow-customers 'acme-a\\,b': %d %s", code, errOut)
	}
}
