package ingest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/meterline/meterline/internal/kafka"
)

func apiCall(id, customer string) []byte {
	return []byte(fmt.Sprintf(`{"event_id":%q,"customer_id":%q,"meter":"api_calls","quantity":1,"event_time":"2026-11-29T12:00:00Z"}`, id, customer))
}

// A key's rate bounds its events per second: past it, 429 with
// Retry-After, and nothing sent.
func TestRateLimit(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxEvents = 10 })
	_, token, err := e.admin.CreateKey(context.Background(), KeySpec{Tenant: "acme", Rate: 2})
	if err != nil {
		t.Fatal(err)
	}
	waitKeys(t, e.srv, 2)
	batch := "[" + strings.TrimSuffix(strings.Repeat(string(apiCall("x", "acme-1"))+",", 10), ",") + "]"
	// The bucket holds one full request (10 events) at 2 events/s.
	if status, _, b := e.post("/v1/events", "application/json", token, []byte(batch)); status != http.StatusAccepted {
		t.Fatalf("first request: %d %s", status, b)
	}
	status, hdr, b := e.post("/v1/events", "application/json", token, apiCall("y", "acme-1"))
	if status != http.StatusTooManyRequests {
		t.Fatalf("second request: %d %s, want 429", status, b)
	}
	if ra, err := strconv.Atoi(hdr.Get("Retry-After")); err != nil || ra < 1 || ra > 1 {
		t.Errorf("Retry-After %q, want 1 (half a second to the next event, rounded up)", hdr.Get("Retry-After"))
	}
	if p := problem(t, b); p.Type != "urn:meterline:problem:rate-limited" || p.RetryAfter != 1 {
		t.Errorf("problem %+v", p)
	}
	// Another key of the tenant has its own bucket.
	if status, _, b := e.post("/v1/events", "application/json", e.token, apiCall("z", "acme-1")); status != http.StatusAccepted {
		t.Fatalf("other key: %d %s", status, b)
	}
	if n := len(e.records()); n != 11 {
		t.Errorf("%d records, want 11 (the 429 sent nothing)", n)
	}
}

