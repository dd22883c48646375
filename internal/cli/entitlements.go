package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kzap"
	"go.uber.org/zap"

	"github.com/meterline/meterline/aggregator"
	"github.com/meterline/meterline/dedup"
	"github.com/meterline/meterline/entitlements"
	"github.com/meterline/meterline/internal/clip"
	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/internal/yamlbound"
	"github.com/meterline/meterline/schemas"
)

// EntitlementsCmd is `meterline entitlements`: it reads and writes the
// records of usage.entitlements (docs/entitlements.md).
type EntitlementsCmd struct {
	Set        EntitlementsSetCmd        `cmd:"" help:"Write a customer's entitlements (plan, caps, credit grants, overdraft) from a YAML document; one with the version get prints is written only while that record is still the customer's latest."`
	Get        EntitlementsGetCmd        `cmd:"" help:"Print a customer's entitlements, the default plan (--default) or the rate card (--rates)."`
	List       EntitlementsListCmd       `cmd:"" help:"Print the entitlements of every customer that has a record."`
	Delete     EntitlementsDeleteCmd     `cmd:"" help:"Delete a customer's entitlements: from when the broker accepts the delete, the default plan applies to its events. Refused for a customer with no record (--force writes it anyway)."`
	SetDefault EntitlementsSetDefaultCmd `cmd:"" name:"set-default" help:"Write the default plan, for customers with no record, to every partition."`
	SetRates   EntitlementsSetRatesCmd   `cmd:"" name:"set-rates" help:"Write the rate card (every version) to every partition."`
	Balance    EntitlementsBalanceCmd    `cmd:"" help:"Print a customer's latest balance from usage.balances: usage against each cap in the period, credits left per grant, the overdraft."`
}

// The defaults of the entitlements commands' flags: the writer's
// transactional ID (docs/operations.md's ACLs name it) and the deadline of
// a command.
const (
	defaultEntitlementsTransactionalID = "meterline-entitlements"
	defaultEntitlementsTimeout         = time.Minute
)

// entWriter are the flags of every command that writes usage.entitlements.
type entWriter struct {
	TransactionalID string        `name:"transactional-id" help:"Transactional ID of the writer: a second writer with the same ID fences the first, and a crashed one's open transaction is aborted by the next." default:"${entitlements_transactional_id}"`
	Timeout         time.Duration `help:"Deadline for the whole command." default:"${entitlements_timeout}"`
}

// entWrite are the flags of the commands that write a document.
type entWrite struct {
	File      string `short:"f" help:"YAML (or JSON) document; - reads standard input." default:"-" placeholder:"PATH"`
	Meters    string `help:"Meters file: refuse caps and rates on meters that are not SUM or COUNT." placeholder:"PATH"`
	Validate  bool   `help:"Check the document, print every problem, and exit without writing."`
	entWriter `embed:""`
}

// entRead are the flags of the commands that read.
type entRead struct {
	Output  string        `short:"o" help:"Output format." default:"yaml" enum:"yaml,json"`
	Timeout time.Duration `help:"Deadline for the whole command." default:"${entitlements_timeout}"`
}

// EntitlementsSetCmd is `meterline entitlements set`.
type EntitlementsSetCmd struct {
	Customer string `arg:"" optional:"" help:"The customer; default: the document's customer field."`
	entWrite `embed:""`
}

// EntitlementsSetDefaultCmd is `meterline entitlements set-default`.
type EntitlementsSetDefaultCmd struct {
	entWrite `embed:""`
}

// EntitlementsSetRatesCmd is `meterline entitlements set-rates`.
type EntitlementsSetRatesCmd struct {
	entWrite `embed:""`
}

// EntitlementsDeleteCmd is `meterline entitlements delete`.
type EntitlementsDeleteCmd struct {
	Customer      string `arg:"" help:"The customer."`
	Force         bool   `help:"Write the delete although the customer has no record, or its record is deleted already (without it, delete reads the customer's record as get does: it refuses a customer with none, and writes nothing for one deleted already)."`
	ExpectVersion string `name:"expect-version" help:"Write the delete only if the customer's latest record is still this version (the version get prints, such as 3/1842); else refuse, writing nothing, exit status 1." placeholder:"PARTITION/OFFSET"`
	entWriter     `embed:""`
}

// EntitlementsGetCmd is `meterline entitlements get`.
type EntitlementsGetCmd struct {
	Customer string `arg:"" optional:"" help:"The customer."`
	Default  bool   `help:"Print the default plan."`
	Rates    bool   `help:"Print the rate card."`
	entRead  `embed:""`
}

// EntitlementsListCmd is `meterline entitlements list`.
type EntitlementsListCmd struct {
	entRead `embed:""`
}

// EntitlementsBalanceCmd is `meterline entitlements balance`.
type EntitlementsBalanceCmd struct {
	Customer string `arg:"" help:"The customer."`
	entRead  `embed:""`
}

// maxDocumentBytes bounds the document a write command reads: far more
// than a record at its limits (entitlements.MaxGrants, MaxRates) takes.
const maxDocumentBytes = 16 << 20

// readingTerminal is said on stderr before a document is read from
// standard input that is a terminal, where the command would otherwise
// wait in silence for the user to type or paste it.
const readingTerminal = "reading the document from standard input (end it with Ctrl-D); or give a file with -f FILE"

