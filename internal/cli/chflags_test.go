package cli

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/alecthomas/kong"
)

// familyCase is a flag family as the tests see it: flags of it that a
// command's help lists exactly when the command reads the family, the
// commands that must read it and one that must not.
type familyCase struct {
	name    string
	reads   func(*kong.Node) bool
	flags   []string
	readers [][]string
	other   string
}

var familyCases = []familyCase{
	{"ClickHouse", readsClickHouse, []string{"--clickhouse=", "--clickhouse-user=", "--clickhouse-tls-ca-file="},
		[][]string{{"verify"}, {"sink"}}, "lag"},
	{"Kafka", readsKafka, []string{"--brokers=", "--kafka-sasl-user=", "--kafka-tls-ca-file=", "--topic-events="},
		[][]string{{"lag"}, {"migrate"}, {"keys", "list"}, {"entitlements", "get", "x"}}, "dedup-key"},
}

// commandNodes are the nodes of every command and subcommand of meterline.
func commandNodes(t *testing.T) []*kong.Node {
	t.Helper()
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
	return commands
}

// TestFlagFamiliesOnlyWhereRead: a command's --help lists --clickhouse and
// the ClickHouse login and TLS flags when the command reads them
// (clickHouseFlags), or one of its subcommands does (`meterline sink`),
// and only then; so with --brokers, the topic names and the Kafka SASL and
// TLS flags (kafkaFlags). `meterline --help` lists them all, and a
// command's help lists --log-level, which every command reads.
func TestFlagFamiliesOnlyWhereRead(t *testing.T) {
	commands := commandNodes(t)
	for _, fam := range familyCases {
		t.Run(fam.name, func(t *testing.T) {
			users := 0
			for _, node := range commands {
				path := strings.Fields(node.Path())
				code, out, errOut := run(t, "", append(path, "--help")...)
				if code != 0 {
					t.Fatalf("%s --help: exit %d %s", node.Path(), code, errOut)
				}
				reads := fam.reads(node)
				if reads {
					users++
				}
				for _, flag := range fam.flags {
					if got := strings.Contains(out, flag); got != reads {
						t.Errorf("meterline %s --help lists %s: %v; the command reads the %s flags: %v", node.Path(), flag, got, fam.name, reads)
					}
				}
				if !strings.Contains(out, "--log-level=") {
					t.Errorf("meterline %s --help no longer lists --log-level", node.Path())
				}
			}
			if users == 0 || users == len(commands) {
				t.Fatalf("%d of %d commands read the %s flags: the check tells none apart", users, len(commands), fam.name)
			}
			for _, args := range [][]string{{"--help"}, {"sink", "--help"}, {"bench", "--help"}} {
				if _, out, _ := run(t, "", args...); !strings.Contains(out, fam.flags[0]) {
					t.Errorf("meterline %s does not list %s:\n%s", strings.Join(args, " "), fam.flags[0], out)
				}
			}
			// The flags hidden for one command's help are back for the next.
			run(t, "", fam.other, "--help")
			if _, out, _ := run(t, "", append(fam.readers[0], "--help")...); !strings.Contains(out, fam.flags[0]) {
				t.Errorf("%s --help after %s --help lacks %s:\n%s", fam.readers[0][0], fam.other, fam.flags[0], out)
			}
		})
	}
}

// TestFlagFamiliesReadOnlyByUsers: a command that does not declare that it
// reads the ClickHouse flags, or the Kafka flags, cannot read them, so
// that its help, which leaves them out, is true.
func TestFlagFamiliesReadOnlyByUsers(t *testing.T) {
	g := &Globals{ClickHouse: "127.0.0.1:9000", Brokers: []string{"127.0.0.1:9092"}, noClickHouse: true, noKafka: true}
	if _, err := g.clickHouse(); !errors.Is(err, errNoClickHouse) {
		t.Errorf("clickHouse() of a command that does not read the flags: %v, want errNoClickHouse", err)
	}
	if _, err := g.kafka(); !errors.Is(err, errNoKafka) {
		t.Errorf("kafka() of a command that does not read the flags: %v, want errNoKafka", err)
	}
	var c CLI
	k, err := Parser(&c, IO{Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}}, func(int) {})
	if err != nil {
		t.Fatal(err)
	}
	for _, fam := range familyCases {
		kctx, err := k.Parse([]string{fam.other})
		if err != nil {
			t.Fatal(err)
		}
		if fam.reads(kctx.Selected()) {
			t.Errorf("%s reads the %s flags", fam.other, fam.name)
		}
		for _, args := range fam.readers {
			kctx, err = k.Parse(args)
			if err != nil {
				t.Fatal(err)
			}
			if !fam.reads(kctx.Selected()) {
				t.Errorf("meterline %s does not read the %s flags", strings.Join(args, " "), fam.name)
			}
		}
	}
}