// A key made or revoked through the topic takes effect on every replica,
// without a restart, within a second.
func TestKeysPropagate(t *testing.T) {
	e := newEnv(t, nil)
	second := &env{t: t, brokers: e.brokers, topic: e.topic, keys: e.keys}
	second.start(Config{Addr: "127.0.0.1:0", Kafka: kafka.Config{Brokers: e.brokers}, Topic: e.topic, KeysTopic: e.keys, Meters: e.srv.cfg.Meters})
	key, token, err := e.admin.CreateKey(context.Background(), KeySpec{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	statusOn := func(srv *Server) int {
		s, _, _ := post(t, http.DefaultClient, srv.URL()+"/v1/events", "application/json", token, apiCall("p", "acme-1"))
		return s
	}
	within := func(what string, want int) {
		t.Helper()
		deadline := time.Now().Add(time.Second)
		for _, srv := range []*Server{e.srv, second.srv} {
			for statusOn(srv) != want {
				if time.Now().After(deadline) {
					t.Fatalf("%s: replica %s still answers %d after 1s, want %d", what, srv.Addr(), statusOn(srv), want)
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
	}
	within("created", http.StatusAccepted)
	if _, err := e.admin.RevokeKey(context.Background(), key.ID); err != nil {
		t.Fatal(err)
	}
	within("revoked", http.StatusUnauthorized)
	keys, tenants, err := e.admin.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 || len(tenants) != 1 || tenants[0].Name != "acme" {
		t.Fatalf("List: %+v %+v", keys, tenants)
	}
	for _, k := range keys {
		if k.ID == key.ID && k.Active() {
			t.Error("revoked key listed as active")
		}
		if strings.Contains(fmt.Sprint(k), token) || strings.Contains(fmt.Sprint(k), strings.SplitN(token, "_", 3)[2]) {
			t.Error("a stored key holds its token")
		}
	}
}

// A token is checked against its stored hash: a token with a known ID but
// another secret is refused, as is anything not shaped like a token.
func TestTokenChecks(t *testing.T) {
	e := newEnv(t, nil)
	id := tokenID(e.token)
	forged := tokenPrefix + id + "_" + strings.Repeat("A", 43)
	for _, tok := range []string{forged, "mlk_" + id, "nonsense", e.token + "x", strings.ToUpper(e.token)} {
		if s, _, b := e.post("/v1/events", "application/json", tok, apiCall("f", "acme-1")); s != http.StatusUnauthorized {
			t.Errorf("token %q: %d %s, want 401", tok, s, b)
		}
	}
	if s, _, b := e.post("/v1/events", "application/json", e.token, apiCall("f", "acme-1")); s != http.StatusAccepted {
		t.Errorf("the real token: %d %s", s, b)
	}
}

// With Kafka gone, a request is answered 503 with Retry-After within a
// bounded time, never with success.
func TestKafkaDown(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.ProduceTimeout = time.Second; c.ShutdownTimeout = 3 * time.Second })
	if s, _, b := e.post("/v1/events", "application/json", e.token, apiCall("before", "acme-1")); s != http.StatusAccepted {
		t.Fatalf("before: %d %s", s, b)
	}
	e.cluster.Close()
	start := time.Now()
	var wg sync.WaitGroup
	statuses := make([]int, 8)
	headers := make([]http.Header, 8)
	for i := range statuses {
		wg.Add(1)
		go func() {
			defer wg.Done()
			statuses[i], headers[i], _ = e.post("/v1/events", "application/json", e.token, apiCall(fmt.Sprint("down-", i), "acme-1"))
		}()
	}
	wg.Wait()
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("answers took %s, want within ProduceTimeout + a few seconds", el)
	}
	for i, s := range statuses {
		if s != http.StatusServiceUnavailable || headers[i].Get("Retry-After") == "" {
			t.Errorf("request %d: %d (Retry-After %q), want 503 with Retry-After", i, s, headers[i].Get("Retry-After"))
		}
	}
}

// Graceful shutdown: the listener closes, and every request in flight is
// answered (here: success) before Run returns.
func TestGracefulShutdown(t *testing.T) {
	e := newEnv(t, nil)
	// A request whose body arrives slowly is in flight when the shutdown
	// starts.
	body := apiCall("slow", "acme-1")
	conn := startSlowRequest(t, e.srv.Addr(), e.token, body)
	time.Sleep(100 * time.Millisecond)
	stopped := make(chan error, 1)
	go func() { stopped <- e.stop() }()
	time.Sleep(200 * time.Millisecond)
	if c, err := net.DialTimeout("tcp", e.srv.Addr(), time.Second); err == nil {
		c.Close()
		t.Error("the listener still accepts during the shutdown")
	}
	if _, err := conn.Write(body[10:]); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := conn.Read(buf)
	if err != nil || !strings.HasPrefix(string(buf[:n]), "HTTP/1.1 202") {
		t.Fatalf("in-flight request answered %q, %v; want 202", buf[:n], err)
	}
	if err := <-stopped; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := len(e.records()); n != 1 {
		t.Errorf("%d records, want 1", n)
	}
}

// TLS: with a certificate and key, the server speaks HTTPS only.
func TestTLS(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, pool := selfSigned(t, dir)
	e := newEnv(t, func(c *Config) { c.TLSCertFile, c.TLSKeyFile = certFile, keyFile })
	if !strings.HasPrefix(e.srv.URL(), "https://") {
		t.Fatalf("URL %s", e.srv.URL())
	}
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	if s, _, b := post(t, c, e.srv.URL()+"/v1/events", "application/json", e.token, apiCall("tls", "acme-1")); s != http.StatusAccepted {
		t.Fatalf("over TLS: %d %s", s, b)
	}
	resp, err := http.Post("http://"+e.srv.Addr()+"/v1/events", "application/json", strings.NewReader("{}"))
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("plain HTTP got %d, want the TLS server's 400", resp.StatusCode)
		}
	}
}

