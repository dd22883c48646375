package ingest

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// The period of the gate's tests: November 2026, in which prompt() and
// jobAt's default times fall.
var (
	gateStart = time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	gateEnd   = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	// gateAsOf is the updated_at of the balances of the tests.
	gateAsOf = time.Date(2026, 11, 29, 13, 0, 0, 0, time.UTC)
)

// balance is a balance of customer in November 2026 as of gateAsOf, with
// a cap on gpu_ms (usage, limit, policy) and one on api_calls.
func balance(customer string, rev int64, gpuUsage, gpuLimit int64, policy schemas.OnLimit) *schemas.Balance {
	return &schemas.Balance{CustomerID: customer, Plan: "free", Revision: rev, UpdatedAt: gateAsOf.UnixMilli(),
		PeriodStart: gateStart.UnixMilli(), PeriodEnd: gateEnd.UnixMilli(),
		Meters: []schemas.MeterBalance{
			{Meter: "api_calls", Usage: 10, Limit: 10, OnLimit: schemas.OnLimitReject},
			{Meter: "gpu_ms", Usage: gpuUsage, Limit: gpuLimit, OnLimit: policy},
		},
		Grants: []schemas.GrantBalance{}, OverdraftPolicy: schemas.OverdraftDeny}
}

// putBalances writes balances to the env's balances topic, keyed by
// customer as the aggregator writes them, each timestamped with its
// updated_at (an aggregator that does not lag), and waits until the
// server's view holds each.
func (e *env) putBalances(bs ...*schemas.Balance) { e.putBalancesLagging(0, bs...) }