// read reads the document, refusing one larger than maxDocumentBytes
// (cut there, it could read as another, shorter document).
func (c *entWrite) read(stdio IO) ([]byte, error) {
	r, name := stdio.Stdin, "standard input"
	if c.File == "-" && stdio.StdinIsTerminal {
		fmt.Fprintln(stdio.Stderr, readingTerminal)
	}
	if c.File != "-" {
		f, err := os.Open(c.File)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r, name = f, c.File
	}
	b, err := yamlbound.ReadAll(r, maxDocumentBytes)
	if tl := (*yamlbound.TooLargeError)(nil); errors.As(err, &tl) {
		err = fmt.Errorf("the document on %s is %w", name, err)
	}
	return b, err
}

func (c *entWrite) meters() (entitlements.Meters, error) {
	if c.Meters == "" {
		return nil, nil
	}
	cat, err := aggregator.LoadMeters(c.Meters)
	if err != nil {
		return nil, err
	}
	return func(m string) (string, bool) {
		d, ok := cat.Lookup(m)
		return string(d.Aggregation), ok
	}, nil
}

// invalidDocument reports a document's problems, one a line, and exits 1.
func invalidDocument(stdio IO, what string, err error) error {
	fmt.Fprintf(stdio.Stderr, "%s is not valid:\n", what)
	for _, l := range strings.Split(err.Error(), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			fmt.Fprintf(stdio.Stderr, "  %s\n", l)
		}
	}
	return &ExitError{Code: 1, Silent: true, Err: fmt.Errorf("%s is not valid", what)}
}

// load reads the document with parse and the meters file: a document
// that does not parse, or a file that cannot be read, ends the command.
func (c *entWrite) load(stdio IO, parse func([]byte) error) (entitlements.Meters, error) {
	b, err := c.read(stdio)
	if err != nil {
		return nil, &ExitError{Code: 2, Err: err}
	}
	if err := parse(b); err != nil {
		what := "the document in " + c.File
		if c.File == "-" {
			what = "the document on standard input"
			if len(bytes.TrimSpace(b)) == 0 {
				err = fmt.Errorf("%w\nstandard input carried nothing: give the document with -f FILE, or pipe it in", err)
			}
		}
		return nil, invalidDocument(stdio, what, err)
	}
	meters, err := c.meters()
	if err != nil {
		return nil, &ExitError{Code: 2, Err: err}
	}
	return meters, nil
}

// finish validates (the record in hand) and writes, or with --validate
// only says so.
func (c *entWrite) finish(ctx context.Context, g *Globals, stdio IO, log *zap.Logger, what string, key []byte, m schemas.Message, every bool, meters entitlements.Meters, expect *entExpect) error {
	noteUndeclared(stdio, meters, m)
	if e, ok := m.(*schemas.Entitlements); ok {
		notePastGrants(stdio, e, time.Now().UnixMilli())
	}
	if c.Validate {
		fmt.Fprintf(stdio.Stdout, "the %s is valid\n", what)
		return nil
	}
	if e, ok := m.(*schemas.Entitlements); ok {
		warnPast(stdio, e.EffectiveFrom)
	}
	return c.write(ctx, g, stdio, log, what, key, m, every, expect)
}

// Run writes a customer's entitlements.
func (c *EntitlementsSetCmd) Run(ctx context.Context, g *Globals, stdio IO, log *zap.Logger) error {
	var d *entitlements.Document
	meters, err := c.load(stdio, func(b []byte) (err error) { d, err = entitlements.ParseDocument(b); return err })
	if err != nil {
		return err
	}
	customer := c.Customer
	if customer == "" {
		customer = d.Customer
	}
	if customer == "" {
		return invalidDocument(stdio, "the document", errors.New("customer: name the customer, as an argument or in the document"))
	}
	if err := checkCustomer(customer); err != nil {
		return invalidDocument(stdio, "the document", err)
	}
	what := "entitlements record of " + customer
	e, err := d.Record(customer, meters)
	if err == nil {
		err = checkAppliesFrom(d, e, time.Now().UnixMilli())
	}
	if err != nil {
		return invalidDocument(stdio, "the "+what, err)
	}
	noteDefaultOverdraft(stdio, d)
	var expect *entExpect
	if d.Version != "" {
		v, _ := entitlements.ParseRecordVersion(d.Version) // checked by Record
		expect = &entExpect{version: v, again: "get it again, re-apply your edit, and set it"}
	}
	return c.finish(ctx, g, stdio, log, what, schemas.CustomerKey(customer), e, false, meters, expect)
}

// noteDefaultOverdraft says on stderr that a document without an
// overdraft gets the default, allowed without limit (docs/entitlements.md,
// Credits): a plan of caps alone is still charged for the meters the rate
// card prices.
func noteDefaultOverdraft(stdio IO, d *entitlements.Document) {
	// An empty overdraft ({}) gives neither a policy nor a limit: the
	// default.
	if o := d.Overdraft; (o == nil || o.Policy == "" && o.Limit == entitlements.Int{}) && !d.Unmetered {
		fmt.Fprintf(stdio.Stderr, "note: no overdraft given: the default applies, policy allow without limit: "+
			"what its grants cannot pay of a meter the rate card prices is overdrawn, to be billed; "+
			"overdraft: {policy: deny} refuses it (no_credit)\n")
	}
}

// checkAppliesFrom refuses a document whose applies_from, which get
// prints and set does not read, says the record applies from a time
// after now other than its effective_from: get never prints such a one
// (a record in effect applies from its broker time, a scheduled one from
// its effective_from), so it was written to schedule the record, which
// would apply from when it is written. One that is not a time is refused
// too.
func checkAppliesFrom(d *entitlements.Document, e *schemas.Entitlements, now int64) error {
	if d.AppliesFrom == "" {
		return nil
	}
	at, err := entitlements.ParseTime(d.AppliesFrom)
	switch {
	case err != nil:
		return fmt.Errorf("applies_from: %w (it is printed by get and not read: effective_from schedules a record)", err)
	case at > now && at != e.EffectiveFrom:
		return fmt.Errorf("applies_from: %s is printed by get and not read: the record would apply from when it is written; "+
			"to schedule it, write effective_from: %q (and leave applies_from out)", d.AppliesFrom, d.AppliesFrom)
	}
	return nil
}

