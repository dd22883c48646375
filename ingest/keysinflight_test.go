package ingest

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestKeyRevokedWhileBodyArrives: a request whose headers came with a
// valid key, and whose body arrives after the key was revoked and the
// replica has read the revocation, is answered 401 and sends nothing:
// a revoked key takes effect from the moment the record reaches the
// replica, not only for requests whose headers come after it. So does a
// tenant narrowed meanwhile: the request is held to the tenant's
// customers as they are when its body has arrived.
func TestKeyRevokedWhileBodyArrives(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.NoGate = true })
	ctx := context.Background()
	body := mustJSON(t, prompt(t, "e1", "acme-1", map[string]any{"tokens": map[string]any{"input": 1}, "model": "m", "user": "u"}))

	// slow sends the headers, then calls between once the replica holds
	// the request in flight, then sends the body.
	slow := func(token string, between func()) (int, []byte) {
		pr, pw := io.Pipe()
		req, err := http.NewRequest(http.MethodPost, e.srv.URL()+"/api/v1/events", pr)
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = int64(len(body))
		req.Header.Set("Content-Type", "application/cloudevents+json")
		req.Header.Set("Authorization", "Bearer "+token)
		type answer struct {
			code int
			b    []byte
			err  error
		}
		done := make(chan answer, 1)
		go func() {
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				done <- answer{err: err}
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			done <- answer{code: resp.StatusCode, b: b}
		}()
		deadline := time.Now().Add(10 * time.Second)
		for e.srv.inflight.count() == 0 {
			if time.Now().After(deadline) {
				t.Fatal("the request never got in flight")
			}
			time.Sleep(5 * time.Millisecond)
		}
		between()
		if _, err := pw.Write(body); err != nil {
			t.Fatal(err)
		}
		_ = pw.Close()
		a := <-done
		if a.err != nil {
			t.Fatal(a.err)
		}
		return a.code, a.b
	}
	waitRefused := func(token string) {
		deadline := time.Now().Add(10 * time.Second)
		for k, _ := e.srv.keys.Authenticate(token); k != nil; k, _ = e.srv.keys.Authenticate(token) {
			if time.Now().After(deadline) {
				t.Fatal("the replica never read the revocation")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}

	// Revoked while the body arrives.
	id := tokenID(e.token)
	code, b := slow(e.token, func() {
		if _, err := e.admin.RevokeKey(ctx, id); err != nil {
			t.Fatal(err)
		}
		waitRefused(e.token)
	})
	if code != http.StatusUnauthorized {
		t.Errorf("body sent after the key was revoked: %d %s, want 401", code, b)
	}
	// Counted as a 401 from the headers is: without a valid key (once the
	// answer is out: the metrics come after it).
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		got := testutil.ToFloat64(e.srv.metrics.requests.WithLabelValues(noTenant, "401"))
		if got == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("%v requests of tenant %s answered 401, want 1", got, noTenant)
			break
		}
	}

	// The tenant narrowed while the body arrives.
	_, token, err := e.admin.CreateKey(ctx, KeySpec{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for k, _ := e.srv.keys.Authenticate(token); k == nil; k, _ = e.srv.keys.Authenticate(token) {
		if time.Now().After(deadline) {
			t.Fatal("the replica never read the new key")
		}
		time.Sleep(5 * time.Millisecond)
	}
	code, b = slow(token, func() {
		if _, err := e.admin.SetTenant(ctx, "acme", []string{"acme-eu-*"}); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			if _, tn := e.srv.keys.Authenticate(token); tn != nil && tn.Customers[0] == "acme-eu-*" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the replica never read the tenant")
			}
		}
	})
	if code != http.StatusForbidden {
		t.Errorf("customer dropped from the tenant while the body arrived: %d %s, want 403", code, b)
	}
	if recs := e.records(); len(recs) != 0 {
		t.Errorf("%d records written, want none", len(recs))
	}
}
