package ingest

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestTransientBrokerErrorsHeal: while the events topic's produce requests
// fail with a transient error for longer than --produce-timeout, every
// request is answered 503 with a body saying what to do, never 2xx; once
// the error is gone the same server answers 202 again, and the topic holds
// every event answered 202 once, and those answered 503 at most once (a
// produce request that timed out may have been written: the 503 says so,
// and kgo's idempotent retries write it once).
func TestTransientBrokerErrorsHeal(t *testing.T) {
	for _, kerrErr := range []*kerr.Error{kerr.NotLeaderForPartition, kerr.RequestTimedOut, kerr.NotEnoughReplicas, kerr.LeaderNotAvailable} {
		t.Run(kerrErr.Message, func(t *testing.T) {
			t.Parallel() // each on its own kfake cluster
			e := newEnv(t, func(c *Config) { c.ProduceTimeout = time.Second })
			if s, _, b := e.post("/v1/events", "application/json", e.token, apiCall("before", "acme-1")); s != http.StatusAccepted {
				t.Fatalf("before: %d %s", s, b)
			}
			faults := []kfake.Fault{{Keys: []kmsg.Key{kmsg.Produce}, Topic: e.topic, Err: kerrErr, Count: -1}}
			if kerrErr == kerr.NotLeaderForPartition || kerrErr == kerr.LeaderNotAvailable {
				faults = append(faults, kfake.Fault{Keys: []kmsg.Key{kmsg.Metadata}, Topic: e.topic, Err: kerr.LeaderNotAvailable, Count: -1})
			}
			h := e.cluster.Fault(faults...)
			for i := range 3 {
				s, _, b := e.post("/v1/events", "application/json", e.token, apiCall(fmt.Sprint("down-", i), "acme-1"))
				if s != http.StatusServiceUnavailable || !strings.Contains(string(b), "retry the same request") {
					t.Errorf("during the fault: %d %s; want 503 saying to retry", s, b)
				}
			}
			h.Remove()
			accepted := []string{"before"}
			deadline := time.Now().Add(20 * time.Second)
			for i := 0; ; i++ {
				id := fmt.Sprint("after-", i)
				s, _, b := e.post("/v1/events", "application/json", e.token, apiCall(id, "acme-1"))
				if s == http.StatusAccepted {
					accepted = append(accepted, id)
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the fault removed, requests are still answered %d %s", s, b)
				}
				time.Sleep(200 * time.Millisecond)
			}
			for i := range 3 {
				id := fmt.Sprint("later-", i)
				if s, _, b := e.post("/v1/events", "application/json", e.token, apiCall(id, "acme-1")); s != http.StatusAccepted {
					t.Fatalf("after recovery: %d %s", s, b)
				}
				accepted = append(accepted, id)
			}
			got := map[string]int{}
			for _, r := range e.records() {
				got[r.EventID]++
			}
			for _, id := range accepted {
				if got[id] != 1 {
					t.Errorf("event %s answered 202 is in the topic %d times", id, got[id])
				}
			}
			for id, n := range got {
				if strings.HasPrefix(id, "down-") && (n > 1 || n == 1 && kerrErr != kerr.RequestTimedOut) {
					t.Errorf("event %s answered 503 is in the topic %d times", id, n)
				}
			}
		})
	}
}

// TestRecordsRefusedForGood: Kafka refusing every record of a request
// for good (MESSAGE_TOO_LARGE: the events topic's max.message.bytes set
// below an event; INVALID_RECORD) is answered 503 kafka-refused, saying
// that none was written and that retrying does not help until the
// topic is fixed, not "not acknowledged in time"; counted under reason
// refused. Once the topic is fixed the server serves again.
func TestRecordsRefusedForGood(t *testing.T) {
	for _, refusal := range []*kerr.Error{kerr.MessageTooLarge, kerr.InvalidRecord} {
		t.Run(refusal.Message, func(t *testing.T) {
			e := newEnv(t, func(c *Config) { c.ProduceTimeout = 2 * time.Second })
			h := e.cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: e.topic, Err: refusal, Count: -1})
			s, _, b := e.post("/v1/events", "application/json", e.token, apiCall("refused", "acme-1"))
			p := problem(t, b)
			if s != http.StatusServiceUnavailable || !strings.HasSuffix(p.Type, ":kafka-refused") ||
				!strings.Contains(p.Detail, "none was written") {
				t.Fatalf("refused for good: %d %s; want 503 kafka-refused saying none was written", s, b)
			}
			h.Remove()
			if s, _, b := e.post("/v1/events", "application/json", e.token, apiCall("fixed", "acme-1")); s != http.StatusAccepted {
				t.Fatalf("after the fix: %d %s", s, b)
			}
		})
	}
}
