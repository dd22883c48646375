package ingest

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// BenchmarkRefusalCPU measures the CPU the ingest spends on a refused
// request (cpu-ns/op, as BenchmarkBatchCPU) and the bytes of its answer,
// against a valid request of as many events up to its send: what the
// refusal budget of a key without a rate (Config.RefusalRate) bounds.
// The budget is off here, so that every request is parsed.
func BenchmarkRefusalCPU(b *testing.B) {
	for _, c := range []struct {
		name, ctype string
		body        []byte
		status      int
	}{
		{"empty-objects-1000", "application/json", []byte("[" + strings.TrimSuffix(strings.Repeat("{},", 1000), ",") + "]"), 400},
		{"bad-quantity-1000", "application/json", []byte("[" + strings.TrimSuffix(strings.Repeat(`{"event_id":"x","customer_id":"acme-1","meter":"api_calls","quantity":"no","event_time":"2026-11-29T12:00:00Z"},`, 1000), ",") + "]"), 400},
		{"garbage-1B", "application/json", []byte("x"), 400},
		{"garbage-1MiB", "application/json", bytes.Repeat([]byte("x"), 1<<20-1), 400},
		{"out-of-scope-1000", "application/json", []byte("[" + strings.TrimSuffix(strings.Repeat(`{"event_id":"x","customer_id":"globex-1","meter":"api_calls","quantity":1,"event_time":"2026-11-29T12:00:00Z"},`, 1000), ",") + "]"), 403},
		{"valid-1000-503", "application/json", []byte("[" + strings.TrimSuffix(strings.Repeat(`{"event_id":"x","customer_id":"acme-1","meter":"api_calls","quantity":1,"event_time":"2026-11-29T12:00:00Z"},`, 1000), ",") + "]"), 503},
	} {
		b.Run(c.name, func(b *testing.B) {
			handler, token := benchServer(b, Config{MaxSkew: 1 << 62, RefusalRate: -1}, "acme-*")
			b.SetBytes(int64(len(c.body)))
			var answer int
			cpu0 := cpuTime(b)
			for b.Loop() {
				req := httptest.NewRequest(http.MethodPost, "/v1/events", bytes.NewReader(c.body))
				req.Header.Set("Content-Type", c.ctype)
				req.Header.Set("Authorization", "Bearer "+token)
				w := httptest.NewRecorder()
				handler.ServeHTTP(w, req)
				if w.Code != c.status {
					b.Fatalf("%d %.300s", w.Code, w.Body)
				}
				answer = w.Body.Len()
			}
			b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/op")
			b.ReportMetric(float64(answer), "answer-bytes")
		})
	}
}