// Metrics per tenant and status code, and a latency histogram; the token
// appears in no metric.
func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := newEnv(t, func(c *Config) { c.Registerer = reg })
	e.post("/v1/events", "application/json", e.token, apiCall("m1", "acme-1"))
	e.post("/v1/events", "application/json", e.token, apiCall("m2", "globex"))
	e.post("/v1/events", "application/json", "", apiCall("m3", "acme-1"))
	// The answer goes out before the request's bookkeeping
	// (TestAnswerBeforeBookkeeping): the last request's count may follow
	// its response by a moment.
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		err = testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP meterline_ingest_requests_total HTTP ingest requests by tenant ("none" without a valid key) and status code.
# TYPE meterline_ingest_requests_total counter
meterline_ingest_requests_total{code="202",tenant="acme"} 1
meterline_ingest_requests_total{code="401",tenant="none"} 1
meterline_ingest_requests_total{code="403",tenant="acme"} 1
`), "meterline_ingest_requests_total")
		if err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Error(err)
	}
	// One series per endpoint, from the start: openmeter's at 0.
	if n := testutil.CollectAndCount(reg, "meterline_ingest_request_duration_seconds"); n != 2 {
		t.Errorf("%d latency series, want 2 (endpoints meterline and openmeter)", n)
	}
	mfs, _ := reg.Gather()
	if strings.Contains(fmt.Sprint(mfs), e.token) || strings.Contains(fmt.Sprint(mfs), tokenID(e.token)) {
		t.Error("a key appears in the metrics")
	}
	tab := e.srv.Status()
	if len(tab.Rows) != 2 || tab.Rows[0][0] != "acme" || tab.Rows[0][1] != "1" || tab.Rows[0][2] != "1" || tab.Rows[0][7] != "1" {
		t.Errorf("status rows %v", tab.Rows)
	}
}

func selfSigned(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// A body that arrives slowly, within the read timeout, is still answered:
// the write timeout counts from the end of the body, not from the
// request's headers. (Counted from the headers, a body that took longer
// than the write timeout was read and its events written to Kafka, but
// the answer was cut off: the client saw the connection close.)
func TestSlowBodyAnswered(t *testing.T) {
	var cfg Config
	e := newEnv(t, func(c *Config) { cfg = *c })
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv.srv.WriteTimeout = 500 * time.Millisecond // before Run: no race
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitReady(t, srv)

	body := apiCall("slow-body", "acme-1")
	conn := startSlowRequest(t, srv.Addr(), e.token, body)
	time.Sleep(time.Second) // longer than the write timeout, shorter than the read timeout
	if _, err := conn.Write(body[10:]); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(io.LimitReader(conn, 12))
	if err != nil || string(b) != "HTTP/1.1 202" {
		t.Fatalf("a slow body was answered %q, %v; want 202", b, err)
	}
}

// startSlowRequest sends a POST of body to /v1/events on addr with only
// the body's first 10 bytes; the caller writes the rest on the connection
// returned (closed when the test ends).
func startSlowRequest(t *testing.T, addr, token string, body []byte) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	fmt.Fprintf(conn, "POST /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", token, len(body))
	if _, err := conn.Write(body[:10]); err != nil {
		t.Fatal(err)
	}
	return conn
}

// Refused events are counted by reason code (docs/design.md, Bad input):
// each event an answer names under the code of its first error, never by
// producer text.
func TestRefusedEventsByReason(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := newEnv(t, func(c *Config) { c.Registerer = reg })
	big := strings.Repeat("x", 1000)
	props := make([]string, 20)
	for i := range props {
		props[i] = fmt.Sprintf("%q:%q", fmt.Sprintf("p%d", i), big)
	}
	oversized := fmt.Sprintf(`{"event_id":"big","customer_id":"acme-1","meter":"api_calls","quantity":1,"event_time":"2026-11-29T12:00:00Z","properties":{%s}}`,
		strings.Join(props, ","))
	invalid := `{"event_id":"neg","customer_id":"acme-1","meter":"api_calls","quantity":-1,"event_time":"2026-11-29T12:00:00Z"}`
	for _, body := range []string{oversized, invalid, "[" + invalid + "," + string(apiCall("ok", "acme-1")) + "]"} {
		if status, _, b := e.post("/v1/events", "application/json", e.token, []byte(body)); status != http.StatusBadRequest {
			t.Fatalf("%d %s, want 400", status, b)
		}
	}
	// The answer goes out before the request's bookkeeping.
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		err = testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP meterline_ingest_refused_events_total Events the HTTP ingest refused that its answer names, by tenant and reason code: invalid, oversized, in_future, too_old, unknown_meter, unknown_event_type (400), out_of_scope (403), over_limit (402, the quota gate), too_many_events (413, each event of a request of more than --max-events), other (a code not listed here). An event with several errors counts once, under its first; the valid events of a refused request count only in meterline_ingest_events_total{outcome="refused"}.
# TYPE meterline_ingest_refused_events_total counter
meterline_ingest_refused_events_total{reason="invalid",tenant="acme"} 2
meterline_ingest_refused_events_total{reason="oversized",tenant="acme"} 1
`), "meterline_ingest_refused_events_total")
		if err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Error(err)
	}
}

