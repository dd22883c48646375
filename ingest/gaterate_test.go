package ingest

import (
	"context"
	"net/http"
	"testing"

	"github.com/meterline/meterline/schemas"
)

// TestGateRefusalsTakeFromARate: a 402 of a key with a rate takes its
// events from the key's bucket, as the same request accepted would (the
// bucket is checked before the gate), as docs/ingest.md says: with a
// bucket of 10 events, the fourth request of 3 events over the cap is
// answered 429, not 402.
func TestGateRefusalsTakeFromARate(t *testing.T) {
	e, _, _ := gateEnv(t, func(c *Config) { c.MaxEvents = 10 })
	_, token, err := e.admin.CreateKey(context.Background(), KeySpec{Tenant: "acme", Rate: 1})
	if err != nil {
		t.Fatal(err)
	}
	waitKeys(t, e.srv, 2)
	e.putBalances(balance("acme-1", 1, 5000, 5000, schemas.OnLimitReject))
	over := batchOf(jobAt("j1", "acme-1", nov29), jobAt("j2", "acme-1", nov29), jobAt("j3", "acme-1", nov29))
	for i := range 3 {
		if status, _, b := e.post("/api/v1/events", "application/cloudevents-batch+json", token, over); status != http.StatusPaymentRequired {
			t.Fatalf("request %d over the cap: %d %s, want 402", i, status, b)
		}
	}
	if status, _, b := e.post("/api/v1/events", "application/cloudevents-batch+json", token, over); status != http.StatusTooManyRequests {
		t.Fatalf("a fourth request of 3 events, 9 of the bucket's 10 taken by 402s: %d %s, want 429", status, b)
	}
}
