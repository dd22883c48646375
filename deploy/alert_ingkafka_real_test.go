package deploy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/meterline/meterline/ingest"
	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/secret"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/topics"
)

// TestRealIngestKafkaFailingAlert runs the shipped alert rules (scaled as
// TestRealAlertsFire's, realScale) in a real Prometheus scraping a real
// `meterline ingest` on an in-process Kafka with SASL and ACLs (kfake),
// its principal granted Write on the events topic, while a client posts
// an event every 100 ms:
//
//  1. Every request is accepted; MeterlineIngestKafkaFailing is never
//     active.
//  2. The Write ACL deleted: every request is answered 503
//     not-authorized, and the alert fires for reason not_authorized.
//  3. The ACL granted again: the requests are accepted, and the alert
//     resolves.
//  4. Every other request's body is not JSON: those are answered 400
//     malformed, and MeterlineIngestRequestsRefused fires for problem
//     malformed (and never before: the 503s of step 2 are Kafka's).
//  5. Every body is JSON again: the alert resolves.
func TestRealIngestKafkaFailingAlert(t *testing.T) {
	promBin := realPrometheus(t, "alert rules")
	parallelAlertTest(t)
	work := testenv.LogDir(t, "meterline-alerts-ingkafka-test-*")
	bin := testenv.Meterline(t)

	names := topics.DefaultNames()
	acl := func(topic string, op kmsg.ACLOperation) kfake.ACL {
		return kfake.ACL{Resource: kmsg.ACLResourceTypeTopic, Name: topic, Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: op, Allow: true}
	}
	_, brokers := testenv.KFake(t, kfake.EnableSASL(), kfake.EnableACLs(), kfake.SeedTopics(2, names.EventsTopic()),
		kfake.SeedTopics(1, names.KeysTopic(), names.BalancesTopic()),
		kfake.Superuser(kafka.ScramSHA512, "admin", "pw-admin"),
		kfake.User(kafka.ScramSHA512, "ingest", "pw-ingest", acl(names.EventsTopic(), kmsg.ACLOperationWrite),
			acl(names.KeysTopic(), kmsg.ACLOperationRead), acl(names.BalancesTopic(), kmsg.ACLOperationRead)))
	cl, err := kafka.NewClient(kafka.Config{Brokers: brokers,
		SASL: kafka.SASL{Mechanism: kafka.ScramSHA512, User: "admin", Password: secret.New("pw-admin")}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, token, err := ingest.NewAdmin(cl, names.KeysTopic()).CreateKey(ctx, ingest.KeySpec{Tenant: "acme", Customers: []string{"*"}})
	if err != nil {
		t.Fatal(err)
	}
	pwFile := filepath.Join(work, "ingest.password")
	if err := os.WriteFile(pwFile, []byte("pw-ingest\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	ingestAddr, metricsAddr := testenv.FreeAddr(t), testenv.FreeAddr(t)
	w := watchScaledRules(t, promBin, work, metricsAddr)
	proc := testenv.StartProcess(t, "ingest", filepath.Join(work, "ingest.log"), bin, "ingest",
		"--brokers", strings.Join(brokers, ","), "--kafka-sasl-mechanism", "SCRAM-SHA-512", "--kafka-sasl-user", "ingest",
		"--kafka-sasl-password-file", pwFile, "--log-level", "info", "--produce-timeout", "2s",
		"--addr", ingestAddr, "--metrics-addr", metricsAddr, "--auth-max-age", realKeysAuthMaxAge.String())
	waitHTTP(t, "http://"+metricsAddr+"/readyz", 90*time.Second)

	// The client: an event every 100 ms, counting the answers by status.
	var mu sync.Mutex
	statuses := map[int]int{}
	counts := func() map[int]int {
		mu.Lock()
		defer mu.Unlock()
		out := map[int]int{}
		for k, v := range statuses {
			out[k] = v
			delete(statuses, k)
		}
		return out
	}
	var malformed atomic.Bool // every other body is not JSON
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
			var resp *http.Response
			var err error
			if malformed.Load() && i%2 == 0 {
				resp, err = postBody(rctx, "http://"+ingestAddr+"/v1/events", token, "application/json", "not json")
			} else {
				resp, _, err = postEvent(rctx, "http://"+ingestAddr+"/v1/events", token, fmt.Sprintf("e-%d", i), "cust-1", 1)
			}
			rcancel()
			mu.Lock()
			if err != nil {
				statuses[0]++
			} else {
				statuses[resp.StatusCode]++
			}
			mu.Unlock()
		}
	}()
	halt := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer halt()
	refused := map[string]string{"reason": "not_authorized"}

	t.Log("---- 1. Write granted: every request accepted")
	for start := time.Now(); time.Since(start) < 15*time.Second; time.Sleep(500 * time.Millisecond) {
		if a := w.find("MeterlineIngestKafkaFailing", nil); a != nil {
			t.Fatalf("MeterlineIngestKafkaFailing active while Kafka takes every record: %v", a)
		}
	}
	if c := counts(); len(c) != 1 || c[http.StatusAccepted] == 0 {
		t.Fatalf("answers with Write granted: %v; want 202 only", c)
	}
	w.expectQuiet("Write granted")

	t.Log("---- 2. Write on the events topic deleted")
	write := kadm.NewACLs().Topics(names.EventsTopic()).ResourcePatternType(kadm.ACLPatternLiteral).
		Operations(kadm.OpWrite).Allow("User:ingest").AllowHosts()
	adm := kadm.NewClient(cl)
	if res, err := adm.DeleteACLs(ctx, write); err != nil || len(res) == 0 || len(res[0].Deleted) != 1 {
		t.Fatalf("deleting the Write ACL: %+v %v", res, err)
	}
	w.waitFiring("MeterlineIngestKafkaFailing", refused)
	if c := counts(); c[http.StatusServiceUnavailable] == 0 {
		t.Errorf("answers without Write: %v; want 503s", c)
	}
	w.expectOnly("Write deleted", "MeterlineIngestKafkaFailing")
	if a := w.find("MeterlineIngestKafkaFailing", map[string]string{"reason": "not_acknowledged"}); a != nil {
		t.Errorf("refused writes alert as not acknowledged: %v", a)
	}

	t.Log("---- 3. Write granted again")
	if res, err := adm.CreateACLs(ctx, write); err != nil || len(res) != 1 || res[0].Err != nil {
		t.Fatalf("granting Write again: %+v %v", res, err)
	}
	w.waitResolved("MeterlineIngestKafkaFailing", refused)
	if c := counts(); c[http.StatusAccepted] == 0 {
		t.Errorf("answers with Write granted again: %v; want 202s", c)
	}
	w.expectQuiet("Write granted again")

	t.Log("---- 4. every other body not JSON")
	malformedAlert := map[string]string{"problem": "malformed"}
	malformed.Store(true)
	w.waitFiring("MeterlineIngestRequestsRefused", malformedAlert)
	if c := counts(); c[http.StatusBadRequest] == 0 || c[http.StatusAccepted] == 0 {
		t.Errorf("answers with every other body not JSON: %v; want 400s and 202s", c)
	}
	w.expectOnly("bodies not JSON", "MeterlineIngestRequestsRefused")

	t.Log("---- 5. every body JSON again")
	malformed.Store(false)
	w.waitResolved("MeterlineIngestRequestsRefused", malformedAlert)
	w.expectRulesHealthy()
	w.expectFired(realIngestKafkaAlertsFired)
	halt()
	proc.Stop(t)
}

// postBody posts body as contentType with token, and returns the answer
// (its body read and closed).
func postBody(ctx context.Context, url, token, contentType, body string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", contentType)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return resp, err
}