// TestRefusedRequestsByProblem: every request answered with a problem is
// counted under its problem type, whether or not its events are known:
// a body that is not JSON, one that broke off, one too large, a content
// type or coding refused carry no event to count under a reason, and a
// 400 of those is, by its status alone, one of invalid events.
func TestRefusedRequestsByProblem(t *testing.T) {
	reg := prometheus.NewRegistry()
	// No refusal budget: the refusals below would spend it.
	e := newEnv(t, func(c *Config) { c.Registerer = reg; c.RefusalRate = -1 })
	ce := "application/cloudevents+json"
	ev := `{"specversion":"1.0","id":"p1","source":"s","type":"prompt","subject":"acme-1","time":"2026-11-29T12:00:00Z","data":{"tokens":{"input":5},"user":"u"}}`
	for _, c := range []struct {
		body   string
		extra  http.Header
		status int
	}{
		{`{"specversion":`, nil, http.StatusBadRequest},                                     // malformed
		{`[` + ev + `,` + ev + `]`, nil, http.StatusBadRequest},                             // malformed: an array as one event
		{ev, http.Header{"Content-Encoding": {"gzip"}}, http.StatusUnsupportedMediaType},    // unsupported-media-type
		{strings.Replace(ev, `"acme-1"`, `"acme-\u0007"`, 1), nil, http.StatusBadRequest},   // invalid-events
		{strings.Replace(ev, `"acme-1"`, `"other"`, 1), nil, http.StatusForbidden},          // forbidden
		{strings.Repeat(" ", DefaultMaxBodyBytes+1), nil, http.StatusRequestEntityTooLarge}, // too-large
		{ev, nil, http.StatusNoContent},                                                     // accepted: no problem
	} {
		if status, b := e.postWith("/api/v1/events", ce, []byte(c.body), c.extra); status != c.status {
			t.Fatalf("%.40s: %d %s, want %d", c.body, status, b, c.status)
		}
	}
	if status, _, b := e.post("/api/v1/events", ce, "mlk_0000000000000000_x", []byte(ev)); status != http.StatusUnauthorized {
		t.Fatalf("unknown key: %d %s", status, b)
	}
	if status, _, b := e.post("/api/v1/event", ce, e.token, []byte(ev)); status != http.StatusNotFound {
		t.Fatalf("another path: %d %s", status, b)
	}
	// A body that breaks off: unreadable-body.
	conn := startSlowRequest(t, e.srv.Addr(), e.token, []byte(ev))
	if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if b, err := io.ReadAll(io.LimitReader(conn, 12)); err != nil || string(b) != "HTTP/1.1 400" {
		t.Fatalf("a body that broke off was answered %q, %v; want 400", b, err)
	}
	// The requests above, and every other problem type at 0 for requests
	// without a valid key (exported from the start).
	counts := map[[2]string]int{{"acme", "forbidden"}: 1, {"acme", "invalid-events"}: 1, {"acme", "malformed"}: 2, {"none", "not-found"}: 1,
		{"acme", "too-large"}: 1, {"none", "unauthorized"}: 1, {"acme", "unreadable-body"}: 1, {"acme", "unsupported-media-type"}: 1,
		{"none", problemMalformedRequest}: 0}
	for _, p := range problemTypes {
		if _, ok := counts[[2]string{"none", p}]; !ok {
			counts[[2]string{"none", p}] = 0
		}
	}
	var lines []string
	for k, n := range counts {
		lines = append(lines, fmt.Sprintf("meterline_ingest_refused_requests_total{problem=%q,tenant=%q} %d", k[1], k[0], n))
	}
	slices.Sort(lines)
	want := "\n# HELP meterline_ingest_refused_requests_total Requests the HTTP ingest answered with a problem (RFC 9457), by tenant (\"none\" without a valid key) and problem type (the type's last part: malformed, unreadable-body, invalid-events, forbidden, too-large, unsupported-media-type, unauthorized, not-found, rate-limited, ...), whether or not their events are known; malformed-request (tenant none) counts the requests net/http refused itself before the handler, answered in plain text (400, 431, 501 or 505: a request line or header it cannot parse, headers too large).\n# TYPE meterline_ingest_refused_requests_total counter\n" + strings.Join(lines, "\n") + "\n"
	// The answer goes out before the request's bookkeeping.
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if err = testutil.GatherAndCompare(reg, strings.NewReader(want), "meterline_ingest_refused_requests_total"); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Error(err)
	}
}

