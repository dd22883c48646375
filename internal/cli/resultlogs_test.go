package cli

import (
	"strings"
	"testing"

	"github.com/meterline/meterline/internal/testenv"
)

// TestResultCommandsLogOnlyWhenAsked: a command that prints its result
// for a person (entitlements set, set-default, set-rates, delete) prints
// that and its notes, not also a JSON log line of the same write. The
// info lines come back with --log-level info, given on the command line
// or in the environment.
func TestResultCommandsLogOnlyWhenAsked(t *testing.T) {
	_, brokers := testenv.KFake(t)
	_, ent, _ := entCommands(t, brokers, "logs")
	writes := []struct {
		stdin string
		args  []string
	}{
		{"customer: acme\nplan: free\n", []string{"set"}},
		{"plan: free\n", []string{"set-default"}},
		{"versions:\n- effective_from: 2020-01-01T00:00:00Z\n  rates: {tokens: 15/1000}\n", []string{"set-rates"}},
		{"", []string{"delete", "acme"}},
	}
	for _, w := range writes {
		code, out, errOut := ent(w.stdin, w.args...)
		if code != 0 || !strings.HasPrefix(out, "wrote the ") {
			t.Fatalf("%v: exit %d\n%s%s", w.args, code, out, errOut)
		}
		if strings.Contains(errOut, `{"level":`) {
			t.Errorf("%v: a log line besides the result:\n%s", w.args, errOut)
		}
	}
	const logged = `"msg":"entitlements record written"`
	if code, out, errOut := ent("customer: acme\nplan: free\n", "set", "--log-level", "info"); code != 0 || !strings.Contains(errOut, logged) {
		t.Errorf("set --log-level info: exit %d, want the info line\n%s%s", code, out, errOut)
	}
	t.Setenv("METERLINE_LOG_LEVEL", "info")
	if code, out, errOut := ent("customer: acme\nplan: free\n", "set"); code != 0 || !strings.Contains(errOut, logged) {
		t.Errorf("set with METERLINE_LOG_LEVEL=info: exit %d, want the info line\n%s%s", code, out, errOut)
	}
}

// TestLogLevelPerCommand: without --log-level (on the command line, in
// the environment or in --config), the commands that print a result for
// a person log warnings and errors only, and the stages, the ingest, the
// demo and the benchmarks log from info up as before.
func TestLogLevelPerCommand(t *testing.T) {
	cfg := tempFiles(t)("config.yaml", "log_level: debug\n")
	for _, c := range []struct {
		args []string
		env  string
		want string
	}{
		{[]string{"entitlements", "set"}, "", "warn"},
		{[]string{"entitlements", "get", "acme"}, "", "warn"},
		{[]string{"entitlements", "delete", "acme"}, "", "warn"},
		{[]string{"keys", "create", "--tenant", "t"}, "", "warn"},
		{[]string{"tenants", "list"}, "", "warn"},
		{[]string{"topics", "create"}, "", "warn"},
		{[]string{"topics", "check"}, "", "warn"},
		{[]string{"migrate"}, "", "warn"},
		{[]string{"lag"}, "", "warn"},
		{[]string{"entitlements", "set", "--log-level", "info"}, "", "info"},
		{[]string{"entitlements", "set", "--log-level", "warn"}, "", "warn"},
		{[]string{"entitlements", "set"}, "error", "error"},
		{[]string{"entitlements", "set"}, "info", "info"},
		{[]string{"entitlements", "set", "--config", cfg}, "", "debug"},
		{[]string{"dedup"}, "", "info"},
		{[]string{"aggregate"}, "", "info"},
		{[]string{"sink", "run"}, "", "info"},
		{[]string{"sink"}, "", "info"},
		{[]string{"ingest"}, "", "info"},
		{[]string{"run"}, "", "info"},
		{[]string{"verify"}, "", "info"},
		{[]string{"demo"}, "", "info"},
		{[]string{"version"}, "", "info"},
		{[]string{"dedup", "--log-level", "warn"}, "", "warn"},
	} {
		t.Run(strings.Join(c.args, " ")+" "+c.env, func(t *testing.T) {
			if c.env != "" {
				t.Setenv("METERLINE_LOG_LEVEL", c.env)
			}
			var cli CLI
			parser, err := Parser(&cli, IO{}, func(int) { t.Fatalf("%v: exit", c.args) })
			if err != nil {
				t.Fatal(err)
			}
			kctx, err := parser.Parse(c.args)
			if err != nil {
				t.Fatalf("%v: %v", c.args, err)
			}
			if got := logLevel(kctx, cli.LogLevel); got != c.want {
				t.Errorf("%v (METERLINE_LOG_LEVEL=%q): log level %s, want %s", c.args, c.env, got, c.want)
			}
		})
	}
}