// checkCustomer refuses a customer_id that no record can have (and no
// event: ingest refuses it too).
func checkCustomer(customer string) error {
	if fe := schemas.CheckText("customer", customer, true); fe != nil || len(customer) > schemas.MaxIdentityFieldBytes {
		return fmt.Errorf("customer: %q is not a valid customer_id", clip.To(customer, clip.Echo))
	}
	return nil
}

// Run writes the default plan.
func (c *EntitlementsSetDefaultCmd) Run(ctx context.Context, g *Globals, stdio IO, log *zap.Logger) error {
	var d *entitlements.Document
	meters, err := c.load(stdio, func(b []byte) (err error) { d, err = entitlements.ParseDocument(b); return err })
	if err != nil {
		return err
	}
	e, err := d.Record("", meters)
	if err == nil {
		err = checkAppliesFrom(d, e, time.Now().UnixMilli())
	}
	if err != nil {
		return invalidDocument(stdio, "the default plan", err)
	}
	noteDefaultOverdraft(stdio, d)
	return c.finish(ctx, g, stdio, log, "default plan", []byte(schemas.DefaultPlanKey), e, true, meters, nil)
}

// Run writes the rate card.
func (c *EntitlementsSetRatesCmd) Run(ctx context.Context, g *Globals, stdio IO, log *zap.Logger) error {
	var d *entitlements.RatesDocument
	meters, err := c.load(stdio, func(b []byte) (err error) { d, err = entitlements.ParseRatesDocument(b); return err })
	if err != nil {
		return err
	}
	card, err := d.Card(meters)
	if err == nil {
		// The aggregator refuses a card whose versions in effect from
		// its broker time on pass its state's bound, whatever it read
		// before: refused here rather than written and then refused.
		if err = entitlements.CheckCardBytes(card, time.Now().UnixMilli()); err != nil {
			err = fmt.Errorf("versions: %w, counting the versions in effect from now on: the aggregator refuses such a card (give fewer rates, or shorter meter names)", err)
		}
	}
	if err != nil {
		return invalidDocument(stdio, "the rate card", err)
	}
	if !c.Validate {
		if len(card.Versions) > 0 && card.Versions[0].EffectiveFrom > time.Now().UnixMilli() {
			fmt.Fprintf(stdio.Stderr, "note: the first version starts at %s: until then, events are priced by no rate (free)\n",
				entitlements.FormatTime(card.Versions[0].EffectiveFrom))
		}
		fmt.Fprintln(stdio.Stderr, "note: a version can price only events from when this card is written on; time before that keeps the rates of the card in effect then")
	}
	return c.finish(ctx, g, stdio, log, "rate card", []byte(schemas.RateCardKey), card, true, meters, nil)
}

// noteUndeclared names on stderr the meters of m's caps and rates that the
// meters file (meters, nil: none given) does not declare: valid, for an
// undeclared meter counts as SUM, but most likely a misspelt name, whose
// cap or rate never meets an event of the meter meant.
func noteUndeclared(stdio IO, meters entitlements.Meters, m schemas.Message) {
	if meters == nil {
		return
	}
	var names []string
	seen := map[string]bool{}
	check := func(meter string) {
		if _, declared := meters(meter); !declared && !seen[meter] {
			seen[meter] = true
			names = append(names, clip.To(meter, clip.Echo))
		}
	}
	switch m := m.(type) {
	case *schemas.Entitlements:
		for _, c := range m.Caps {
			check(c.Meter)
		}
	case *schemas.RateCard:
		for _, v := range m.Versions {
			for _, r := range v.Rates {
				check(r.Meter)
			}
		}
	}
	if len(names) == 0 {
		return
	}
	if len(names) > 10 {
		names = append(names[:10], fmt.Sprintf("and %d more", len(names)-10))
	}
	fmt.Fprintf(stdio.Stderr, "note: the meters file does not declare %s: an undeclared meter counts as SUM "+
		"(rejected as unknown_meter with --strict-meters); check the names\n", strings.Join(names, ", "))
}

// notePastGrants names on stderr the grants of e whose expires_at is
// already past (a mistyped year, most likely): such a grant pays only for
// late events, whose event_time is before its expiry, and for none once
// the aggregator's --window has passed since (docs/entitlements.md,
// Credits).
func notePastGrants(stdio IO, e *schemas.Entitlements, now int64) {
	for _, g := range e.Grants {
		if g.ExpiresAt != 0 && g.ExpiresAt <= now {
			fmt.Fprintf(stdio.Stderr, "note: grant %s expires at %s, in the past: it pays only for late events, whose event_time is "+
				"before then, and for none once the aggregator's --window (%d days by default) has passed since\n",
				clip.To(g.ID, clip.Echo), entitlements.FormatTime(g.ExpiresAt), dedup.DefaultWindow/(24*time.Hour))
		}
	}
}

func warnPast(stdio IO, effectiveFrom int64) {
	if effectiveFrom != 0 && effectiveFrom < time.Now().UnixMilli() {
		fmt.Fprintf(stdio.Stderr, "note: effective_from %s is in the past: the record applies from when the broker accepts it\n",
			entitlements.FormatTime(effectiveFrom))
	}
}

