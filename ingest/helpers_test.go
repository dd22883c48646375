package ingest

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/aggregator"
	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

// testMeters is the meters file of the tests: a prompt feeds three meters.
const testMeters = `meters:
  - name: input_tokens
    event_type: prompt
    value_property: $.tokens.input
    group_by: {model: $.model}
  - name: prompts
    aggregation: COUNT
    event_type: prompt
  - name: users
    aggregation: UNIQUE_COUNT
    property: user
    event_type: prompt
    value_property: $.user
  - name: gpu_ms
    event_type: job
    value_property: $.seconds
    scale: 3
  - name: api_calls
`

// env is one ingest server on a broker, with its topics and a key.
type env struct {
	t        testing.TB
	brokers  []string
	topic    string
	keys     string
	balances string // the balances topic (2 partitions)
	srv      *Server
	admin    *Admin
	token    string // of tenant acme: customers acme-*, any meter
	stop     func() error
	cluster  *kfake.Cluster // nil on the real broker
}

// newEnv starts an ingest server on kfake (or on the real broker with
// real set), with a key for tenant acme (customers acme-*).
func newEnv(t testing.TB, mod func(*Config)) *env {
	t.Helper()
	c, brokers := testenv.KFake(t)
	return newEnvOn(t, brokers, c, mod)
}

// newEnvOn is newEnv on brokers: a kfake cluster's (its topics go with
// it), or the real broker's (its topics are deleted when the test ends).
func newEnvOn(t testing.TB, brokers []string, cluster *kfake.Cluster, mod func(*Config)) *env {
	t.Helper()
	e := &env{t: t, brokers: brokers, topic: testenv.Name(t, "events"), keys: testenv.Name(t, "keys"),
		balances: testenv.Name(t, "balances"), cluster: cluster}
	compact := "compact"
	if cluster == nil {
		testenv.CreateTopic(t, brokers, e.topic, 4, nil)
		testenv.CreateTopic(t, brokers, e.keys, 1, map[string]*string{"cleanup.policy": &compact})
		testenv.CreateTopic(t, brokers, e.balances, 2, map[string]*string{"cleanup.policy": &compact})
	} else {
		adm := testenv.Admin(t, brokers)
		ctx := context.Background()
		if _, err := adm.CreateTopic(ctx, 4, 1, nil, e.topic); err != nil {
			t.Fatal(err)
		}
		if _, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{"cleanup.policy": &compact}, e.keys); err != nil {
			t.Fatal(err)
		}
		if _, err := adm.CreateTopic(ctx, 2, 1, map[string]*string{"cleanup.policy": &compact}, e.balances); err != nil {
			t.Fatal(err)
		}
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	e.admin = NewAdmin(cl, e.keys)
	_, e.token, err = e.admin.CreateKey(context.Background(), KeySpec{Tenant: "acme", Customers: []string{"acme-*"}})
	if err != nil {
		t.Fatal(err)
	}
	cat, err := aggregator.ParseMeters([]byte(testMeters))
	if err != nil {
		t.Fatal(err)
	}
	// The tests' events carry fixed times of late 2026: the bound on an
	// event's age (too_old) is off unless a test sets MaxAge (0: the
	// default), so that they do not start failing once those times are
	// older than the dedup window.
	cfg := Config{Addr: "127.0.0.1:0", Kafka: kafka.Config{Brokers: brokers}, Topic: e.topic, KeysTopic: e.keys, BalancesTopic: e.balances, Meters: cat, ProduceTimeout: 2 * time.Second,
		MaxAge: -1}
	if mod != nil {
		mod(&cfg)
	}
	e.start(cfg)
	return e
}

// start starts a server with cfg and waits until it is ready.
func (e *env) start(cfg Config) {
	t := e.t
	t.Helper()
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	stopped := false
	e.srv = srv
	e.stop = func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		return <-done
	}
	t.Cleanup(func() {
		if err := e.stop(); err != nil {
			t.Errorf("server stopped with %v", err)
		}
	})
	waitReady(t, srv)
}

func waitReady(t testing.TB, srv *Server) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for srv.Ready() != nil {
		if time.Now().After(deadline) {
			t.Fatal("ingest not ready after 20s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// post sends body to path with the content type and token; it returns the
// status and body.
func (e *env) post(path, contentType, token string, body []byte) (int, http.Header, []byte) {
	e.t.Helper()
	return post(e.t, http.DefaultClient, e.srv.URL()+path, contentType, token, body)
}

// postWith posts body to path with the content type, the env's key and
// the header lines of extra; it returns the status and body.
func (e *env) postWith(path, contentType string, body []byte, extra http.Header) (int, []byte) {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.srv.URL()+path, bytes.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Content-Type", contentType)
	req.Header.Set("Authorization", "Bearer "+e.token)
	for name, values := range extra {
		for _, v := range values {
			req.Header.Add(name, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func post(t testing.TB, c *http.Client, url, contentType, token string, body []byte) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, b
}

// records reads every record of the events topic, decoded.
func (e *env) records() []*schemas.UsageEvent {
	e.t.Helper()
	var out []*schemas.UsageEvent
	for _, r := range testenv.ReadAll(e.t, e.brokers, e.topic) {
		var ue schemas.UsageEvent
		if err := schemas.DecodeInto(r.Value, &ue); err != nil {
			e.t.Fatalf("record %s: %v", r.Key, err)
		}
		if !bytes.Equal(r.Key, ue.Identity().Key()) {
			e.t.Errorf("record key %q is not the canonical key %q", r.Key, ue.Identity().Key())
		}
		if p := schemas.Partition(r.Key, 4); p != r.Partition {
			e.t.Errorf("record %s in partition %d, want murmur2's %d", r.Key, r.Partition, p)
		}
		out = append(out, &ue)
	}
	return out
}

// prompt builds a CloudEvent with the CloudEvents SDK.
func prompt(t testing.TB, id, subject string, data map[string]any) cloudevents.Event {
	t.Helper()
	ev := cloudevents.NewEvent()
	ev.SetID(id)
	ev.SetSource("chat-api")
	ev.SetType("prompt")
	ev.SetSubject(subject)
	ev.SetTime(time.Date(2026, 11, 29, 12, 0, 0, 250e6, time.UTC))
	if data != nil {
		if err := ev.SetData(cloudevents.ApplicationJSON, data); err != nil {
			t.Fatal(err)
		}
	}
	return ev
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// problem decodes a problem body.
func problem(t testing.TB, b []byte) Problem {
	t.Helper()
	var p Problem
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		t.Fatalf("not a problem body: %v: %s", err, b)
	}
	return p
}

func sleepMs(n int) { time.Sleep(time.Duration(n) * time.Millisecond) }

func mustCatalog(t testing.TB) *aggregator.Catalog {
	t.Helper()
	cat, err := aggregator.ParseMeters([]byte(testMeters))
	if err != nil {
		t.Fatal(err)
	}
	return cat
}
