package cli

import (
	"errors"
	"fmt"
	"reflect"

	"github.com/alecthomas/kong"
)

// A flagFamily is a set of global flags that only some commands read: the
// ClickHouse flags, the Kafka flags. Every other command's help leaves
// them out, and the accessor of the family (clickHouse(), kafka()) refuses
// to read them in such a command, so that the two cannot drift apart.
type flagFamily struct {
	// users are the commands that read the family's flags.
	users commandSet
	// is reports whether a flag belongs to the family.
	is func(*kong.Flag) bool
}

func newFlagFamily(is func(*kong.Flag) bool, users ...any) flagFamily {
	return flagFamily{users: newCommandSet(users...), is: is}
}

// A commandSet is a set of commands, named by the types of their structs.
type commandSet map[reflect.Type]bool

func newCommandSet(cmds ...any) commandSet {
	set := commandSet{}
	for _, c := range cmds {
		set[reflect.TypeOf(c).Elem()] = true
	}
	return set
}

// clickHouseFlags are --clickhouse and the group "ClickHouse login and
// TLS".
var clickHouseFlags = newFlagFamily(func(f *kong.Flag) bool {
	return f.Name == "clickhouse" || (f.Group != nil && f.Group.Title == clickHouseGroup)
}, &SinkRunCmd{}, &SinkAcceptOffsetsCmd{}, &MigrateCmd{}, &VerifyCmd{}, &RunCmd{}, &DemoCmd{},
	&BenchProduceCmd{}, &BenchDedupCmd{}, &BenchAggregateCmd{}, &BenchSinkCmd{}, &BenchIngestCmd{}, &BenchQueriesCmd{})

// kafkaFlags are --brokers and the groups "Kafka SASL and TLS" and "Topic
// names": the commands that open no Kafka client (version, dedup-key, and
// demo, which runs its own embedded broker) read none of them. migrate
// and verify ask Kafka whether the sink's group has members.
var kafkaFlags = newFlagFamily(func(f *kong.Flag) bool {
	return f.Name == "brokers" || (f.Group != nil && (f.Group.Title == kafkaGroup || f.Group.Title == topicGroup))
}, &ProduceCmd{}, &DedupCmd{}, &AggregateCmd{}, &SinkRunCmd{}, &SinkAcceptOffsetsCmd{}, &MigrateCmd{}, &VerifyCmd{},
	&TopicsCreateCmd{}, &TopicsCheckCmd{}, &LagCmd{}, &RunCmd{}, &IngestCmd{},
	&EntitlementsSetCmd{}, &EntitlementsSetDefaultCmd{}, &EntitlementsSetRatesCmd{}, &EntitlementsDeleteCmd{},
	&EntitlementsGetCmd{}, &EntitlementsListCmd{}, &EntitlementsBalanceCmd{},
	&KeysCreateCmd{}, &KeysListCmd{}, &KeysRevokeCmd{}, &TenantsSetCmd{}, &TenantsListCmd{},
	&BenchProduceCmd{}, &BenchDedupCmd{}, &BenchAggregateCmd{}, &BenchSinkCmd{}, &BenchIngestCmd{}, &BenchQueriesCmd{})

// The help groups of the flag families.
const (
	clickHouseGroup = "ClickHouse login and TLS"
	kafkaGroup      = "Kafka SASL and TLS"
	topicGroup      = "Topic names"
)

// readBy reports whether the command of node n reads the family's flags,
// or, for a command with subcommands (`meterline sink`, whose default is
// `sink run`), one of them does; the root (no command yet) lists them.
func (fam flagFamily) readBy(n *kong.Node) bool { return fam.users.has(n) }

// has reports whether the command of node n is in the set, or, for a
// command with subcommands, one of them is; true for the root (no command
// yet).
func (set commandSet) has(n *kong.Node) bool {
	if n == nil || n.Type != kong.CommandNode || !n.Target.IsValid() {
		return true
	}
	if len(n.Children) > 0 {
		for _, ch := range n.Children {
			if ch.Type == kong.CommandNode && set.has(ch) {
				return true
			}
		}
		return false
	}
	t := n.Target.Type()
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return set[t]
}

// readsClickHouse reports whether the command of node n reads the
// ClickHouse flags (flagFamily.readBy).
func readsClickHouse(n *kong.Node) bool { return clickHouseFlags.readBy(n) }

// readsKafka reports whether the command of node n reads the Kafka flags
// (flagFamily.readBy).
func readsKafka(n *kong.Node) bool { return kafkaFlags.readBy(n) }

// helpPrinter is kong's, without the flags of a family in the help of a
// command that does not read them.
func helpPrinter(options kong.HelpOptions, ctx *kong.Context) error {
	var hidden []*kong.Flag
	defer func() {
		for _, f := range hidden {
			f.Hidden = false
		}
	}()
	for _, f := range ctx.Model.Flags {
		if !f.Hidden && !TakesFlag(ctx.Selected(), f) {
			f.Hidden = true
			hidden = append(hidden, f)
		}
	}
	return kong.DefaultHelpPrinter(options, ctx)
}

// errNoClickHouse and errNoKafka are clickHouse()'s and kafka()'s errors in
// a command that does not declare that it reads their flags (the users of
// clickHouseFlags and kafkaFlags).
var (
	errNoClickHouse = errors.New("internal error: this command does not declare that it reads the ClickHouse flags (clickHouseFlags in internal/cli)")
	errNoKafka      = errors.New("internal error: this command does not declare that it reads the Kafka flags (kafkaFlags in internal/cli)")
)

// checkReadsClickHouse returns errNoClickHouse, wrapped, when g belongs to
// a command that does not read the ClickHouse flags.
func (g *Globals) checkReadsClickHouse() error {
	if g.noClickHouse {
		return fmt.Errorf("clickhouse: %w", errNoClickHouse)
	}
	return nil
}

// checkReadsKafka returns errNoKafka, wrapped, when g belongs to a command
// that does not read the Kafka flags.
func (g *Globals) checkReadsKafka() error {
	if g.noKafka {
		return fmt.Errorf("kafka: %w", errNoKafka)
	}
	return nil
}

// TakesFlag reports whether the command of node n reads the global flag f:
// false for a flag of a family (the ClickHouse flags, the Kafka flags)
// that the command does not read, whose --help leaves it out. The docs
// check uses it to hold the docs' command lines to the flags their
// command reads.
func TakesFlag(n *kong.Node, f *kong.Flag) bool {
	for _, fam := range []flagFamily{clickHouseFlags, kafkaFlags} {
		if fam.is(f) && !fam.readBy(n) {
			return false
		}
	}
	return true
}
