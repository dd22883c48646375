package cli

import (
	"errors"
	"fmt"
	"reflect"

	"github.com/alecthomas/kong"
)

// clickHouseUsers are the commands that read the ClickHouse flags
// (--clickhouse and the group "ClickHouse login and TLS"). Every other
// command's help leaves them out, and its clickHouse() refuses to read
// them, so that the two cannot drift apart.
var clickHouseUsers = map[reflect.Type]bool{}

func init() {
	for _, c := range []any{&SinkRunCmd{}, &SinkAcceptOffsetsCmd{}, &MigrateCmd{}, &VerifyCmd{}, &RunCmd{}, &DemoCmd{},
		&BenchProduceCmd{}, &BenchDedupCmd{}, &BenchAggregateCmd{}, &BenchSinkCmd{}, &BenchIngestCmd{}, &BenchQueriesCmd{}} {
		clickHouseUsers[reflect.TypeOf(c).Elem()] = true
	}
}

// readsClickHouse reports whether the command of node n reads the
// ClickHouse flags, or, for a command with subcommands (`meterline sink`,
// whose default is `sink run`), one of them does; the root (no command
// yet) lists them.
func readsClickHouse(n *kong.Node) bool {
	if n == nil || n.Type != kong.CommandNode || !n.Target.IsValid() {
		return true
	}
	if len(n.Children) > 0 {
		for _, ch := range n.Children {
			if ch.Type == kong.CommandNode && readsClickHouse(ch) {
				return true
			}
		}
		return false
	}
	t := n.Target.Type()
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return clickHouseUsers[t]
}

// isClickHouseFlag reports whether f is one of the ClickHouse flags.
func isClickHouseFlag(f *kong.Flag) bool {
	return f.Name == "clickhouse" || (f.Group != nil && f.Group.Title == clickHouseGroup)
}

// clickHouseGroup is the help group of the ClickHouse login and TLS flags.
const clickHouseGroup = "ClickHouse login and TLS"

// helpPrinter is kong's, without the ClickHouse flags in the help of a
// command that does not read them.
func helpPrinter(options kong.HelpOptions, ctx *kong.Context) error {
	if readsClickHouse(ctx.Selected()) {
		return kong.DefaultHelpPrinter(options, ctx)
	}
	var hidden []*kong.Flag
	for _, f := range ctx.Model.Flags {
		if isClickHouseFlag(f) && !f.Hidden {
			f.Hidden = true
			hidden = append(hidden, f)
		}
	}
	defer func() {
		for _, f := range hidden {
			f.Hidden = false
		}
	}()
	return kong.DefaultHelpPrinter(options, ctx)
}

// errNoClickHouse is clickHouse()'s error in a command that does not
// declare that it reads the ClickHouse flags (clickHouseUser).
var errNoClickHouse = errors.New("internal error: this command does not declare that it reads the ClickHouse flags (clickHouseUsers in internal/cli)")

// checkReadsClickHouse returns errNoClickHouse, wrapped, when g belongs to
// a command that does not read the ClickHouse flags.
func (g *Globals) checkReadsClickHouse() error {
	if g.noClickHouse {
		return fmt.Errorf("clickhouse: %w", errNoClickHouse)
	}
	return nil
}