// Run deletes a customer's entitlements.
func (c *EntitlementsDeleteCmd) Run(ctx context.Context, g *Globals, stdio IO, log *zap.Logger) error {
	if c.Customer == "" {
		return &ExitError{Code: 2, Err: errors.New("name the customer")}
	}
	if err := checkCustomer(c.Customer); err != nil {
		return &ExitError{Code: 1, Err: err}
	}
	var expect *entExpect
	if c.ExpectVersion != "" {
		v, err := entitlements.ParseRecordVersion(c.ExpectVersion)
		if err != nil {
			return &ExitError{Code: 2, Err: fmt.Errorf("--expect-version: %w", err)}
		}
		expect = &entExpect{version: v, again: "get it again, and delete it with the version get prints if it is still to go"}
	}
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	// With a version, the check after the producer's InitProducerID
	// (write) reads the record: the customer's having none, or a delete,
	// is a change.
	if !c.Force && expect == nil {
		latest, n, err := readEntitlements(ctx, g)
		if err != nil {
			return err
		}
		done, err := recordToDelete(latest, n, c.Customer)
		if err != nil {
			return &ExitError{Code: 1, Err: err}
		}
		if done != "" {
			// A delete run again (a retried script) has nothing to do.
			fmt.Fprintln(stdio.Stderr, "note: "+done)
			return nil
		}
	}
	return c.write(ctx, g, stdio, log, "delete of the entitlements record of "+c.Customer, schemas.CustomerKey(c.Customer), nil, false, expect)
}

// recordToDelete returns "" and nil when customer has a record that a
// delete would end, as get reads it: one on the customer's partition (in
// effect or scheduled), or one on another partition that the aggregator
// moves there and applies: any, when the customer's partition has none,
// else one that reached the topic after the delete there. When its record is deleted
// already it says so in done, and delete writes nothing and succeeds (a
// delete run again); when it has none, err says why delete writes nothing:
// most likely a misspelt customer_id.
func recordToDelete(latest map[string]map[int32]entRecord, n int32, customer string) (done string, err error) {
	key := schemas.CustomerKey(customer)
	recs := latest[string(key)]
	r, ok := recs[schemas.Partition(key, n)]
	if !ok {
		for _, r := range recs {
			if r.value != nil {
				return "", nil
			}
		}
		return "", fmt.Errorf("%s has no entitlements record: nothing was written; check the customer_id (`meterline entitlements list` prints those with a record), or give --force to write the delete anyway",
			clip.To(customer, clip.Echo))
	}
	if r.value == nil {
		for q, m := range recs {
			if q != r.partition && m.value != nil && m.origin.After(r.origin) {
				// A record on another partition after the delete: the
				// aggregator moves it, and its copy applies after the
				// delete (aggregator.DecideRecord) unless a later delete
				// precedes it.
				return "", nil
			}
		}
		return fmt.Sprintf("the entitlements of %s were deleted already, at %s: nothing was written",
			clip.To(customer, clip.Echo), entitlements.FormatTime(r.written)), nil
	}
	return "", nil
}

// entACLNeeded wraps err, the brokers' refusal of a request of conn's
// principal, with the ACL it lacks: op (Read or Write) on topic, or Write
// on the transactional ID txnID; else it returns err. A refusal that
// names the Describe it lacks already (topics' "may not describe") is
// left as it is.
func entACLNeeded(conn kafka.Config, op, topic, txnID string, err error) error {
	const see = "docs/operations.md, Security and ACLs"
	switch {
	case errors.Is(err, kerr.TransactionalIDAuthorizationFailed):
		return fmt.Errorf("%s needs Write on transactional ID %s (%s): %w", conn.Principal(), txnID, see, err)
	case errors.Is(err, kerr.TopicAuthorizationFailed) && !strings.Contains(err.Error(), " may not describe "):
		return fmt.Errorf("%s needs %s on topic %s (%s): %w", conn.Principal(), op, topic, see, err)
	}
	return err
}