// TestServerErrorLog: what net/http reports besides the handler's answers
// (a TLS handshake that failed, a panic) reaches the logger at Warn, at
// most errorLogBurst lines at once, since a client can cause one per
// connection; the next line counts those left out.
func TestServerErrorLog(t *testing.T) {
	core, logs := observer.New(zap.DebugLevel)
	e := newEnv(t, func(c *Config) { c.Logger = zap.New(core) })
	for i := range 5 * errorLogBurst {
		e.srv.srv.ErrorLog.Printf("http: TLS handshake error from 192.0.2.1:%d: EOF", 1000+i)
	}
	got := logs.FilterLevelExact(zap.WarnLevel).All()
	if len(got) != errorLogBurst || !strings.Contains(got[0].Message, "TLS handshake error from 192.0.2.1:1000") {
		t.Fatalf("%d lines at Warn, the first %+v; want %d, of the first handshake", len(got), got, errorLogBurst)
	}
	time.Sleep(time.Second + 100*time.Millisecond) // a line's worth of the rate
	e.srv.srv.ErrorLog.Print("http: panic serving 192.0.2.1:9: boom")
	got = logs.FilterLevelExact(zap.WarnLevel).All()
	last := got[len(got)-1]
	if len(got) != errorLogBurst+1 || !strings.Contains(last.Message, "panic serving") || last.ContextMap()["left_out"] != int64(4*errorLogBurst) {
		t.Fatalf("after a second: %d lines, the last %+v; want the panic, counting %d left out", len(got), last, 4*errorLogBurst)
	}
}

// TestProblemTypesListed: every problem code the ingest answers with is in
// problemTypes, exported from the start, so that a rule selecting a type
// by name finds its series.
func TestProblemTypesListed(t *testing.T) {
	literal := regexp.MustCompile(`writeProblem\([^,]+,[^,]+, "([a-z-]+)"`)
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	codes := map[string]bool{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range literal.FindAllStringSubmatch(string(b), -1) {
			codes[m[1]] = true
		}
	}
	for _, f := range kafkaFailures {
		codes[f.problem] = true
	}
	if len(codes) < 10 {
		t.Fatalf("found %d problem codes in the sources; the pattern is stale", len(codes))
	}
	for c := range codes {
		if !slices.Contains(problemTypes, c) {
			t.Errorf("problem %q is not in problemTypes", c)
		}
	}
	for _, c := range problemTypes {
		if !codes[c] {
			t.Errorf("problemTypes names %q, which nothing answers with", c)
		}
	}
}
