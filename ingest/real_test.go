package ingest

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/meterline/meterline/dedup"
	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/session"
	"github.com/meterline/meterline/internal/stream"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/schemas"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// pipeline is the real broker with Meterline's topics (a prefix of the
// test's own), a dedup stage counting what the ingest writes, and a key.
type pipeline struct {
	t       *testing.T
	brokers []string
	names   topics.Names
	token   string
	meters  string // path of the meters file
}

func newPipeline(t *testing.T) *pipeline {
	t.Helper()
	brokers := testenv.RealKafka(t)
	p := &pipeline{t: t, brokers: brokers, names: testenv.Topics(t, brokers, "", testenv.TopicsOpts{})}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, p.token, err = NewAdmin(cl, p.names.KeysTopic()).CreateKey(ctx, KeySpec{Tenant: "acme", Customers: []string{"acme-*"}}); err != nil {
		t.Fatal(err)
	}
	p.meters = filepath.Join(t.TempDir(), "meters.yaml")
	if err := os.WriteFile(p.meters, []byte(testMeters), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// startDedup runs the dedup stage on the pipeline's topics until the test
// ends.
func (p *pipeline) startDedup() {
	t := p.t
	key, err := dedup.GenerateKey("t")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	st, err := dedup.New(ctx, dedup.Config{Topics: p.names, TickInterval: 200 * time.Millisecond, Keys: []dedup.Key{key}, Stream: stream.Config{
		Config:   session.Config{Kafka: kafka.Config{Brokers: p.brokers}, Group: p.names.Prefix + "dedup", InstanceID: "t", SessionTimeout: 6 * time.Second},
		StateDir: filepath.Join(t.TempDir(), "state"), CommitInterval: 50 * time.Millisecond, Logger: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)).Named("dedup")}})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- st.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("dedup: %v", err)
		}
	})
}

// server starts an in-process ingest on the pipeline's topics.
func (p *pipeline) server() *env {
	cat := mustCatalog(p.t)
	e := &env{t: p.t, brokers: p.brokers, topic: p.names.EventsTopic(), keys: p.names.KeysTopic(), token: p.token}
	e.start(Config{Addr: "127.0.0.1:0", Kafka: kafka.Config{Brokers: p.brokers}, Topic: p.names.EventsTopic(), KeysTopic: p.names.KeysTopic(), Meters: cat})
	return e
}

// counted waits until dedup caught up and returns, per identity, how often
// it is in usage.deduped, and the number of records in usage.duplicates
// (exact copies, conflicting copies).
func (p *pipeline) counted() (map[string]int, int, int) {
	t := p.t
	t.Helper()
	testenv.WaitCaughtUp(t, p.brokers, p.names.Prefix+"dedup", p.names.EventsTopic(), 2*time.Minute)
	ids := map[string]int{}
	for _, r := range testenv.ReadAll(t, p.brokers, p.names.DedupedTopic()) {
		var de schemas.DedupedEvent
		if k, _ := schemas.PeekKind(r.Value); k != schemas.KindDedupedEvent {
			continue
		}
		if err := schemas.DecodeInto(r.Value, &de); err != nil {
			t.Fatal(err)
		}
		ids[fmt.Sprintf("%s/%s/%s", de.CustomerID, de.Meter, de.EventID)]++
	}
	exact, conflicts := 0, 0
	for _, r := range testenv.ReadAll(t, p.brokers, p.names.DuplicatesTopic()) {
		var d schemas.Duplicate
		if err := schemas.DecodeInto(r.Value, &d); err != nil {
			t.Fatal(err)
		}
		if d.Conflict {
			conflicts++
		} else {
			exact++
		}
	}
	return ids, exact, conflicts
}

// batch returns n CloudEvents (made with the CloudEvents SDK) numbered
// from first, each feeding the three meters of type prompt.
func batch(t testing.TB, first, n int, at time.Time) []cloudevents.Event {
	evs := make([]cloudevents.Event, n)
	for i := range evs {
		k := first + i
		evs[i] = prompt(t, fmt.Sprintf("req-%d", k), fmt.Sprintf("acme-%d", k%7),
			map[string]any{"tokens": map[string]any{"input": k}, "model": fmt.Sprintf("m%d", k%3), "user": fmt.Sprintf("u%d", k%11)})
		evs[i].SetTime(at)
	}
	return evs
}