// write produces one record under key: to the key's canonical partition,
// or with every, to every partition. m nil is a tombstone. The records go
// in one transaction of an idempotent producer (acks=all): every partition
// gets the record or none does, and a retry never writes it twice. With
// expect (a customer's record only), it writes only while the customer's
// latest record is expect.version (checkVersion).
func (c *entWriter) write(ctx context.Context, g *Globals, stdio IO, log *zap.Logger, what string, key []byte, m schemas.Message, every bool, expect *entExpect) error {
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	topic := g.Topic.EntitlementsTopic()
	// Until the records are produced, a failure leaves the topic as it was.
	notWritten := func(err error) error {
		return fmt.Errorf("write the %s to %s on %s: %w (nothing was written)", what, topic, strings.Join(g.Brokers, ","), err)
	}
	kc, err := g.connectKafka(ctx)
	if err != nil {
		return notWritten(err)
	}
	counts, err := topics.PartitionCounts(ctx, kc, topic)
	if err != nil {
		return notWritten(err)
	}
	n := counts[topic]
	var value []byte
	if m != nil {
		if value, err = schemas.Encode(m); err != nil {
			return notWritten(err)
		}
	}
	parts := []int32{schemas.Partition(key, n)}
	if every {
		parts = parts[:0]
		for p := int32(0); p < n; p++ {
			parts = append(parts, p)
		}
	}
	cl, err := kafka.NewClient(kc, kgo.TransactionalID(c.TransactionalID),
		kgo.TransactionTimeout(10*time.Second), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.WithLogger(kzap.New(log.Named("kgo"), kzap.Level(kgo.LogLevelWarn))))
	if err != nil {
		return notWritten(err)
	}
	defer cl.Close()
	// The version is checked only once this producer has its epoch of the
	// transactional ID (InitProducerID: franz-go sends it in
	// BeginTransaction at the latest; ProducerID makes it explicit). The
	// InitProducerID of a writer with the same ID (the default,
	// meterline-entitlements) returns only when the transaction of the
	// writer before it is committed or aborted, and fences that writer:
	// its records and commit are refused from then on. So a writer that
	// initialised before this one either committed before this one's
	// InitProducerID returned, and the read below (read_committed, to the
	// end) sees its record and refuses a stale version, or it is fenced
	// and writes nothing; one that initialises after this one and before
	// its commit fences it, and this write fails with nothing written.
	// Checked before the init, two writers could both read the same
	// version and both write (TestEntitlementsVersionCheckThenFenced). The
	// read comes before the first record: read_committed, it would wait on
	// this producer's own open transaction. Writers with another
	// transactional ID are not fenced (docs/entitlements.md, Two writers
	// of one record).
	if _, _, err := cl.ProducerID(ctx); err != nil {
		return notWritten(fmt.Errorf("init producer id: %w", entACLNeeded(kc, "Write", topic, c.TransactionalID, err)))
	}
	if err := cl.BeginTransaction(); err != nil {
		return notWritten(fmt.Errorf("begin transaction: %w", err))
	}
	if expect != nil {
		if err := checkVersion(ctx, g, key, *expect); err != nil {
			return err
		}
	}
	if entBeforeProduce != nil {
		entBeforeProduce()
	}
	recs := make([]*kgo.Record, len(parts))
	for i, p := range parts {
		recs[i] = &kgo.Record{Topic: topic, Partition: p, Key: key, Value: value}
	}
	res := cl.ProduceSync(ctx, recs...)
	perr := res.FirstErr()
	commit := kgo.TryCommit
	if perr != nil {
		commit = kgo.TryAbort
	}
	if err := cl.EndTransaction(ctx, commit); err != nil && perr == nil {
		// The coordinator may have committed (a broker that stalled, or
		// stopped, after it had the EndTxn): the outcome is unknown.
		return fmt.Errorf("write the %s to %s: commit: %w; the outcome is unknown: the record may have been written. "+
			"Check with `%s` once Kafka answers, before running this command again",
			what, topic, err, checkCommand(key))
	}
	if perr != nil {
		// No record was written, so none can be committed: aborted, or
		// left open for the coordinator to abort at the transaction
		// timeout.
		if errors.Is(perr, kerr.InvalidProducerEpoch) || errors.Is(perr, kerr.ProducerFenced) {
			return fmt.Errorf("write the %s to %s: %w (nothing was written): a writer with the same transactional ID (%s) started after this one and fenced it; see what it wrote with `%s` before writing again",
				what, topic, perr, c.TransactionalID, checkCommand(key))
		}
		return fmt.Errorf("write the %s to %s: %w (nothing was written)", what, topic, entACLNeeded(kc, "Write", topic, c.TransactionalID, perr))
	}
	for _, r := range res {
		log.Info("entitlements record written", zap.String("what", what), zap.String("topic", topic),
			zap.Int32("partition", r.Record.Partition), zap.Int64("offset", r.Record.Offset))
	}
	if every {
		fmt.Fprintf(stdio.Stdout, "wrote the %s to all %d partitions of %s\n", what, n, topic)
	} else {
		r := res[0].Record
		fmt.Fprintf(stdio.Stdout, "wrote the %s to %s partition %d offset %d\n", what, topic, r.Partition, r.Offset)
	}
	// Entitlements are off by default in the aggregator: say where the
	// record takes effect, so that a cap is not believed enforced where it
	// is not.
	fmt.Fprintln(stdio.Stderr, entitlementsOffHint)
	return nil
}

// entExpect is the condition of a conditional write: the version of the
// customer's record that the writer read, and what to tell it to do when
// the record changed since.
type entExpect struct {
	version entitlements.RecordVersion
	again   string
}

// entBeforeProduce, when not nil, is called by write after the version
// check and before the record is produced: tests start another writer
// there.
var entBeforeProduce func()

// versionOf is the version of a record: its partition and offset. It is
// the record get shows, as readEntitlements keeps it: a copy of the
// aggregator's that DecideRecord skips (a restated record, a misrouted
// record re-produced again) does not change it; one it applies (a
// misrouted record moved to the customer's partition) is a new version.
func versionOf(r entRecord) entitlements.RecordVersion {
	return entitlements.RecordVersion{Partition: r.partition, Offset: r.offset}
}

// checkVersion returns nil when the latest record of the customer of key
// on its partition, read as get reads it, is expect.version; else an
// error, exit status 1, that says what it is now: another version, a
// delete, or none.
func checkVersion(ctx context.Context, g *Globals, key []byte, expect entExpect) error {
	latest, n, err := readEntitlements(ctx, g)
	if err != nil {
		return fmt.Errorf("read the record to check its version %s: %w (nothing was written)", expect.version, err)
	}
	customer, _ := schemas.ParseCustomerKey(key)
	r, ok := latest[string(key)][schemas.Partition(key, n)]
	var now string
	switch {
	case ok && versionOf(r) == expect.version:
		return nil
	case !ok:
		now = "none: it has no record"
	case r.value == nil:
		now = fmt.Sprintf("%s, a delete written at %s", versionOf(r), entitlements.FormatTime(r.written))
	default:
		now = versionOf(r).String()
	}
	return &ExitError{Code: 1, Err: fmt.Errorf("%s changed since you read it (version %s, now %s): nothing was written; %s",
		clip.To(customer, clip.Echo), expect.version, now, expect.again)}
}

