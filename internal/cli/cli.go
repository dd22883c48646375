// Package cli implements the meterline command: its subcommands, flags,
// environment variables and config file.
//
// Every flag can be given three ways, in this order of precedence: on the
// command line, as METERLINE_<FLAG> in the environment (--log-level →
// METERLINE_LOG_LEVEL, --topic-events → METERLINE_TOPIC_EVENTS), or in a
// YAML file named by --config whose keys are the flag names with dashes or
// underscores (log_level: debug, brokers: [a:9092, b:9092]).
package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/alecthomas/kong"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/yaml"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/secret"
	"github.com/meterline/meterline/internal/service"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/internal/yamlbound"
	"github.com/meterline/meterline/sink"
)

// Globals are the flags every command takes.
type Globals struct {
	Config     kong.ConfigFlag `help:"YAML file of flag values; keys are flag names (brokers, log_level, topic_events, ...)." placeholder:"FILE"`
	Brokers    []string        `help:"Kafka seed brokers, comma-separated." default:"127.0.0.1:9092"`
	ClickHouse string          `name:"clickhouse" help:"ClickHouse native-protocol address (its tcp_port_secure with --clickhouse-tls)." default:"127.0.0.1:9000"`
	LogLevel   string          `help:"Log level: debug, info, warn or error. The commands that print their result (entitlements, keys, tenants, topics, lag, migrate, sink accept-offsets) log from warn up unless it is given." default:"info" enum:"debug,info,warn,error"`
	Topic      topics.Names    `embed:"" prefix:"topic-" group:"Topic names"`
	// Kafka and ClickHouseAuth secure the connections (security.go).
	Kafka          KafkaFlags      `embed:"" prefix:"kafka-" group:"Kafka SASL and TLS"`
	ClickHouseAuth ClickHouseFlags `embed:"" prefix:"clickhouse-" group:"ClickHouse login and TLS"`

	// kafkaConn and chServer are the connections built by kafka() and
	// clickHouse(), once per command.
	kafkaConn *kafka.Config
	chServer  *sink.Server
	// noClickHouse and noKafka are set for a command that does not read
	// the ClickHouse or the Kafka flags: clickHouse() or kafka() then fails
	// (clickHouseFlags, kafkaFlags).
	noClickHouse, noKafka bool
}

// CLI is the root of the command tree.
type CLI struct {
	Globals

	Demo         DemoCmd         `cmd:"" help:"Run the whole pipeline on an embedded broker with generated usage, and reconcile the result."`
	Produce      ProduceCmd      `cmd:"" help:"Send newline-delimited JSON usage events to Kafka."`
	Dedup        DedupCmd        `cmd:"" help:"Run the dedup stage: drop duplicate copies exactly once."`
	DedupKey     DedupKeyCmd     `cmd:"" name:"dedup-key" help:"Make a key for the signatures of dedup's re-route and tick headers."`
	Aggregate    AggregateCmd    `cmd:"" help:"Run the aggregator: usage per billing period, FINAL revisions, adjustments."`
	Sink         SinkCmd         `cmd:"" help:"Run the sink: write the topics into ClickHouse exactly once."`
	Migrate      MigrateCmd      `cmd:"" help:"Apply the pending ClickHouse migrations (idempotent)."`
	Verify       VerifyCmd       `cmd:"" help:"Compare the analyst tables with the ledger per month and rebuild a month that differs; --backfill fills new ones."`
	Topics       TopicsCmd       `cmd:"" help:"Create the Kafka topics, or check them for drift."`
	Entitlements EntitlementsCmd `cmd:"" help:"Read and write customers' plans, caps and credit grants, the default plan and the rate card."`
	Lag          LagCmd          `cmd:"" help:"Consumer lag per group and partition, in records and seconds."`
	Run          RunCmd          `cmd:"" help:"Run every stage in one process behind one metrics and health server."`
	Ingest       IngestCmd       `cmd:"" help:"Serve the HTTP ingest: OpenMeter's event API (POST /api/v1/events) and Meterline's JSON (POST /v1/events)."`
	Keys         KeysCmd         `cmd:"" help:"API keys of the HTTP ingest: create, list, revoke."`
	Tenants      TenantsCmd      `cmd:"" help:"Tenants of the HTTP ingest: named sets of customers."`
	Bench        BenchCmd        `cmd:"" help:"End-to-end benchmarks against a real broker."`
	Version      VersionCmd      `cmd:"" help:"Print the version."`
}