// A batch posted through the ingest is counted exactly once downstream,
// even when many keep-alive clients post it with duplicates across them.
func TestRealExactlyOnceDownstream(t *testing.T) {
	p := newPipeline(t)
	p.startDedup()
	e := p.server()
	at := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	const clients, perClient, size = 16, 8, 50
	// Client c sends batches of events [c*perClient*size/2, ...): each event
	// is sent by exactly two clients.
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
			base := (c / 2) * perClient * size
			for b := 0; b < perClient; b++ {
				body := mustJSON(t, batch(t, base+b*size, size, at))
				status, _, rb := post(t, hc, e.srv.URL()+"/api/v1/events", "application/cloudevents-batch+json", p.token, body)
				if status != http.StatusNoContent {
					errs <- fmt.Errorf("client %d batch %d: %d %s", c, b, status, rb)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	unique := clients / 2 * perClient * size
	ids, exact, conflicts := p.counted()
	if len(ids) != unique*3 {
		t.Errorf("%d identities counted, want %d (%d events × 3 meters)", len(ids), unique*3, unique)
	}
	for id, n := range ids {
		if n != 1 {
			t.Errorf("%s counted %d times", id, n)
		}
	}
	if exact != unique*3 || conflicts != 0 {
		t.Errorf("usage.duplicates has %d exact copies and %d conflicts, want %d and 0", exact, conflicts, unique*3)
	}
}

// The ingest is killed between Kafka's acknowledgement and its answer: the
// client sees no answer and retries; the retry's events are dropped as
// copies, not counted twice.
func TestRealKilledAfterAck(t *testing.T) {
	p := newPipeline(t)
	bin := testenv.Meterline(t)
	p.startDedup()
	addr, metrics := testenv.FreeAddr(t), testenv.FreeAddr(t)
	args := []string{"ingest", "--brokers", strings.Join(p.brokers, ","), "--topic-prefix", p.names.Prefix,
		"--meters", p.meters, "--addr", addr, "--metrics-addr", metrics}
	ready := "http://" + metrics + "/readyz"
	dir := t.TempDir()
	first := testenv.StartProcessOpts(t, testenv.ProcessOpts{Fault: FaultAfterAck, MayDie: true}, "ingest", filepath.Join(dir, "ingest-1.log"), bin, args...)
	url := "http://" + addr + "/api/v1/events"
	waitReadyz(t, ready)
	body := mustJSON(t, batch(t, 0, 100, time.Now().Add(-time.Minute).Truncate(time.Millisecond)))
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(string(body)))
	req.Header.Set("Content-Type", "application/cloudevents-batch+json")
	req.Header.Set("Authorization", "Bearer "+p.token)
	resp, err := http.DefaultClient.Do(req)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("the first request was answered %d; the ingest should have died before answering", resp.StatusCode)
	}
	t.Logf("first request: %v (the client retries)", err)
	if !first.Wait(30 * time.Second) {
		t.Fatal("the ingest did not die at the fault point")
	}
	testenv.StartProcess(t, "ingest", filepath.Join(dir, "ingest-2.log"), bin, args...)
	waitReadyz(t, ready)
	status, _, rb := post(t, http.DefaultClient, url, "application/cloudevents-batch+json", p.token, body)
	if status != http.StatusNoContent {
		t.Fatalf("retry: %d %s", status, rb)
	}
	ids, exact, conflicts := p.counted()
	if len(ids) != 300 {
		t.Errorf("%d identities counted, want 300 (100 events × 3 meters)", len(ids))
	}
	for id, n := range ids {
		if n != 1 {
			t.Errorf("%s counted %d times", id, n)
		}
	}
	if exact != 300 || conflicts != 0 {
		t.Errorf("usage.duplicates: %d exact copies, %d conflicts; want the retry's 300 and 0", exact, conflicts)
	}
}

// waitReadyz waits until a /readyz url answers 200.
func waitReadyz(t *testing.T, url string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not serving after 60s: %v", url, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