// putBalancesLagging is putBalances by an aggregator lagging by lag: each
// record is timestamped lag after its updated_at.
func (e *env) putBalancesLagging(lag time.Duration, bs ...*schemas.Balance) {
	e.t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...), kgo.DefaultProduceTopic(e.balances))
	if err != nil {
		e.t.Fatal(err)
	}
	defer cl.Close()
	for _, b := range bs {
		v, err := schemas.Encode(b)
		if err != nil {
			e.t.Fatal(err)
		}
		r := &kgo.Record{Key: schemas.CustomerKey(b.CustomerID), Value: v, Timestamp: time.UnixMilli(b.UpdatedAt).Add(lag)}
		if err := cl.ProduceSync(context.Background(), r).FirstErr(); err != nil {
			e.t.Fatal(err)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, b := range bs {
		for {
			got, _, ok := e.srv.balances.Lookup(b.CustomerID)
			if ok && got.Revision >= b.Revision {
				break
			}
			if time.Now().After(deadline) {
				e.t.Fatalf("the view has no balance of %s revision %d after 20s", b.CustomerID, b.Revision)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// feed applies bal to the view as a record timestamped with its
// updated_at, as the topic's reader does.
func feed(t testing.TB, b *Balances, bal *schemas.Balance) {
	t.Helper()
	v, err := schemas.Encode(bal)
	if err != nil {
		t.Fatal(err)
	}
	b.applyRecord(&kgo.Record{Key: schemas.CustomerKey(bal.CustomerID), Value: v, Timestamp: time.UnixMilli(bal.UpdatedAt)})
}

// jobAt is a CloudEvent of type job (meter gpu_ms, SUM, scale 3: 1.5 s is
// 1500) at t.
func jobAt(id, subject string, t time.Time) string {
	return fmt.Sprintf(`{"specversion":"1.0","id":%q,"source":"batch","type":"job","subject":%q,"time":%q,"data":{"seconds":"1.5"}}`,
		id, subject, t.UTC().Format(time.RFC3339Nano))
}

func batchOf(events ...string) []byte { return []byte("[" + strings.Join(events, ",") + "]") }

var nov29 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// gateEnv is an env whose logs are observed and whose metrics are kept.
func gateEnv(t *testing.T, mod func(*Config)) (*env, *observer.ObservedLogs, *prometheus.Registry) {
	core, logs := observer.New(zap.InfoLevel)
	reg := prometheus.NewRegistry()
	e := newEnv(t, func(c *Config) {
		c.Logger, c.Registerer = zap.New(core), reg
		if mod != nil {
			mod(c)
		}
	})
	select {
	case <-e.srv.balances.Loaded():
	case <-time.After(20 * time.Second):
		t.Fatal("balances not loaded after 20s")
	}
	return e, logs, reg
}

// Every event for an exhausted reject-policy meter in its own period: 402,
// nothing sent, each event counted and logged.
func TestGateAllExhausted(t *testing.T) {
	e, logs, reg := gateEnv(t, nil)
	e.putBalances(balance("acme-1", 1, 5000, 5000, schemas.OnLimitReject), balance("acme-2", 1, 4000, 5000, schemas.OnLimitReject))
	// acme-2 has 1000 left: a 1500 job passes it; acme-1 has nothing left.
	status, h, b := e.post("/api/v1/events", "application/cloudevents-batch+json", e.token,
		batchOf(jobAt("j1", "acme-1", nov29), jobAt("j2", "acme-2", nov29), jobAt("j3", "acme-1", nov29)))
	if status != http.StatusPaymentRequired {
		t.Fatalf("%d %s, want 402", status, b)
	}
	if ct := h.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type %q", ct)
	}
	p := problem(t, b)
	if p.Type != "urn:meterline:problem:quota-exhausted" || p.Status != 402 || len(p.Errors) != 3 {
		t.Fatalf("problem %+v", p)
	}
	for i, fe := range p.Errors {
		if fe.Index != i || fe.Field != "type" || fe.Code != schemas.ReasonOverLimit || !strings.Contains(fe.Reason, "gpu_ms") {
			t.Errorf("error %d: %+v", i, fe)
		}
	}
	if !strings.Contains(p.Errors[1].Reason, "4000 of the limit 5000") {
		t.Errorf("reason %q does not say the usage and the limit", p.Errors[1].Reason)
	}
	if n := len(e.records()); n != 0 {
		t.Errorf("%d records written, want none", n)
	}
	if got := testutil.ToFloat64(e.srv.metrics.gate.WithLabelValues("acme")); got != 3 {
		t.Errorf("gate refused %v events, want 3", got)
	}
	// The metric has no customer label.
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "meterline_ingest_gate_refused_events_total" {
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() != "tenant" {
						t.Errorf("label %s on the gate's metric", l.GetName())
					}
				}
			}
		}
	}
	entries := logs.FilterMessageSnippet("quota gate answered 402").All()
	if len(entries) != 1 {
		t.Fatalf("%d log entries of the 402, want 1", len(entries))
	}
	logged := fmt.Sprint(entries[0].ContextMap())
	for _, want := range []string{"acme-1", "acme-2", "gpu_ms", "index:2"} {
		if !strings.Contains(logged, want) {
			t.Errorf("the log %s does not name %s", logged, want)
		}
	}
	// The secret is what follows "mlk_<id>_": base64url has '_' too, so
	// the part after the token's last '_' can be a letter or two.
	if strings.Contains(logged, e.token) || strings.Contains(logged, e.token[len(tokenPrefix)+16+1:]) {
		t.Errorf("the log %s holds the key", logged)
	}
	// Meterline's own format too, on a meter the meters file declares as
	// a SUM without an event type.
	ev := fmt.Sprintf(`{"event_id":"c1","customer_id":"acme-1","meter":"api_calls","quantity":1,"event_time":%q}`, nov29.Format(time.RFC3339))
	if status, _, b := e.post("/v1/events", "application/json", e.token, []byte(ev)); status != http.StatusPaymentRequired {
		t.Errorf("/v1/events: %d %s, want 402", status, b)
	}
}

// The gate lets a request through whenever one of its events is not
// surely over its cap: the whole request is sent.
func TestGateFailsOpen(t *testing.T) {
	e, _, _ := gateEnv(t, func(c *Config) { c.GateMaxAge = time.Hour })
	e.putBalances(
		balance("acme-1", 1, 5000, 5000, schemas.OnLimitReject),
		balance("acme-2", 1, 3500, 5000, schemas.OnLimitReject), // 1500 more lands exactly on the cap
		balance("acme-3", 1, 9000, 5000, schemas.OnLimitAllow),
	)
	unmetered := balance("acme-4", 1, 5000, 5000, schemas.OnLimitReject)
	unmetered.Unmetered = true
	e.putBalances(unmetered)
	refused := jobAt("r", "acme-1", nov29)
	for _, c := range []struct {
		name string
		body []byte
	}{
		{"one event not exhausted", batchOf(refused, jobAt("a", "acme-2", nov29), refused)},
		{"allow policy", batchOf(refused, jobAt("b", "acme-3", nov29))},
		{"no balance", batchOf(refused, jobAt("c", "acme-5", nov29))},
		{"unmetered", batchOf(refused, jobAt("d", "acme-4", nov29))},
		// The period boundary: the balance is November's; December's
		// first millisecond is another period.
		{"next period", batchOf(refused, jobAt("e", "acme-1", gateEnd))},
		{"previous period", batchOf(refused, jobAt("f", "acme-1", gateStart.Add(-time.Millisecond)))},
		// prompt feeds meters the balance has no cap on.
		{"uncapped meter", batchOf(refused, string(mustJSON(t, prompt(t, "g", "acme-1", map[string]any{"tokens": map[string]any{"input": 1}, "user": "u"}))))},
	} {
		before := len(e.records())
		status, _, b := e.post("/api/v1/events", "application/cloudevents-batch+json", e.token, c.body)
		if status != http.StatusNoContent {
			t.Errorf("%s: %d %s, want 204", c.name, status, b)
			continue
		}
		if got := len(e.records()) - before; got < 2 {
			t.Errorf("%s: %d records written, want every event's", c.name, got)
		}
	}
	// The last millisecond of the period is in it.
	last := batchOf(jobAt("h", "acme-1", gateEnd.Add(-time.Millisecond)))
	if status, _, b := e.post("/api/v1/events", "application/cloudevents-batch+json", e.token, last); status != http.StatusPaymentRequired {
		t.Errorf("the period's last millisecond: %d %s, want 402", status, b)
	}
	if got := testutil.ToFloat64(e.srv.metrics.gate.WithLabelValues("acme")); got != 1 {
		t.Errorf("gate refused %v events, want 1", got)
	}
}

// A balance as old as GateMaxAge (in broker time: against the newest
// balance read) is not trusted; a younger one is.
func TestGateStaleBalance(t *testing.T) {
	// A clock that stands still: the balances age by broker time only.
	now := gateAsOf.Add(time.Hour)
	e, _, _ := gateEnv(t, func(c *Config) { c.GateMaxAge = 10 * time.Minute; c.Clock = func() time.Time { return now } })
	body := batchOf(jobAt("s1", "acme-1", nov29))
	e.putBalances(balance("acme-1", 1, 5000, 5000, schemas.OnLimitReject))
	if status, _, b := e.post("/api/v1/events", "application/cloudevents-batch+json", e.token, body); status != http.StatusPaymentRequired {
		t.Fatalf("fresh: %d %s, want 402", status, b)
	}
	younger := balance("acme-9", 1, 0, 5000, schemas.OnLimitReject)
	younger.UpdatedAt = gateAsOf.Add(10*time.Minute - time.Millisecond).UnixMilli()
	e.putBalances(younger)
	if status, _, b := e.post("/api/v1/events", "application/cloudevents-batch+json", e.token, body); status != http.StatusPaymentRequired {
		t.Fatalf("younger than the age by 1ms: %d %s, want 402", status, b)
	}
	newer := balance("acme-9", 2, 0, 5000, schemas.OnLimitReject)
	newer.UpdatedAt = gateAsOf.Add(10 * time.Minute).UnixMilli()
	e.putBalances(newer)
	if status, _, b := e.post("/api/v1/events", "application/cloudevents-batch+json", e.token, body); status != http.StatusNoContent {
		t.Fatalf("stale: %d %s, want 204", status, b)
	}
	if n := len(e.records()); n != 1 {
		t.Errorf("%d records, want 1", n)
	}
}

// A balance whose caps stop being those in effect (caps_until: a raise or
// an unmetered plan scheduled for later) is not trusted once the broker
// time now reaches its caps_until, however young it is: the request is let
// through. Before it, the balance closes the gate as any other.
func TestGateCapsUntil(t *testing.T) {
	// A clock that stands still: the broker time now is the newest live
	// record's timestamp.
	now := gateAsOf.Add(time.Hour)
	e, _, _ := gateEnv(t, func(c *Config) { c.GateMaxAge = 10 * time.Minute; c.Clock = func() time.Time { return now } })
	body := batchOf(jobAt("u1", "acme-1", nov29))
	raised := balance("acme-1", 1, 5000, 5000, schemas.OnLimitReject)
	raised.CapsUntil = gateAsOf.Add(2 * time.Minute).UnixMilli()
	e.putBalances(raised)
	if status, _, b := e.post("/api/v1/events", "application/cloudevents-batch+json", e.token, body); status != http.StatusPaymentRequired {
		t.Fatalf("before caps_until: %d %s, want 402", status, b)
	}
	// Another customer's balance moves the broker time now to 1ms before
	// acme-1's caps_until, then to it.
	for i, c := range []struct {
		at   time.Duration
		want int
	}{{2*time.Minute - time.Millisecond, http.StatusPaymentRequired}, {2 * time.Minute, http.StatusNoContent}} {
		other := balance("acme-9", int64(i+1), 0, 5000, schemas.OnLimitReject)
		other.UpdatedAt = gateAsOf.Add(c.at).UnixMilli()
		e.putBalances(other)
		if status, _, b := e.post("/api/v1/events", "application/cloudevents-batch+json", e.token, body); status != c.want {
			t.Fatalf("broker time caps_until %s: %d %s, want %d", c.at-2*time.Minute, status, b, c.want)
		}
	}
	if n := len(e.records()); n != 1 {
		t.Errorf("%d records, want 1", n)
	}
}

// Until the view is loaded (here: no balances topic), every request is
// let through; with the gate off, the topic is not read at all.
func TestGateNotLoaded(t *testing.T) {
	for _, off := range []bool{false, true} {
		e := newEnv(t, func(c *Config) { c.BalancesTopic = "no-such-topic"; c.NoGate = off })
		if off != (e.srv.balances == nil) {
			t.Fatalf("NoGate %v: balances %v", off, e.srv.balances)
		}
		status, _, b := e.post("/api/v1/events", "application/cloudevents-batch+json", e.token, batchOf(jobAt("n", "acme-1", nov29)))
		if status != http.StatusNoContent {
			t.Errorf("NoGate %v: %d %s, want 204", off, status, b)
		}
	}
}

// Until the view has read every balance the topic held at the start, and
// then a record has arrived live, the gate lets everything through.
func TestGateWaitsForTheView(t *testing.T) {
	b := NewBalances("t", nil, nil)
	s := &Server{cfg: Config{GateMaxAge: time.Hour, Meters: mustCatalog(t)}, balances: b}
	feed(t, b, balance("acme-1", 1, 5000, 5000, schemas.OnLimitReject))
	req := &request{inputs: 1, usages: []usage{{ue: schemas.UsageEvent{CustomerID: "acme-1", Meter: "gpu_ms", Quantity: 1, EventTime: nov29.UnixMilli()}}}}
	if errs, _ := s.gateCheck(req); errs != nil {
		t.Fatalf("before Loaded: %v", errs)
	}
	b.caughtUp()
	if errs, _ := s.gateCheck(req); errs != nil {
		t.Fatalf("loaded, no record arrived live: %v", errs)
	}
	feed(t, b, balance("acme-2", 1, 0, 5000, schemas.OnLimitReject))
	if errs, _ := s.gateCheck(req); len(errs) != 1 {
		t.Fatalf("once a record arrived live: %v, want one refusal", errs)
	}
}

// A balance's age is measured against the timestamps of records that
// arrived live, plus the time elapsed since (the aggregator may have
// stopped), measured by differences of the clock. Records read before
// the view caught up, or on a re-read from the start, do not count.
func TestBalancesAge(t *testing.T) {
	var now time.Time
	b := NewBalances("t", nil, func() time.Time { return now })
	now = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC) // the clock's setting does not matter
	old := balance("a", 1, 0, 1, schemas.OnLimitReject)
	old.UpdatedAt = gateAsOf.Add(-time.Minute).UnixMilli()
	feed(t, b, old)
	feed(t, b, balance("b", 1, 0, 1, schemas.OnLimitReject))
	if _, ok := b.BrokerNow(); ok {
		t.Fatal("BrokerNow from records loaded, none live")
	}
	if _, age, ok := b.Lookup("a"); !ok || age != unknownAge {
		t.Errorf("age %s before a record arrived live, want unknown", age)
	}
	b.caughtUp()
	// The aggregator lags by a minute: its record is written a minute
	// after its updated_at.
	c := balance("c", 1, 0, 1, schemas.OnLimitReject)
	v, _ := schemas.Encode(c)
	b.applyRecord(&kgo.Record{Key: schemas.CustomerKey("c"), Value: v, Timestamp: gateAsOf.Add(time.Minute)})
	if _, age, _ := b.Lookup("c"); age != time.Minute {
		t.Errorf("age %s, want 1m (the lag)", age)
	}
	if _, age, _ := b.Lookup("a"); age != 2*time.Minute {
		t.Errorf("age %s, want 2m", age)
	}
	now = now.Add(30 * time.Second)
	if _, age, _ := b.Lookup("a"); age != 150*time.Second {
		t.Errorf("age %s, want 2m30s", age)
	}
	if ms, _ := b.BrokerNow(); ms != gateAsOf.Add(90*time.Second).UnixMilli() {
		t.Errorf("BrokerNow %d", ms)
	}
	// A record older than the estimate does not move it back.
	feed(t, b, balance("d", 1, 0, 1, schemas.OnLimitReject))
	if ms, _ := b.BrokerNow(); ms != gateAsOf.Add(90*time.Second).UnixMilli() {
		t.Errorf("BrokerNow %d after an older record", ms)
	}
	// A re-read from the start: its records are not live until it has
	// caught up.
	b.setLive(false)
	later := balance("e", 1, 0, 1, schemas.OnLimitReject)
	later.UpdatedAt = gateAsOf.Add(time.Hour).UnixMilli()
	feed(t, b, later)
	if ms, _ := b.BrokerNow(); ms != gateAsOf.Add(90*time.Second).UnixMilli() {
		t.Errorf("BrokerNow %d after a replayed record", ms)
	}
	// An older revision does not replace a newer one; a tombstone
	// forgets; an unreadable record changes nothing.
	feed(t, b, balance("b", 0, 7, 1, schemas.OnLimitReject))
	if got, _, _ := b.Lookup("b"); got.Revision != 1 {
		t.Errorf("revision %d, want 1", got.Revision)
	}
	b.apply(schemas.CustomerKey("a"), nil)
	b.apply(schemas.CustomerKey("b"), []byte("junk"))
	if _, _, ok := b.Lookup("a"); ok || b.Len() != 4 || b.bad != 1 {
		t.Errorf("after a tombstone and junk: %d balances, %d bad", b.Len(), b.bad)
	}
}