// IO is where a command reads and writes. Tests replace it.
type IO struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	// StderrIsTerminal turns on live progress displays.
	StderrIsTerminal bool
	// StdinIsTerminal says that a person types what Stdin reads: a
	// command that reads a document from it says so first.
	StdinIsTerminal bool
}

// ExitError carries a process exit status. Its message has already been
// shown to the user when Silent is set.
type ExitError struct {
	Code   int
	Err    error
	Silent bool
}

func (e *ExitError) Error() string { return e.Err.Error() }
func (e *ExitError) Unwrap() error { return e.Err }

// maxConfigBytes bounds the --config file: a file of flag values takes a
// few KB, and /dev/zero, or a multi-GB file given by mistake, would
// otherwise be read whole into memory.
const maxConfigBytes = 1 << 20

func yamlLoader(r io.Reader) (kong.Resolver, error) {
	b, err := yamlbound.ReadAll(r, maxConfigBytes)
	if err != nil {
		// kong opens the file and passes it on: name it, with the flag.
		name := "--config"
		if f, ok := r.(interface{ Name() string }); ok {
			name += " " + f.Name()
		}
		if tl := (*yamlbound.TooLargeError)(nil); errors.As(err, &tl) {
			return nil, fmt.Errorf("%s: the file is %w", name, err)
		}
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if err := yamlbound.Check(b); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	j, err := yaml.YAMLToJSON(b)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if bytes.Equal(bytes.TrimSpace(j), []byte("null")) {
		j = []byte("{}")
	}
	file, err := kong.JSON(bytes.NewReader(j))
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(j, &top); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	// kong applies environment variables before resolvers, so the file
	// would win over the environment; step aside for any flag whose
	// variable is set, giving flag > env > file > default.
	var res kong.ResolverFunc = func(ctx *kong.Context, parent *kong.Path, flag *kong.Flag) (any, error) {
		for _, env := range flag.Envs {
			if _, ok := os.LookupEnv(env); ok {
				return nil, nil
			}
		}
		v, err := file.Resolve(ctx, parent, flag)
		if _, isString := v.(string); err == nil && v != nil && !isString && flag.Tag.Has("secretfile") {
			// The parser's error would quote the value: a password of
			// digits, which YAML reads as a number, set where the name
			// of its file belongs.
			// The parser names the flag before this.
			return nil, fmt.Errorf("in --config, a %s where the name of a file belongs: its value is not shown, as it may be a secret given there; give the file's name (quoted if YAML would read it as no string)",
				yamlKind(v))
		}
		return v, err
	}
	return configResolver{ResolverFunc: res, keys: slices.Sorted(maps.Keys(top))}, nil
}

// yamlKind names the kind of v, a value of the --config file that is no
// string, without showing it.
func yamlKind(v any) string {
	switch v.(type) {
	case float64:
		return "number"
	case bool:
		return "boolean"
	case []any:
		return "list"
	case map[string]any:
		return "map"
	}
	return "value of another kind"
}

// configResolver is the --config file's resolver, which refuses a key that
// names no flag of any command: a misspelt key would otherwise leave its
// flag at the default. One file may hold the flags of every command.
type configResolver struct {
	kong.ResolverFunc
	keys []string
}

// Validate reports every key of the file that is no flag's name, as kong's
// JSON resolver reads names (log_level or logLevel for --log-level).
func (r configResolver) Validate(app *kong.Application) error {
	known := map[string]bool{}
	_ = kong.Visit(app, func(n kong.Visitable, next kong.Next) error {
		// --config and --help are flags kong does not take from the
		// file: the file is loaded first, and help acts on the command
		// line only. Such a key would be accepted and do nothing.
		if f, ok := n.(*kong.Flag); ok && f.Name != "help" && f.Target.Type() != reflect.TypeFor[kong.ConfigFlag]() {
			known[strings.ReplaceAll(f.Name, "-", "_")] = true
			parts := strings.Split(f.Name, "-")
			for i := 1; i < len(parts); i++ {
				if parts[i] != "" {
					parts[i] = strings.ToUpper(parts[i][:1]) + parts[i][1:]
				}
			}
			known[strings.Join(parts, "")] = true
		}
		return next(nil)
	})
	var unknown []string
	for _, k := range r.keys {
		if !known[k] {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		return fmt.Errorf("config: no command has a flag for the key(s) %s (keys are flag names with _ for -: log_level, topic_prefix, aggregate_period)", strings.Join(unknown, ", "))
	}
	return nil
}

// Parser builds the kong parser. Exported for tests that check command
// lines (docker-compose) against the real flag set.
func Parser(cli *CLI, stdio IO, exit func(int)) (*kong.Kong, error) {
	return kong.New(cli,
		kong.Name("meterline"),
		kong.Description("Meterline counts every usage event exactly once, for usage-based billing."),
		kong.UsageOnError(),
		kong.DefaultEnvars("METERLINE"),
		kong.Configuration(yamlLoader),
		kong.Writers(stdio.Stdout, stdio.Stderr),
		kong.Exit(exit),
		kong.ConfigureHelp(kong.HelpOptions{Compact: true, FlagsLast: true}),
		kong.Help(helpPrinter),
		defaultVars(),
	)
}

type exitCode int

// Main runs the command line args and returns the exit status.
func Main(ctx context.Context, args []string, stdio IO) (code int) {
	var cli CLI
	defer func() {
		if r := recover(); r != nil {
			if c, ok := r.(exitCode); ok {
				code = int(c)
				return
			}
			panic(r)
		}
	}()
	parser, err := Parser(&cli, stdio, func(c int) { panic(exitCode(c)) })
	if err != nil {
		fmt.Fprintf(stdio.Stderr, "meterline: %v\n", err)
		return 2
	}
	kctx, err := parser.Parse(args)
	if err != nil {
		fmt.Fprintf(stdio.Stderr, "meterline: %s\n", hideSecretArgs(err.Error(), parser, args))
		if pe := (*kong.ParseError)(nil); errors.As(err, &pe) && pe.Context != nil {
			_ = pe.Context.PrintUsage(true)
		}
		return 2
	}
	logger, err := newLogger(logLevel(kctx, cli.LogLevel), stdio.Stderr)
	if err != nil {
		fmt.Fprintf(stdio.Stderr, "meterline: %v\n", err)
		return 2
	}
	defer func() { _ = logger.Sync() }()
	// A stop can take seconds (docs/operations.md, Running the stages):
	// say when it was asked for, so that a slow one is not silent until
	// the stages report they stopped.
	// Main's caller reads stderr once Main returns: a line being written
	// then is waited for.
	stopLogged := make(chan struct{})
	stopLog := context.AfterFunc(ctx, func() {
		defer close(stopLogged)
		logger.Info("stop requested: stopping (a second signal exits at once)", zap.String("command", kctx.Command()))
	})
	defer func() {
		if !stopLog() {
			<-stopLogged
		}
	}()
	if err := errors.Join(refuseZeroFlags(kctx), refuseEmptyLists(kctx), refuseEmptyPaths(kctx), refuseIngestFlagsAlone(kctx)); err != nil {
		fmt.Fprintf(stdio.Stderr, "meterline %s: %v\n", kctx.Command(), err)
		return 2
	}
	warnReadableSecrets(kctx, logger)
	cli.noClickHouse = !readsClickHouse(kctx.Selected())
	cli.noKafka = !readsKafka(kctx.Selected())
	kctx.BindTo(ctx, (*context.Context)(nil))
	kctx.Bind(&cli.Globals, stdio, logger)
	if err := kctx.Run(); err != nil {
		var ee *ExitError
		if errors.As(err, &ee) {
			if !ee.Silent {
				fmt.Fprintf(stdio.Stderr, "meterline %s: %v\n", kctx.Command(), ee.Err)
			}
			return ee.Code
		}
		fmt.Fprintf(stdio.Stderr, "meterline %s: %v\n", kctx.Command(), err)
		return 1
	}
	return 0
}

// refuseZeroFlags returns an error naming each numeric flag of the
// command that is 0 (set so on the command line, in the environment or in
// --config) although its default is not, unless the flag is tagged zero
// (its help says what 0 means). The stages' Configs read a zero field as
// "the default" (EnsureDefaults), so such a 0 would run silently with the
// default: --standby-max-warmups 0 with 2 copies, --ingest-read-timeout 0
// with 30s.
func refuseZeroFlags(kctx *kong.Context) error {
	var errs []error
	for _, f := range kctx.Flags() {
		if f.Tag.Has("zero") || !f.Target.IsValid() || !f.Target.IsZero() || !numericNonZero(f.Target.Type(), f.Default) {
			continue
		}
		def := f.Default
		if m := negativeMeaning.FindString(f.Help); m != "" {
			def += "; " + m
		}
		errs = append(errs, fmt.Errorf("--%s must not be 0: leave the flag out for its default (%s)", f.Name, def))
	}
	return errors.Join(errs...)
}

// refuseEmptyLists returns an error naming each list flag tagged
// nonempty that is set, on the command line, in the environment or in
// --config, to nothing: the parser reads "" as an empty list, which is
// what leaving the flag out gives, and for these that is the widest
// choice (the tag's value says what): `keys create --allow-customers
// "$CUSTOMER"` with an empty variable would make a key for every customer
// of its tenant.
func refuseEmptyLists(kctx *kong.Context) error {
	given := givenFlags(kctx)
	var errs []error
	for _, f := range kctx.Flags() {
		if !f.Tag.Has("nonempty") || !f.Target.IsValid() || f.Target.Kind() != reflect.Slice || f.Target.Len() > 0 {
			continue
		}
		if given(f) {
			errs = append(errs, fmt.Errorf("--%s is set but empty: name at least one, or leave the flag out for %s", f.Name, f.Tag.Get("nonempty")))
		}
	}
	return errors.Join(errs...)
}

// givenFlags reports whether a flag of the command is set on the command
// line, in --config or in the environment (rather than left to its
// default).
func givenFlags(kctx *kong.Context) func(*kong.Flag) bool {
	given := map[string]bool{}
	for _, p := range kctx.Path {
		// A flag from the command line or from --config (a resolver).
		if p.Flag != nil {
			given[p.Flag.Name] = true
		}
	}
	return func(f *kong.Flag) bool {
		for _, env := range f.Envs {
			if _, ok := os.LookupEnv(env); ok {
				return true
			}
		}
		return given[f.Name]
	}
}

// refuseIngestFlagsAlone returns an error naming the --ingest-* flags
// given to `meterline run` without --ingest: the HTTP ingest is off
// without it, and an operator who set --ingest-addr would get no ingest
// and no word of it.
func refuseIngestFlagsAlone(kctx *kong.Context) error {
	if kctx.Command() != "run" {
		return nil
	}
	given := givenFlags(kctx)
	var names []string
	for _, f := range kctx.Flags() {
		if f.Name == "ingest" && f.Target.IsValid() && f.Target.Kind() == reflect.Bool && f.Target.Bool() {
			return nil
		}
		if strings.HasPrefix(f.Name, "ingest-") && given(f) {
			names = append(names, "--"+f.Name)
		}
	}
	if len(names) == 0 {
		return nil
	}
	return fmt.Errorf("%s given without --ingest, which serves the HTTP ingest (off without it): add --ingest, or leave the --ingest-* flags out", strings.Join(names, ", "))
}

// refuseEmptyPaths returns an error naming each path flag of the command
// that is "" (set so on the command line, in the environment or in
// --config) although its default is not: the parser leaves such a flag
// empty rather than give it its default, and --state-dir "" would put the
// stages' state in the working directory, wherever the process started.
func refuseEmptyPaths(kctx *kong.Context) error {
	var errs []error
	for _, f := range kctx.Flags() {
		if f.Tag.Type != "path" || f.Default == "" || !f.Target.IsValid() || f.Target.Kind() != reflect.String || f.Target.String() != "" {
			continue
		}
		errs = append(errs, fmt.Errorf("--%s is set but empty: name a directory (. for the working directory), or leave the flag out for its default (%s)", f.Name, f.Default))
	}
	return errors.Join(errs...)
}

// negativeMeaning is what a flag's help says a negative value means
// ("-1: no bound", "-1s: no bound", "-1: no budget"), repeated by
// refuseZeroFlags' error.
var negativeMeaning = regexp.MustCompile(`-1s?: no [a-z]+`)

// numericNonZero reports whether t is a number or a time.Duration and def,
// a flag's default, a value of it other than 0.
func numericNonZero(t reflect.Type, def string) bool {
	if t == reflect.TypeFor[time.Duration]() {
		d, err := time.ParseDuration(def)
		return err == nil && d != 0
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Float32, reflect.Float64:
		v, err := strconv.ParseFloat(def, 64)
		return err == nil && v != 0
	}
	return false
}

// hideSecretArgs returns msg, a parse error, or in its place one that does
// not quote it when msg quotes the value of a secret file's flag (tagged
// secretfile) given on the command line. The parser refuses a value that
// starts with "-" as a flag's next argument, and its error quotes it
// whole: a PEM key or a password set where the name of its file belongs.
func hideSecretArgs(msg string, k *kong.Kong, args []string) string {
	secretFlags, flags := map[string]bool{}, map[string]bool{}
	_ = kong.Visit(k.Model, func(n kong.Visitable, next kong.Next) error {
		if f, ok := n.(*kong.Flag); ok {
			flags["--"+f.Name] = true
			secretFlags["--"+f.Name] = f.Tag.Has("secretfile")
		}
		return next(nil)
	})
	for i, a := range args {
		if a == "--" {
			break
		}
		flag, v, ok := strings.Cut(a, "=")
		if !ok && secretFlags[a] && i+1 < len(args) {
			v = args[i+1]
		}
		if name, _, _ := strings.Cut(v, "="); !secretFlags[flag] || v == "" || flags[name] {
			continue // a flag after one whose value was left out is no value
		}
		// A short value is looked for quoted only: unquoted, it could be
		// any word of the message.
		if strings.Contains(msg, strconv.Quote(v)) || (len(v) >= 8 && strings.Contains(msg, v)) {
			return fmt.Sprintf("%s: its value (%d bytes) is not shown, as it may be a secret given where the name of its file belongs; give the file's name (as %s=FILE if it starts with \"-\")", flag, len(v), flag)
		}
	}
	return msg
}

// warnReadableSecrets logs a warning for each secret file the command
// reads (a flag tagged secretfile, from the command line, the environment
// or --config) that every user of the machine may read: once per file,
// naming the file, its mode and the flags that name it, never its
// content. The command still runs: Kubernetes mounts a secret with mode
// 0644 unless its volume sets defaultMode, and refusing that would stop
// every such deployment. A value that names no regular file (missing, or
// a secret given where its file's name belongs) draws no warning, so a
// secret is never shown here; reading it reports it. A flag of a family
// the command does not read (the ClickHouse password file of a command
// that never connects to ClickHouse, set in the environment for every
// command) draws no warning: the command leaves that file alone.
func warnReadableSecrets(kctx *kong.Context, log *zap.Logger) {
	var files []string
	flags := map[string][]string{}
	for _, f := range kctx.Flags() {
		if !f.Tag.Has("secretfile") || !TakesFlag(kctx.Selected(), f) {
			continue
		}
		path, _ := kctx.FlagValue(f).(string)
		if path == "" {
			continue
		}
		if _, seen := flags[path]; !seen {
			files = append(files, path)
		}
		flags[path] = append(flags[path], "--"+f.Name)
	}
	for _, path := range files {
		if mode, ok := secret.ReadableByOthers(path); ok {
			log.Warn("secret file is readable by every user of this machine: chmod 600 it, or in Kubernetes give its secret volume defaultMode: 0400 and the pod an fsGroup (docs/operations.md, Secrets)",
				zap.String("file", path), zap.String("mode", fmt.Sprintf("%04o", mode)), zap.Strings("flags", flags[path]))
		}
	}
}

// OSIO returns the process's standard streams.
func OSIO() IO {
	return IO{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, StderrIsTerminal: isTerminal(os.Stderr), StdinIsTerminal: isTerminal(os.Stdin)}
}

// isTerminal reports whether f is a terminal: whether it has a
// terminal's settings. /dev/null, a character device too, has none.
func isTerminal(f *os.File) bool {
	rc, err := f.SyscallConn()
	if err != nil {
		return false
	}
	var ioErr error
	if err := rc.Control(func(fd uintptr) { _, ioErr = unix.IoctlGetTermios(int(fd), ioctlReadTermios) }); err != nil {
		return false
	}
	return ioErr == nil
}

// resultCommands are the commands that print their result for a person,
// on stdout (and their notes on stderr): their info lines would only say
// it again as JSON (`entitlements set`'s "entitlements record written",
// `migrate`'s "migration applied"). They log from warn up unless
// --log-level is given.
var resultCommands = newCommandSet(
	&EntitlementsSetCmd{}, &EntitlementsSetDefaultCmd{}, &EntitlementsSetRatesCmd{}, &EntitlementsDeleteCmd{},
	&EntitlementsGetCmd{}, &EntitlementsListCmd{}, &EntitlementsBalanceCmd{},
	&KeysCreateCmd{}, &KeysListCmd{}, &KeysRevokeCmd{}, &TenantsSetCmd{}, &TenantsListCmd{},
	&TopicsCreateCmd{}, &TopicsCheckCmd{}, &LagCmd{}, &MigrateCmd{}, &SinkAcceptOffsetsCmd{})

// logLevel is the command's log level: level, the value of --log-level,
// or warn for one of resultCommands when --log-level is given nowhere
// (command line, environment, --config).
func logLevel(kctx *kong.Context, level string) string {
	if !resultCommands.has(kctx.Selected()) {
		return level
	}
	for _, p := range kctx.Path {
		// A flag from the command line or from --config (a resolver).
		if p.Flag != nil && p.Flag.Name == "log-level" {
			return level
		}
	}
	for _, f := range kctx.Flags() {
		if f.Name != "log-level" {
			continue
		}
		for _, env := range f.Envs {
			if _, ok := os.LookupEnv(env); ok {
				return level
			}
		}
	}
	return zapcore.WarnLevel.String()
}

func newLogger(level string, w io.Writer) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	enc := zap.NewProductionEncoderConfig()
	enc.EncodeTime = zapcore.ISO8601TimeEncoder
	// The stages log from many goroutines, and w need not be safe for
	// concurrent writes (a test's buffer): zapcore.Lock serializes them.
	return zap.New(sampled(textSafe{zapcore.NewCore(zapcore.NewJSONEncoder(enc), zapcore.Lock(zapcore.AddSync(w)), lvl)})), nil
}

// The logger's sampling: of the entries with one message and level, the
// first logFirst in a second are written, and the rest of that second are
// left out. A stage logs every record it rejects, and how many it rejects
// is up to the producers: without sampling, a flood of bad input would
// flood the logs, and so would a share of it (zap.NewProduction's one in
// 100 after the first), which grows with the flood: the lines a second
// of one message are bounded instead, whatever the flood's rate. Every
// rejected record is still counted by its metric
// and written to usage.rejected; what sampling leaves out is counted by
// service.LogEntriesDropped.
const logFirst = 100

func sampled(core zapcore.Core) zapcore.Core {
	// thereafter 0: none after the first logFirst of a second.
	return zapcore.NewSamplerWithOptions(core, time.Second, logFirst, 0,
		zapcore.SamplerHook(func(_ zapcore.Entry, d zapcore.SamplingDecision) {
			if d&zapcore.LogDropped != 0 {
				service.LogEntriesDropped.Inc()
			}
		}))
}

// VersionCmd prints the module version.
type VersionCmd struct{}

// Run prints the version.
func (VersionCmd) Run(stdio IO) error {
	fmt.Fprintln(stdio.Stdout, "meterline", service.BuildOf())
	return nil
}
