package ingest

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/cegen"
	"github.com/meterline/meterline/internal/kafka"
)

// BenchmarkBatchCPU measures the CPU the ingest spends on a request of 100
// CloudEvents (each feeding three meters) up to the send: the key, the
// parse, the mapping, validation and encoding. Kafka is not involved: the
// server refuses to produce (503), as when its buffer is full. Besides
// ns/op it reports cpu-ns/op, the process's CPU time (user and system, GC
// included) per request, which a loaded machine disturbs less than the
// wall clock.
func BenchmarkBatchCPU(b *testing.B) {
	handler, token := benchServer(b, Config{}, "*")
	body := benchBody(100)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	cpu0 := cpuTime(b)
	for b.Loop() {
		req := httptest.NewRequest(http.MethodPost, "/api/v1/events", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/cloudevents-batch+json")
		req.Header.Set("Authorization", "Bearer "+token)
		w := httptest.NewRecorder()
		handler.ServeHTTP(w, req)
		if w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), "Kafka unavailable") {
			b.Fatalf("%d %s", w.Code, w.Body)
		}
	}
	b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/op")
}

// benchServer is a server with cfg that produces nothing (every request
// stops before its records are produced, 503), and a key of tenant acme
// whose customers are customers, whose token it returns; closed when b
// ends.
func benchServer(b *testing.B, cfg Config, customers string) (http.Handler, string) {
	b.Helper()
	cfg.Addr, cfg.Kafka, cfg.Meters = "127.0.0.1:0", kafka.Config{Brokers: []string{"127.0.0.1:1"}}, mustCatalog(b)
	if cfg.MaxAge == 0 {
		cfg.MaxAge = -1 // the events carry fixed times (newEnvOn)
	}
	srv, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(srv.close)
	srv.maxBuffered = -1
	id, token, _ := newToken()
	h := hashToken(token)
	k := Key{ID: id, Tenant: "acme", Customers: []string{customers}, Hash: fmt.Sprintf("%x", h[:])}
	srv.keys.apply(keyRecordKey(id), encodeRecord(record{Key: &k}))
	srv.keys.apply(tenantRecordKey("acme"), encodeRecord(record{Tenant: &Tenant{Name: "acme", Customers: []string{customers}}}))
	srv.keys.markLoaded()
	return srv.Handler(), token
}

// cpuTime is the CPU time (user and system) the process has used.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchBody is a request of n CloudEvents of type prompt.
func benchBody(n int) []byte {
	return cegen.Batch(n, func(i int) cegen.Event {
		return cegen.Event{ID: fmt.Sprint("req-", i), Source: "bench", Type: "prompt", Subject: fmt.Sprintf("acme-%d", i%100),
			Time: time.Now().Add(-time.Minute).UTC().Format(time.RFC3339Nano), Data: map[string]any{"tokens": map[string]any{"input": i}, "model": "m1", "user": "u"}}
	})
}

// BenchmarkParseCloudEvent measures the decoding and checks of one
// CloudEvent off the fast path (application/cloudevents+json, or an
// element of a batch the scan does not take), with an extension
// attribute.
func BenchmarkParseCloudEvent(b *testing.B) {
	ev := []byte(`{"specversion":"1.0","id":"req-1","source":"bench","type":"prompt","subject":"acme-1","time":"2026-11-29T12:00:00.250Z","traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01","data":{"tokens":{"input":12},"model":"m1","user":"u"}}`)
	b.ReportAllocs()
	b.SetBytes(int64(len(ev)))
	cpu0 := cpuTime(b)
	for b.Loop() {
		if _, fe := parseCloudEvent(ev); fe != nil {
			b.Fatal(fe)
		}
	}
	b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/op")
}

// BenchmarkDecodeBatch measures the fast path's decoding of a batch of 100
// CloudEvents, each with an extension attribute.
func BenchmarkDecodeBatch(b *testing.B) {
	body := bytes.ReplaceAll(benchBody(100), []byte(`"specversion"`), []byte(`"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01","specversion"`))
	text := string(body)
	var as []ceAttrs
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	cpu0 := cpuTime(b)
	for b.Loop() {
		var ok bool
		if as, ok = decodeBatch(as, body, text, DefaultMaxEvents); !ok || len(as) != 100 {
			b.Fatal("not decoded")
		}
	}
	b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/op")
}