// On the real broker, with balances written in transactions as the
// aggregator writes them: a committed exhausted balance closes the gate,
// an aborted one is never applied, and the view is loaded although each
// partition ends with a transaction's marker.
func TestRealGate(t *testing.T) {
	brokers := testenv.RealKafka(t)
	e := newEnvOn(t, brokers, nil, nil)
	txn := func(commit bool, bs ...*schemas.Balance) {
		cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(e.balances),
			kgo.TransactionalID(testenv.Name(t, "txn")))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		ctx := context.Background()
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for _, b := range bs {
			v, err := schemas.Encode(b)
			if err != nil {
				t.Fatal(err)
			}
			r := &kgo.Record{Key: schemas.CustomerKey(b.CustomerID), Value: v, Timestamp: time.UnixMilli(b.UpdatedAt)}
			if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
			t.Fatal(err)
		}
	}
	txn(true, balance("acme-1", 1, 5000, 5000, schemas.OnLimitReject), balance("acme-2", 1, 0, 5000, schemas.OnLimitReject))
	txn(false, balance("acme-1", 2, 0, 5000, schemas.OnLimitReject)) // aborted: never applied
	// A second replica started now loads the view: both partitions end
	// with a marker, not a record.
	cfg := e.srv.cfg
	cfg.Addr = "127.0.0.1:0"
	cfg.Registerer = nil
	second := &env{t: t, brokers: brokers, topic: e.topic, keys: e.keys, balances: e.balances}
	second.start(cfg)
	select {
	case <-second.srv.balances.Loaded():
	case <-time.After(30 * time.Second):
		t.Fatal("balances not loaded after 30s")
	}
	// The second replica trusts a balance once one has arrived live.
	txn(true, balance("acme-9", 1, 0, 5000, schemas.OnLimitReject))
	for _, r := range []*env{e, second} {
		select {
		case <-r.srv.balances.Loaded():
		case <-time.After(30 * time.Second):
			t.Fatal("balances not loaded after 30s")
		}
		deadline := time.Now().Add(30 * time.Second)
		for r.srv.balances.Len() < 3 {
			if time.Now().After(deadline) {
				t.Fatalf("%d balances in the view after 30s, want 3", r.srv.balances.Len())
			}
			time.Sleep(10 * time.Millisecond)
		}
		if b, _, _ := r.srv.balances.Lookup("acme-1"); b.Revision != 1 {
			t.Fatalf("acme-1's balance has revision %d: the aborted one was applied", b.Revision)
		}
		status, _, body := post(t, http.DefaultClient, r.srv.URL()+"/api/v1/events", "application/cloudevents-batch+json", e.token,
			batchOf(jobAt("x1", "acme-1", nov29), jobAt("x2", "acme-1", nov29)))
		if status != http.StatusPaymentRequired {
			t.Fatalf("%d %s, want 402", status, body)
		}
		status, _, body = post(t, http.DefaultClient, r.srv.URL()+"/api/v1/events", "application/cloudevents-batch+json", e.token,
			batchOf(jobAt("x1", "acme-1", nov29), jobAt("x3", "acme-2", nov29)))
		if status != http.StatusNoContent {
			t.Fatalf("mixed: %d %s, want 204", status, body)
		}
	}
	if n := len(e.records()); n != 4 {
		t.Errorf("%d records, want 4 (the two mixed requests)", n)
	}
}

