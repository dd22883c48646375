package ingest

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// TestTokensNeverShown feeds API keys through every answer the ingest
// gives — out of scope (403), invalid events (400), revoked, wrong secret,
// 10 KB long, glued to junk, on a line broken by a bare CR or LF (401 or
// the HTTP server's own 400) — and finds none of them in a log line (at
// debug level), a metric or an answer. A revocation takes effect without
// a restart, within a second (docs/ingest.md, API keys and tenants).
func TestTokensNeverShown(t *testing.T) {
	core, logs := observer.New(zap.DebugLevel)
	reg := prometheus.NewRegistry()
	e := newEnv(t, func(c *Config) { c.Logger, c.Registerer = zap.New(core), reg })
	secretOf := func(token string) string { return token[len(tokenPrefix)+16+1:] }
	_, revoked, err := e.admin.CreateKey(context.Background(), KeySpec{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	ev := func(subject string, tokens any) []byte {
		return fmt.Appendf(nil, `{"specversion":"1.0","id":"e1","source":"s","type":"prompt","subject":%q,"time":"2026-11-29T12:00:00Z","data":{"tokens":{"input":%v},"model":"m","user":"u"}}`, subject, tokens)
	}
	waitKeys(t, e.srv, 2) // the record reaches the replica after CreateKey returns
	if status, _, b := e.post("/api/v1/events", "application/cloudevents+json", revoked, ev("acme-1", 1)); status/100 != 2 {
		t.Fatalf("the second key before its revocation: %d %s", status, b)
	}
	if _, err := e.admin.RevokeKey(context.Background(), revoked[len(tokenPrefix):len(tokenPrefix)+16]); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for {
		status, _, _ := e.post("/api/v1/events", "application/cloudevents+json", revoked, ev("acme-1", 1))
		if status == http.StatusUnauthorized {
			break
		}
		if time.Since(start) > time.Second {
			t.Fatalf("the revoked key still answered %d after %v", status, time.Since(start))
		}
		time.Sleep(5 * time.Millisecond)
	}
	wrong := e.token[:len(e.token)-4] + "AAAA"
	if wrong == e.token {
		wrong = e.token[:len(e.token)-4] + "BBBB"
	}
	long := e.token + strings.Repeat("x", 10<<10)
	var answers []string
	for _, c := range []struct {
		token, subject string
		tokens         any
		want           int
	}{
		{e.token, "globex-1", 1, http.StatusForbidden},
		{e.token, "acme-1", `"many"`, http.StatusBadRequest},
		{revoked, "acme-1", 1, http.StatusUnauthorized},
		{wrong, "acme-1", 1, http.StatusUnauthorized},
		{long, "acme-1", 1, http.StatusUnauthorized},
		{e.token + "junk", "acme-1", 1, http.StatusUnauthorized},
		{"mlk_" + secretOf(e.token), "acme-1", 1, http.StatusUnauthorized},
	} {
		status, h, b := e.post("/api/v1/events", "application/cloudevents+json", c.token, ev(c.subject, c.tokens))
		if status != c.want {
			t.Errorf("%d %s, want %d", status, b, c.want)
		}
		answers = append(answers, fmt.Sprint(h), string(b))
	}
	// Line breaks inside the header, which no HTTP client sends.
	for _, header := range []string{
		"Authorization: Bearer " + e.token[:20] + "\r" + e.token[20:] + "\r\n",
		"Authorization: Bearer " + e.token[:20] + "\n" + e.token[20:] + "\r\n",
		"Authorization: Bearer \r\n " + e.token + "\r\n", // obsolete line folding
		"Authorization: Bearer " + e.token + "\x00\r\n",
	} {
		answers = append(answers, rawRequest(t, e.srv.URL(), header, ev("acme-1", 1)))
	}
	time.Sleep(100 * time.Millisecond) // the HTTP server's error log
	var metrics strings.Builder
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if _, err := expfmt.MetricFamilyToText(&metrics, mf); err != nil {
			t.Fatal(err)
		}
	}
	var logged strings.Builder
	for _, entry := range logs.All() {
		fmt.Fprintln(&logged, entry.Message, entry.ContextMap())
	}
	for what, text := range map[string]string{"logs": logged.String(), "metrics": metrics.String(), "answers": strings.Join(answers, "\n")} {
		for _, token := range []string{e.token, revoked} {
			// The secret is what follows "mlk_<id>_"; its first 20
			// characters are enough to find any part of it.
			s := secretOf(token)
			for _, part := range []string{s[:20], s[len(s)-20:]} {
				if strings.Contains(text, part) {
					t.Errorf("the %s hold a key's secret:\n%s", what, text)
				}
			}
		}
	}
}

// rawRequest sends a POST with header as written, and returns the answer.
func rawRequest(t *testing.T, url, header string, body []byte) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(url, "http://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "POST /api/v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/cloudevents+json\r\nContent-Length: %d\r\n%s\r\n%s", len(body), header, body)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var b strings.Builder
	_, _ = bufio.NewReader(resp.Body).WriteTo(&b)
	return resp.Status + " " + fmt.Sprint(resp.Header) + " " + b.String()
}
