package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"go.uber.org/zap"

	"github.com/meterline/meterline/internal/demo"
	"github.com/meterline/meterline/internal/service"
)

// DemoCmd is `meterline demo`.
type DemoCmd struct {
	Dir      string        `help:"Directory for the embedded broker's data and the Pebble state (its kafka and state directories, emptied at start; a directory whose kafka or state holds files no demo made is refused). One demo at a time: a second demo on it is refused." default:"meterline-demo" type:"path"`
	Duration time.Duration `help:"How long to generate usage; 0 runs until Ctrl-C." default:"0s"`
	Rate     int           `help:"Generated events per second." default:"200"`
	Seed     int64         `help:"Seed of the generator and of the crash point (0: random)."`
	HTTP     string        `help:"Address of the status page (/), /status.json and /metrics while the demo runs; empty: none." default:"${metrics_addr}"`
	Ingest   string        `name:"ingest-addr" help:"Address of the HTTP ingest while the demo runs: a key for meter http_tokens is made and a curl command that uses it printed (its events are reported apart from the generator's); empty: none." default:"${ingest_addr}"`
	Sink     bool          `help:"Also run the sink into the ClickHouse at --clickhouse, check its tables in the report and print a query to try."`
	// SinkDatabase is emptied at the start of every run; the demo refuses
	// a database it did not make.
	SinkDatabase string `help:"ClickHouse database of the demo's sink; dropped and created again, migrated, at the start of each run (a database the demo did not make is refused)." default:"meterline_demo"`
}

// Help is the text of `meterline demo --help` below its summary: which
// connection flags apply to the demo.
func (c *DemoCmd) Help() string {
	return "The demo runs its own embedded Kafka-protocol broker: it takes none of the Kafka flags (--brokers, the topic names, the Kafka SASL and TLS flags). " +
		"--clickhouse and its login and TLS flags apply only with --sink."
}

// Run runs the demo.
func (c *DemoCmd) Run(ctx context.Context, g *Globals, stdio IO) error {
	// Locked before demo.log is made: a second demo on c.Dir must not
	// empty the log of the one that runs.
	lock, err := demo.LockDir(c.Dir)
	if err != nil {
		return err
	}
	defer lock.Close()
	logPath := filepath.Join(c.Dir, "demo.log")
	f, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer f.Close()
	log, err := demoLogger(g.LogLevel, f)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdio.Stderr, "meterline demo: embedded broker and state in %s, logs in %s\n", c.Dir, logPath)
	cfg := demo.Config{Dir: c.Dir, Duration: c.Duration, Rate: c.Rate, Seed: c.Seed, HTTPAddr: c.HTTP, IngestAddr: c.Ingest,
		Out: stdio.Stdout, Live: stdio.StderrIsTerminal, Logger: log, Registry: service.NewRegistry(), Lock: lock}
	if c.Sink {
		srv, err := g.clickHouse()
		if err != nil {
			return err
		}
		cfg.ClickHouseServer, cfg.Database = srv, c.SinkDatabase
		fmt.Fprintf(stdio.Stderr, "meterline demo: sink into ClickHouse %s, database %s\n", g.ClickHouse, c.SinkDatabase)
	}
	ok, err := demo.Run(ctx, cfg)
	if stoppedAtStart(ctx, err) {
		// Stopped before the generator ran (a stop later ends the
		// generator and the demo reports): a clean exit.
		fmt.Fprintf(stdio.Stderr, "meterline demo: stopped before the demo started\n")
		return nil
	}
	if err != nil {
		return err
	}
	if !ok {
		return &ExitError{Code: 1, Silent: true, Err: errors.New("reconciliation mismatch")}
	}
	return nil
}

// demoLogger is the logger of demo.log: every command's (newLogger), which
// writes the characters a terminal acts on as text and samples floods.
func demoLogger(level string, w io.Writer) (*zap.Logger, error) { return newLogger(level, w) }