// checkCommand is the command that shows the record under key.
func checkCommand(key []byte) string {
	switch string(key) {
	case schemas.DefaultPlanKey:
		return "meterline entitlements get --default"
	case schemas.RateCardKey:
		return "meterline entitlements get --rates"
	}
	if c, err := schemas.ParseCustomerKey(key); err == nil {
		return "meterline entitlements get " + c
	}
	return "meterline entitlements list"
}

// entitlementsOffHint is what every write of `meterline entitlements`
// prints on stderr.
const entitlementsOffHint = "note: caps and credits are decided only by an aggregator that runs with --entitlements " +
	"(meterline aggregate --entitlements, meterline run --aggregate-entitlements); it is off by default"

// entRecord is the latest record of a key, as read from the topic.
type entRecord struct {
	partition int32
	offset    int64
	written   int64
	value     []byte // nil: tombstone
	rec       *entitlements.Record
	origin    aggregator.RecordOrigin
	// versions are the records of the key on the partition that still
	// apply over arrival time, as the aggregator's Timeline keeps them
	// (a record replaces those effective at or after its own time): the
	// one in effect now, then those scheduled, the last this record.
	// Not kept for the rate card, whose versions are by event time.
	versions []entVersion
}

// entVersion is a record of entRecord.versions, from its effective time.
type entVersion struct {
	from int64
	r    entRecord // without versions; value nil: a delete
}

// withVersion returns versions with r added, effective from from, as the
// aggregator's Timeline.Set does, and those no longer in effect at now
// dropped.
func withVersion(versions []entVersion, from int64, r entRecord, now int64) []entVersion {
	r.versions = nil
	i := sort.Search(len(versions), func(i int) bool { return versions[i].from >= from })
	vs := append(versions[:i:i], entVersion{from: from, r: r})
	j := sort.Search(len(vs), func(i int) bool { return vs[i].from > now }) - 1
	return vs[max(j, 0):]
}

// scheduledNote says, when r applies only from a time after now (its
// effective_from), what applies until then: the key's earlier record in
// effect now, else fallback. It is "" for a record in effect.
func scheduledNote(r entRecord, now int64, fallback string) string {
	n := len(r.versions)
	if n == 0 || r.versions[n-1].from <= now {
		return ""
	}
	what, between := fallback, n-1
	if v := r.versions[0]; v.from <= now {
		between--
		if v.r.value != nil && v.r.rec != nil && v.r.rec.Entitlements != nil {
			what = fmt.Sprintf("the record written at %s (plan %q) applies", entitlements.FormatTime(v.r.written),
				clip.To(v.r.rec.Entitlements.Plan, clip.Echo))
		}
	}
	note := fmt.Sprintf("scheduled from %s: until then, %s", entitlements.FormatTime(r.versions[n-1].from), what)
	if between > 0 {
		note += fmt.Sprintf(", then %d other scheduled record(s)", between)
	}
	return note
}

// entDocument is the document get and list print of r, a record of
// entitlements (a customer's or the default plan) read by
// readEntitlements, with the time it applies from. An effective_from
// before that (raised to the record's broker time) is named on stderr,
// after who (a customer's name and ": ", or "").
func entDocument(stdio IO, who string, r entRecord) *entitlements.Document {
	d := entitlements.DocumentOf(r.rec.Entitlements, r.written)
	if r.rec.Key.Reserved == "" {
		d.Version = versionOf(r).String()
	}
	if n := len(r.versions); n > 0 {
		from := r.versions[n-1].from
		d.AppliesFrom = entitlements.FormatTime(from)
		if e := r.rec.Entitlements.EffectiveFrom; e != 0 && e < from {
			fmt.Fprintf(stdio.Stderr, "note: %seffective_from %s is earlier than the record's broker time: the record applies from %s (applies_from)\n",
				who, entitlements.FormatTime(e), d.AppliesFrom)
		}
	}
	noteSetRefuses(stdio, who, d, func(b []byte) error {
		back, err := entitlements.ParseDocument(b)
		if err != nil {
			return err
		}
		e, err := back.Record(r.rec.Entitlements.CustomerID, nil)
		if err != nil {
			return err
		}
		return checkAppliesFrom(back, e, time.Now().UnixMilli())
	})
	return d
}

// noteSetRefuses says on stderr, after who, when set (set-default,
// set-rates) refuses the document get prints, as printed, naming each
// field set refuses and why (check, set's reading of the document, says
// so): a record written straight to the topic may hold values that the
// aggregator accepts and a document cannot, a time before 2000-01-01 or
// after 9999 in UTC (printed with a five-digit year, which RFC 3339 has
// not).
func noteSetRefuses(stdio IO, who string, doc any, check func([]byte) error) {
	b, err := json.Marshal(doc)
	if err == nil {
		err = check(b)
	}
	if err == nil {
		return
	}
	fmt.Fprintf(stdio.Stderr, "note: %sset refuses this document as printed (the record was written straight to the topic, "+
		"with values the aggregator takes and a document cannot hold); change these fields before setting it:\n", who)
	for _, l := range strings.Split(err.Error(), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			fmt.Fprintf(stdio.Stderr, "  %s%s\n", who, l)
		}
	}
}

