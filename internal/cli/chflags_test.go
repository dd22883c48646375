package cli

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/alecthomas/kong"
)

// TestClickHouseFlagsOnlyWhereRead: a command's --help lists --clickhouse
// and the ClickHouse login and TLS flags when the command reads them
// (clickHouseUsers), or one of its subcommands does (`meterline sink`), and
// only then; `meterline --help` lists them.
func TestClickHouseFlagsOnlyWhereRead(t *testing.T) {
	var c CLI
	k, err := Parser(&c, IO{Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}}, func(int) {})
	if err != nil {
		t.Fatal(err)
	}
	var commands []*kong.Node
	_ = kong.Visit(k.Model, func(n kong.Visitable, next kong.Next) error {
		if node, ok := n.(*kong.Node); ok && node.Type == kong.CommandNode {
			commands = append(commands, node)
		}
		return next(nil)
	})
	users := 0
	for _, node := range commands {
		path := strings.Fields(node.Path())
		code, out, errOut := run(t, "", append(path, "--help")...)
		if code != 0 {
			t.Fatalf("%s --help: exit %d %s", node.Path(), code, errOut)
		}
		reads := readsClickHouse(node)
		if reads {
			users++
		}
		for _, flag := range []string{"--clickhouse=", "--clickhouse-user=", "--clickhouse-tls-ca-file="} {
			if got := strings.Contains(out, flag); got != reads {
				t.Errorf("meterline %s --help lists %s: %v; the command reads the ClickHouse flags: %v", node.Path(), flag, got, reads)
			}
		}
		if !strings.Contains(out, "--brokers=") {
			t.Errorf("meterline %s --help no longer lists --brokers", node.Path())
		}
	}
	if users == 0 || users == len(commands) {
		t.Fatalf("%d commands read the ClickHouse flags: the check tells none apart", users)
	}
	for _, args := range [][]string{{"--help"}, {"sink", "--help"}, {"bench", "--help"}} {
		if _, out, _ := run(t, "", args...); !strings.Contains(out, "--clickhouse=") {
			t.Errorf("meterline %s does not list --clickhouse:\n%s", strings.Join(args, " "), out)
		}
	}
	// The flags hidden for one command's help are back for the next.
	run(t, "", "lag", "--help")
	if _, out, _ := run(t, "", "migrate", "--help"); !strings.Contains(out, "--clickhouse=") {
		t.Errorf("migrate --help after lag --help lacks --clickhouse:\n%s", out)
	}
}

// TestClickHouseFlagsReadOnlyByUsers: a command that does not declare that
// it reads the ClickHouse flags cannot read them, so that its help, which
// leaves them out, is true.
func TestClickHouseFlagsReadOnlyByUsers(t *testing.T) {
	g := &Globals{ClickHouse: "127.0.0.1:9000", noClickHouse: true}
	if _, err := g.clickHouse(); !errors.Is(err, errNoClickHouse) {
		t.Errorf("clickHouse() of a command that does not read the flags: %v, want errNoClickHouse", err)
	}
	var c CLI
	k, err := Parser(&c, IO{Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}}, func(int) {})
	if err != nil {
		t.Fatal(err)
	}
	kctx, err := k.Parse([]string{"lag"})
	if err != nil {
		t.Fatal(err)
	}
	if readsClickHouse(kctx.Selected()) {
		t.Error("lag reads the ClickHouse flags")
	}
	for _, args := range [][]string{{"verify"}, {"sink"}} {
		kctx, err = k.Parse(args)
		if err != nil {
			t.Fatal(err)
		}
		if !readsClickHouse(kctx.Selected()) {
			t.Errorf("meterline %s does not read the ClickHouse flags", args[0])
		}
	}
}