// The answer reaches the client before the request's bookkeeping
// (metrics, Trace) runs: a slow or contended bookkeeping never adds to
// the latency of a success.
func TestAnswerBeforeBookkeeping(t *testing.T) {
	answered := make(chan struct{})
	var early atomic.Bool
	e := newEnv(t, func(c *Config) {
		c.Trace = func(Timings) {
			select {
			case <-answered:
				early.Store(true)
			case <-time.After(3 * time.Second):
			}
		}
	})
	status, _, b := e.post("/api/v1/events", "application/cloudevents-batch+json", e.token, batchOf(jobAt("a", "acme-1", nov29)))
	close(answered)
	if status != http.StatusNoContent {
		t.Fatalf("%d %s", status, b)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !early.Load() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if !early.Load() {
		t.Error("the client got the answer only after the bookkeeping")
	}
}

// A meter the ingest's meters file does not declare may be a COUNT in the
// aggregator's (which counts 1 per event, not the quantity): the gate
// cannot know the units the aggregator will add, so it lets the event
// through.
func TestGateUndeclaredMeter(t *testing.T) {
	b := NewBalances("t", nil, nil)
	s := &Server{cfg: Config{GateMaxAge: time.Hour, Meters: mustCatalog(t)}, balances: b}
	bal := balance("acme-1", 1, 0, 5000, schemas.OnLimitReject)
	// 9 of 10 used: one more event lands on the cap for a COUNT, a
	// quantity of 100 would pass it for a SUM.
	bal.Meters = append(bal.Meters, schemas.MeterBalance{Meter: "builds", Usage: 9, Limit: 10, OnLimit: schemas.OnLimitReject})
	b.caughtUp()
	feed(t, b, bal)
	req := &request{inputs: 1, usages: []usage{{ue: schemas.UsageEvent{CustomerID: "acme-1", Meter: "builds", Quantity: 100, EventTime: nov29.UnixMilli()}}}}
	if errs, _ := s.gateCheck(req); errs != nil {
		t.Fatalf("an undeclared meter: refused %v, want let through", errs)
	}
	// The same on a declared SUM meter is refused.
	req.usages[0].ue.Meter, req.usages[0].ue.Quantity = "gpu_ms", 5001
	if errs, _ := s.gateCheck(req); len(errs) != 1 {
		t.Fatalf("a declared SUM meter: %v, want one refusal", errs)
	}
}

// The gate costs a request it lets through no allocation (the common
// case: the first event not surely over its cap).
func TestGateCheckOpenAllocs(t *testing.T) {
	s, req := gateBench(t, 100)
	if allocs := testing.AllocsPerRun(100, func() {
		if errs, _ := s.gateCheck(req); errs != nil {
			t.Fatal("refused")
		}
	}); allocs != 0 {
		t.Errorf("%v allocations per request let through, want 0", allocs)
	}
}

// BenchmarkGateCheckOpen is the gate on a request of 100 usage events
// whose first is over its cap and whose last is not: let through.
func BenchmarkGateCheckOpen(b *testing.B) {
	s, req := gateBench(b, 100)
	b.ReportAllocs()
	for b.Loop() {
		if errs, _ := s.gateCheck(req); errs != nil {
			b.Fatal("refused")
		}
	}
}

// gateBench is a loaded gate and a request of n usage events of acme-1,
// whose gpu_ms is used up, but the last, of acme-2, which has no balance.
func gateBench(t testing.TB, n int) (*Server, *request) {
	b := NewBalances("t", nil, nil)
	b.caughtUp()
	feed(t, b, balance("acme-1", 1, 5000, 5000, schemas.OnLimitReject))
	s := &Server{cfg: Config{GateMaxAge: time.Hour, Meters: mustCatalog(t)}, balances: b}
	req := &request{inputs: n}
	for i := range n {
		req.usages = append(req.usages, usage{input: i, ue: schemas.UsageEvent{CustomerID: "acme-1", Meter: "gpu_ms", Quantity: 1, EventTime: nov29.UnixMilli()}})
	}
	req.usages[n-1].ue.CustomerID = "acme-2"
	return s, req
}

// A replica started after the aggregator stopped writing trusts none of
// the balances it loads, however recent their updated_at: a customer may
// have raised its cap since. The first balance that arrives live makes
// them trusted again (each by its own age).
func TestGateRestartAfterAggregatorStopped(t *testing.T) {
	e, _, _ := gateEnv(t, func(c *Config) { c.GateMaxAge = 10 * time.Minute })
	e.putBalances(balance("acme-1", 1, 5000, 5000, schemas.OnLimitReject))
	body := batchOf(jobAt("r1", "acme-1", nov29))
	if status, _, b := e.post("/api/v1/events", "application/cloudevents-batch+json", e.token, body); status != http.StatusPaymentRequired {
		t.Fatalf("before the restart: %d %s, want 402", status, b)
	}
	// The aggregator stops; the ingest restarts and loads the view.
	cfg := e.srv.cfg
	cfg.Addr, cfg.Registerer = "127.0.0.1:0", nil
	if err := e.stop(); err != nil {
		t.Fatal(err)
	}
	e.start(cfg)
	select {
	case <-e.srv.balances.Loaded():
	case <-time.After(20 * time.Second):
		t.Fatal("balances not loaded after 20s")
	}
	if _, _, ok := e.srv.balances.Lookup("acme-1"); !ok {
		t.Fatal("the view has no balance of acme-1 after loading")
	}
	if status, _, b := e.post("/api/v1/events", "application/cloudevents-batch+json", e.token, body); status != http.StatusNoContent {
		t.Fatalf("restarted, no balance arrived since: %d %s, want 204", status, b)
	}
	// The aggregator writes again (another customer's balance, a minute
	// later).
	other := balance("acme-2", 1, 0, 5000, schemas.OnLimitReject)
	other.UpdatedAt = gateAsOf.Add(time.Minute).UnixMilli()
	e.putBalances(other)
	if status, _, b := e.post("/api/v1/events", "application/cloudevents-batch+json", e.token, body); status != http.StatusPaymentRequired {
		t.Fatalf("a balance arrived live: %d %s, want 402", status, b)
	}
	if n := len(e.records()); n != 1 {
		t.Errorf("%d records, want 1", n)
	}
}

// An aggregator that lags (by more than the age) writes balances as old
// as its lag, however recent they are among themselves: not trusted.
func TestGateLaggingAggregator(t *testing.T) {
	e, _, _ := gateEnv(t, func(c *Config) { c.GateMaxAge = 10 * time.Minute })
	body := batchOf(jobAt("l1", "acme-1", nov29))
	e.putBalancesLagging(time.Hour, balance("acme-1", 1, 5000, 5000, schemas.OnLimitReject))
	if status, _, b := e.post("/api/v1/events", "application/cloudevents-batch+json", e.token, body); status != http.StatusNoContent {
		t.Fatalf("lagging by 1h: %d %s, want 204", status, b)
	}
	// Caught up: its next balance is written at its updated_at.
	caught := balance("acme-1", 2, 5000, 5000, schemas.OnLimitReject)
	caught.UpdatedAt = gateAsOf.Add(time.Hour).UnixMilli()
	e.putBalances(caught)
	if status, _, b := e.post("/api/v1/events", "application/cloudevents-batch+json", e.token, body); status != http.StatusPaymentRequired {
		t.Fatalf("caught up: %d %s, want 402", status, b)
	}
}

// A 402 does not spend the refusal budget of a key without a rate: its
// events are well-formed and the key's to write, and one customer at its
// cap must not get the key's other customers refused.
func TestGateRefusalsAreNotCharged(t *testing.T) {
	e, _, _ := gateEnv(t, func(c *Config) { c.RefusalRate = 1 }) // a bucket of one full request, 1000 events
	e.putBalances(balance("acme-1", 1, 5000, 5000, schemas.OnLimitReject))
	over := batchOf(jobAt("j1", "acme-1", nov29), jobAt("j2", "acme-1", nov29), jobAt("j3", "acme-1", nov29))
	for i := range 400 { // 1200 events refused 402
		if status, _, b := e.post("/api/v1/events", "application/cloudevents-batch+json", e.token, over); status != http.StatusPaymentRequired {
			t.Fatalf("request %d over the cap: %d %s, want 402", i, status, b)
		}
	}
	if status, _, b := e.post("/api/v1/events", "application/cloudevents-batch+json", e.token, batchOf(jobAt("k1", "acme-2", nov29))); status != http.StatusNoContent {
		t.Fatalf("another customer of the key after 1200 events refused 402: %d %s, want 204", status, b)
	}
}

// TestGateLogBounded: the 402's log line, one a request naming each of
// its events, is bounded as the HTTP server's error log is: a client that
// sends a capped customer's batches in a loop (a 402 costs no refusal
// budget, and a key without a rate has no bound) wrote a line of up to a
// thousand entries for every request, as fast as it sent them. At most
// errorLogBurst lines at once, then errorLogRate a second; the next line
// counts those left out.
func TestGateLogBounded(t *testing.T) {
	e, logs, _ := gateEnv(t, nil)
	e.putBalances(balance("acme-1", 1, 5000, 5000, schemas.OnLimitReject))
	over := batchOf(jobAt("j1", "acme-1", nov29), jobAt("j2", "acme-1", nov29))
	const n = 40
	for i := range n {
		if status, _, b := e.post("/api/v1/events", "application/cloudevents-batch+json", e.token, over); status != http.StatusPaymentRequired {
			t.Fatalf("request %d: %d %s, want 402", i, status, b)
		}
	}
	lines := logs.FilterMessageSnippet("quota gate answered 402").Len()
	if lines > errorLogBurst+2 {
		t.Fatalf("%d requests answered 402 logged %d lines, want at most about %d", n, lines, errorLogBurst)
	}
	time.Sleep(time.Second + 100*time.Millisecond)
	if status, _, b := e.post("/api/v1/events", "application/cloudevents-batch+json", e.token, over); status != http.StatusPaymentRequired {
		t.Fatalf("%d %s, want 402", status, b)
	}
	all := logs.FilterMessageSnippet("quota gate answered 402").All()
	last := all[len(all)-1].ContextMap()
	if got, want := last["left_out"], int64(n-lines); got != want {
		t.Errorf("the line after the pause: left_out %v, want %d (%v)", got, want, last)
	}
}

// TestGateLogLineBounded: the line of a 402 names the refused events, and
// a producer decides how many there are and how long their customer IDs
// (up to a thousand events of 1 KB IDs in a 1 MB body): a line of each of
// them was as large as the body, errorLogRate of them a second. The line
// names the first gateLogEvents, and how many it leaves out; the answer
// names every one.
func TestGateLogLineBounded(t *testing.T) {
	e, logs, _ := gateEnv(t, nil)
	customer := "acme-" + strings.Repeat("x", schemas.MaxIdentityFieldBytes-5)
	e.putBalances(balance(customer, 1, 5000, 5000, schemas.OnLimitReject))
	const n = 500
	events := make([]string, n)
	for i := range events {
		events[i] = jobAt(fmt.Sprintf("j%d", i), customer, nov29)
	}
	status, _, b := e.post("/api/v1/events", "application/cloudevents-batch+json", e.token, batchOf(events...))
	if status != http.StatusPaymentRequired {
		t.Fatalf("%d %.300s, want 402", status, b)
	}
	if p := problem(t, b); len(p.Errors) != n {
		t.Errorf("the answer names %d refused events, want %d", len(p.Errors), n)
	}
	// An answer this large reaches the client as it is written, before
	// the handler logs the line: wait for it.
	var entries []observer.LoggedEntry
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if entries = logs.FilterMessageSnippet("quota gate answered 402").All(); len(entries) > 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(entries) != 1 {
		t.Fatalf("%d log entries of the 402, want 1", len(entries))
	}
	logged := fmt.Sprint(entries[0].ContextMap())
	if max := 32 << 10; len(logged) > max {
		t.Errorf("the line of one 402 holds %d bytes of fields, want at most %d", len(logged), max)
	}
	if got := strings.Count(logged, customer); got == 0 || got > gateLogEvents {
		t.Errorf("the line names the customer %d times, want 1 to %d", got, gateLogEvents)
	}
	if got, want := entries[0].ContextMap()["refused_not_listed"], int64(n-gateLogEvents); got != want {
		t.Errorf("refused_not_listed %v, want %d", got, want)
	}
}