// readEntitlements reads the committed records of the entitlements topic
// and keeps, per key and partition, the record the aggregator has in
// effect once it has read them all, by its rules (aggregator
// entRecords):
//   - a record entitlements.ParseRecord refuses (undecodable, invalid) is
//     rejected: the record before it stays in effect. After one of a
//     customer on its canonical partition, or of a reserved key (the
//     default plan, the rate card), the aggregator writes the record in
//     effect again (restated, a copy marked with its origin), which
//     DecideRecord then skips, for it is the record kept.
//   - a tick applies nothing.
//   - a record is decided by aggregator.DecideRecord: a copy the
//     aggregator re-produced or restated whose original reached the topic
//     no later than the record kept is skipped (a misrouted record read
//     again from the start is re-produced again, after newer records of
//     its key).
//   - the delete the aggregator writes on a wrong partition after a
//     record it moved from there (aggregator.IsMovedMark) is skipped: the
//     note that the partition holds a record of the customer stays until
//     compaction removes both.
//
// Not reproduced: a record the aggregator's Ledger refuses for the state
// it has (entitlements.ErrTooManyVersions, entitlements.ErrTooManyGrants)
// is shown.
func readEntitlements(ctx context.Context, g *Globals) (map[string]map[int32]entRecord, int32, error) {
	kc, err := g.connectKafka(ctx)
	if err != nil {
		return nil, 0, err
	}
	topic := g.Topic.EntitlementsTopic()
	counts, err := topics.PartitionCounts(ctx, kc, topic)
	if err != nil {
		return nil, 0, err
	}
	recs, err := topics.ReadCommittedAs(ctx, kc, topic, nil)
	if err != nil {
		return nil, 0, fmt.Errorf("read %s: %w", topic, entACLNeeded(kc, "Read", topic, "", err))
	}
	latest := map[string]map[int32]entRecord{}
	readTo := map[int32]int64{} // per partition, the latest broker time read
	now := time.Now().UnixMilli()
	for _, r := range recs {
		written := r.Timestamp.UnixMilli()
		// A record applies from its broker time on this partition, or
		// the latest one read before it (a broker clock that stepped
		// back), or its effective_from if later.
		from := max(written, readTo[r.Partition])
		readTo[r.Partition] = from
		rec, err := entitlements.ParseRecord(r.Key, r.Value, written)
		if err != nil || rec.IsTick() {
			continue
		}
		if rec.Key.Reserved == "" && aggregator.IsMovedMark(r) && schemas.Partition(r.Key, counts[topic]) != r.Partition {
			continue // the aggregator's delete after the record it moved
		}
		k := string(r.Key)
		if latest[k] == nil {
			latest[k] = map[int32]entRecord{}
		}
		cur, ok := latest[k][r.Partition]
		o, apply, _ := aggregator.DecideRecord(r, cur.origin, cur.value, ok)
		if !apply {
			continue
		}
		if _, copied := aggregator.OriginOf(r); copied {
			// A copy's original was written then (a claimed time after
			// the copy's own is not shown).
			written = min(o.Arrival, written)
		}
		e := entRecord{partition: r.Partition, offset: r.Offset, written: written, value: r.Value, rec: rec, origin: o}
		if rec.Key.Reserved != schemas.RateCardKey {
			if rec.Entitlements != nil {
				from = max(from, rec.Entitlements.EffectiveFrom)
			}
			e.versions = withVersion(latest[k][r.Partition].versions, from, e, now)
		}
		latest[k][r.Partition] = e
	}
	return latest, counts[topic], nil
}

// print writes one document, or with list a list of them (a YAML stream,
// a JSON array).
func (c *entRead) print(stdio IO, list bool, docs ...any) error {
	if c.Output == "json" {
		var v any = docs
		if !list {
			v = docs[0]
		}
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(stdio.Stdout, "%s\n", b)
		return err
	}
	for i, d := range docs {
		b, err := entYAML(d)
		if err != nil {
			return err
		}
		if i > 0 {
			fmt.Fprintln(stdio.Stdout, "---")
		}
		if _, err := stdio.Stdout.Write(b); err != nil {
			return err
		}
	}
	return nil
}

// Run prints one record.
func (c *EntitlementsGetCmd) Run(ctx context.Context, g *Globals, stdio IO) error {
	if n := boolCount(c.Customer != "", c.Default, c.Rates); n != 1 {
		return &ExitError{Code: 2, Err: errors.New("name a customer, or give --default or --rates")}
	}
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	latest, n, err := readEntitlements(ctx, g)
	if err != nil {
		return err
	}
	if c.Customer != "" {
		key := schemas.CustomerKey(c.Customer)
		p := schemas.Partition(key, n)
		for q, r := range latest[string(key)] {
			if q != p {
				fmt.Fprintf(stdio.Stderr, "note: partition %d holds a record of %s at offset %d, not its partition %d (a client with another partitioner): the aggregator moves it to partition %d\n",
					q, c.Customer, r.offset, p, p)
			}
		}
		r, ok := latest[string(key)][p]
		switch {
		case !ok:
			return &ExitError{Code: 1, Err: fmt.Errorf("%s has no entitlements: the default plan applies", c.Customer)}
		case r.value == nil:
			return &ExitError{Code: 1, Err: fmt.Errorf("the entitlements of %s were deleted at %s: the default plan applies",
				c.Customer, entitlements.FormatTime(r.written))}
		}
		if note := scheduledNote(r, time.Now().UnixMilli(), "the default plan applies"); note != "" {
			fmt.Fprintf(stdio.Stderr, "note: %s\n", note)
		}
		return c.print(stdio, false, entDocument(stdio, "", r))
	}
	key := schemas.RateCardKey
	if c.Default {
		key = schemas.DefaultPlanKey
	}
	r, err := samePerPartition(latest[key], n, key)
	if err != nil {
		return &ExitError{Code: 1, Err: err}
	}
	if c.Default {
		if note := scheduledNote(r, time.Now().UnixMilli(), "no default plan applies"); note != "" {
			fmt.Fprintf(stdio.Stderr, "note: %s\n", note)
		}
		return c.print(stdio, false, entDocument(stdio, "", r))
	}
	d := entitlements.RatesDocumentOf(r.rec.RateCard, r.written)
	noteSetRefuses(stdio, "", d, func(b []byte) error {
		back, err := entitlements.ParseRatesDocument(b)
		if err == nil {
			_, err = back.Card(nil)
		}
		return err
	})
	return c.print(stdio, false, d)
}

// samePerPartition returns the record of a key written to every partition,
// or an error when a partition lacks it or holds another value: a writer
// that did not reach every partition, which the next set-default or
// set-rates repairs.
func samePerPartition(recs map[int32]entRecord, n int32, key string) (entRecord, error) {
	what := map[string]string{schemas.DefaultPlanKey: "default plan", schemas.RateCardKey: "rate card"}[key]
	if len(recs) == 0 {
		return entRecord{}, fmt.Errorf("there is no %s", what)
	}
	first, ok := recs[0]
	for p := int32(1); !ok && p < n; p++ {
		first, ok = recs[p]
	}
	var missing, differ []string
	for p := int32(0); p < n; p++ {
		r, ok := recs[p]
		switch {
		case !ok:
			missing = append(missing, fmt.Sprint(p))
		case !bytes.Equal(r.value, first.value):
			differ = append(differ, fmt.Sprint(p))
		}
	}
	if len(missing) > 0 || len(differ) > 0 {
		return entRecord{}, fmt.Errorf("the %s is not the same on every partition (missing on [%s], different from partition 0 on [%s]): write it again",
			what, strings.Join(missing, " "), strings.Join(differ, " "))
	}
	if first.value == nil {
		return entRecord{}, fmt.Errorf("the %s was deleted at %s", what, entitlements.FormatTime(first.written))
	}
	return first, nil
}

// Run prints every customer's record.
func (c *EntitlementsListCmd) Run(ctx context.Context, g *Globals, stdio IO) error {
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	latest, n, err := readEntitlements(ctx, g)
	if err != nil {
		return err
	}
	var keys []string
	for k := range latest {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	docs := []any{}
	for _, k := range keys {
		ek, err := schemas.ParseEntitlementsKey([]byte(k))
		if err != nil || ek.Reserved != "" {
			continue
		}
		r, ok := latest[k][schemas.Partition([]byte(k), n)]
		if !ok || r.value == nil {
			continue
		}
		if note := scheduledNote(r, time.Now().UnixMilli(), "the default plan applies"); note != "" {
			fmt.Fprintf(stdio.Stderr, "note: %s: %s\n", clip.To(ek.Customer, clip.Echo), note)
		}
		docs = append(docs, entDocument(stdio, clip.To(ek.Customer, clip.Echo)+": ", r))
	}
	if len(docs) == 0 && c.Output == "yaml" {
		fmt.Fprintln(stdio.Stderr, "no customer has entitlements of its own")
		return nil
	}
	return c.print(stdio, true, docs...)
}

func boolCount(bs ...bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}

// Run prints the customer's latest record of usage.balances, read
// read_committed from the customer's partition only (the aggregator
// writes a customer's balances there; docs/entitlements.md, Topics).
func (c *EntitlementsBalanceCmd) Run(ctx context.Context, g *Globals, stdio IO) error {
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	kc, err := g.connectKafka(ctx)
	if err != nil {
		return err
	}
	topic := g.Topic.BalancesTopic()
	counts, err := topics.PartitionCounts(ctx, kc, topic)
	if err != nil {
		return err
	}
	n := counts[topic]
	if n <= 0 {
		return fmt.Errorf("%s has no partitions", topic)
	}
	key := schemas.CustomerKey(c.Customer)
	p := schemas.Partition(key, n)
	// The other partitions are read from past their end: not at all.
	from := map[int32]int64{}
	for q := range n {
		if q != p {
			from[q] = math.MaxInt64
		}
	}
	recs, err := topics.ReadCommittedAs(ctx, kc, topic, from)
	if err != nil {
		return fmt.Errorf("read %s: %w", topic, entACLNeeded(kc, "Read", topic, "", err))
	}
	var last *kgo.Record
	for _, r := range recs {
		if r.Partition == p && bytes.Equal(r.Key, key) && (last == nil || r.Offset > last.Offset) {
			last = r
		}
	}
	if last == nil || last.Value == nil {
		return &ExitError{Code: 1, Err: fmt.Errorf("%s has no balance in %s partition %d: an aggregator running with --entitlements writes one after it decides an event of the customer", c.Customer, topic, p)}
	}
	m, err := schemas.Decode(last.Value)
	if err != nil {
		return fmt.Errorf("%s partition %d offset %d: %w", topic, p, last.Offset, err)
	}
	b, ok := m.(*schemas.Balance)
	if !ok {
		return fmt.Errorf("%s partition %d offset %d: a %s record, not a balance", topic, p, last.Offset, m.Kind())
	}
	doc := entitlements.BalanceDocumentOf(b)
	doc.Source = &entitlements.BalanceSourceDoc{Topic: topic, Partition: p, Offset: last.Offset}
	// The balance lists the grants that had not expired at as_of; one that
	// expired since pays now only for late events, whose event_time is
	// before its expiry.
	now := time.Now().UnixMilli()
	for _, gr := range b.Grants {
		if gr.ExpiresAt != 0 && gr.ExpiresAt <= now && gr.Remaining > 0 {
			fmt.Fprintf(stdio.Stderr, "note: grant %s expired at %s, after this balance: it pays now only for late events, "+
				"whose event_time is before then (%d of credits_remaining)\n",
				clip.To(gr.ID, clip.Echo), entitlements.FormatTime(gr.ExpiresAt), gr.Remaining)
		}
	}
	return c.print(stdio, false, doc)
}
