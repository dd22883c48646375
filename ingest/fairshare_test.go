package ingest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/meterline/meterline/internal/testenv"
)

// inflightRefused sums meterline_ingest_inflight_refused_total in reg,
// by tenant.
func inflightRefused(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	by := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "meterline_ingest_inflight_refused_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "tenant" {
					by[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return by
}

// TestSlowBodiesLeaveRoomForOthers: a few tenants whose clients trickle
// their bodies (each request holds its slot until its body is in, up to
// --read-timeout) cannot take every slot of the ingest. With the default
// bounds, 4 tenants opening 64 such requests each (the whole of
// DefaultMaxInFlight, which the old per-key bound of a quarter let them
// hold) get each its share; the rest are answered 429 too-many-in-flight
// at once, before their bodies, their connections closed without waiting
// for the bodies, and a fifth tenant is still served.
func TestSlowBodiesLeaveRoomForOthers(t *testing.T) {
	reg := prometheus.NewRegistry()
	slowBodies(t, newEnv(t, func(c *Config) { c.Registerer = reg }), reg)
}

// TestRealSlowBodiesLeaveRoomForOthers is TestSlowBodiesLeaveRoomForOthers
// on the real broker.
func TestRealSlowBodiesLeaveRoomForOthers(t *testing.T) {
	brokers := testenv.RealKafka(t)
	reg := prometheus.NewRegistry()
	slowBodies(t, newEnvOn(t, brokers, nil, func(c *Config) { c.Registerer = reg }), reg)
}

// slowBodies has 4 tenants open DefaultMaxInFlight/4 slow requests each
// on e (whose metrics are in reg), and checks that a fifth is served.
func slowBodies(t *testing.T, e *env, reg *prometheus.Registry) {
	t.Helper()
	ctx := context.Background()
	const hogs, each = 4, DefaultMaxInFlight / 4
	tokens := make([]string, hogs+1)
	for i := range tokens {
		tenant := fmt.Sprintf("t%d", i+1)
		var err error
		if _, tokens[i], err = e.admin.CreateKey(ctx, KeySpec{Tenant: tenant, Customers: []string{tenant + "-*"}}); err != nil {
			t.Fatal(err)
		}
	}
	waitKeys(t, e.srv, hogs+2)

	type slow struct {
		tenant int
		conn   net.Conn
	}
	var conns []slow
	for i := range hogs {
		body := apiCall("slow", fmt.Sprintf("t%d-1", i+1))
		for range each {
			conns = append(conns, slow{i, startSlowRequest(t, e.srv.Addr(), tokens[i], body)})
		}
	}
	// Every request is either in flight (its body awaited) or refused.
	settled := func() (int, float64) {
		var refused float64
		for _, v := range inflightRefused(t, reg) {
			refused += v
		}
		return e.srv.inflight.count(), refused
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if n, r := settled(); n+int(r) == len(conns) {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("%d requests in flight and %g refused, want %d in all", n, r, len(conns))
		}
	}

	// A fifth tenant is served.
	if status, hdr, b := e.post("/v1/events", "application/json", tokens[hogs], apiCall("fifth", "t5-1")); status != http.StatusAccepted {
		t.Fatalf("a fifth tenant, with %d slow requests in flight: %d %s (Retry-After %q), want 202", e.srv.inflight.count(), status, b, hdr.Get("Retry-After"))
	}

	// The refused requests were answered 429 without their bodies, and
	// their connections closed (so that not even net/http waits for the
	// bodies); the others still wait for theirs.
	answers := make([]string, len(conns))
	closed := make([]bool, len(conns))
	var wg sync.WaitGroup
	for k, c := range conns {
		wg.Go(func() {
			_ = c.conn.SetReadDeadline(time.Now().Add(5 * time.Second)) // the read timeout is 30s
			b, err := io.ReadAll(c.conn)
			// Closed: EOF, or a reset when the server closed with
			// bytes of the body unread. Not a timeout.
			answers[k], closed[k] = string(b[:min(len(b), 12)]), err == nil || errors.Is(err, syscall.ECONNRESET)
		})
	}
	wg.Wait()
	held := make([]int, hogs)
	for k, c := range conns {
		switch answers[k] {
		case "":
			held[c.tenant]++
		case "HTTP/1.1 429":
			if !closed[k] {
				t.Errorf("a slow request of t%d answered 429: its connection is still open, its body awaited", c.tenant+1)
			}
		default:
			t.Errorf("a slow request of t%d was answered %q, want 429 or nothing yet", c.tenant+1, answers[k])
		}
	}
	refused := inflightRefused(t, reg)
	for i, n := range held {
		tenant := fmt.Sprintf("t%d", i+1)
		if n < 1 || n > DefaultMaxInFlightPerTenant {
			t.Errorf("tenant %s holds %d slots, want 1 to %d", tenant, n, DefaultMaxInFlightPerTenant)
		}
		if int(refused[tenant]) != each-n {
			t.Errorf("tenant %s: %g refusals counted, want %d", tenant, refused[tenant], each-n)
		}
	}
	t.Logf("slots held by the 4 tenants: %v", held)
}

// fill has tenants enter f one after another, each as many times as it
// is admitted, until every slot is taken; it returns how many tenants
// that took and what each held.
func fill(t *testing.T, f *inflight) []int {
	t.Helper()
	var held []int
	for tenant := 0; f.count() < f.max; tenant++ {
		if tenant > f.max {
			t.Fatalf("%d tenants and %d of %d slots taken", tenant, f.count(), f.max)
		}
		n := 0
		for {
			if limit, _, _ := f.enter(fmt.Sprint(tenant)); limit != "" {
				break
			}
			n++
		}
		held = append(held, n)
	}
	return held
}

// TestInflightShares: the slots are shared out so that a few tenants
// cannot take them all: each holds at most its bound, and is admitted
// only while it holds fewer than are free.
func TestInflightShares(t *testing.T) {
	// The defaults: 3 tenants take 64 each, and the last 64 slots go to
	// 7 more: 32, 16, 8, 4, 2, 1 and 1.
	held := fill(t, newInflight(DefaultMaxInFlight, DefaultMaxInFlightPerTenant))
	if want := []int{64, 64, 64, 32, 16, 8, 4, 2, 1, 1}; fmt.Sprint(held) != fmt.Sprint(want) {
		t.Errorf("with the default bounds, tenants one after another hold %v, want %v", held, want)
	}
	// With no bound per tenant, one tenant holds half, and so on.
	held = fill(t, newInflight(DefaultMaxInFlight, -1))
	if want := []int{128, 64, 32, 16, 8, 4, 2, 1, 1}; fmt.Sprint(held) != fmt.Sprint(want) {
		t.Errorf("with no bound per tenant, tenants one after another hold %v, want %v", held, want)
	}
	// With no bound in all, there is no share: one tenant holds its bound.
	f := newInflight(-1, 3)
	for i := range 4 {
		limit, held, free := f.enter("a")
		if want := map[bool]string{true: limitTenant, false: ""}[i == 3]; limit != want || held != i || free != -1 {
			t.Errorf("request %d: %q %d %d, want %q %d -1", i, limit, held, free, want, i)
		}
	}
	// Which bound refuses: every slot taken (global) before the tenant's
	// bound, before its share.
	f = newInflight(4, 2)
	for _, c := range []struct{ tenant, limit string }{
		{"a", ""}, {"a", ""}, {"a", limitTenant}, {"b", ""}, {"b", limitShare}, {"c", ""}, {"c", limitGlobal}, {"d", limitGlobal},
	} {
		if limit, _, _ := f.enter(c.tenant); limit != c.limit {
			t.Errorf("%s: %q, want %q", c.tenant, limit, c.limit)
		}
	}
	f.leave("a")
	if limit, held, free := f.enter("c"); limit != limitShare || held != 1 || free != 1 {
		t.Errorf("c with 1 of 1 free: %q %d %d, want share 1 1", limit, held, free)
	}
	if limit, _, _ := f.enter("d"); limit != "" {
		t.Errorf("d with 1 free: %q, want admitted", limit)
	}
}

// TestInflightFillNeedsTenants: whatever order tenants' requests come
// and go in, taking every slot takes as many tenants as filling them one
// after another (fill): no interleaving of entries and leaves does
// better. Checked on every state reachable with small bounds.
func TestInflightFillNeedsTenants(t *testing.T) {
	for _, c := range []struct{ max, perTenant int }{{16, 4}, {24, 4}, {16, -1}, {20, 8}} {
		want := len(fill(t, newInflight(c.max, c.perTenant)))
		// Can want-1 tenants take every slot? States are the tenants'
		// counts, sorted (tenants are alike).
		n := want - 1
		start := make([]int, n)
		seen := map[string]bool{fmt.Sprint(start): true}
		queue := [][]int{start}
		for len(queue) > 0 {
			v := queue[0]
			queue = queue[1:]
			f := newInflight(c.max, c.perTenant)
			for i, k := range v {
				f.total += k
				f.byTenant[fmt.Sprint(i)] = k
			}
			if f.count() == c.max {
				t.Fatalf("max %d, %d a tenant: %d tenants take every slot (%v), fewer than %d", c.max, c.perTenant, n, v, want)
			}
			for i := range v {
				next := func(w []int) {
					w = slices.Clone(w)
					slices.Sort(w)
					if k := fmt.Sprint(w); !seen[k] {
						seen[k] = true
						queue = append(queue, w)
					}
				}
				if limit, _, _ := f.enter(fmt.Sprint(i)); limit == "" {
					f.leave(fmt.Sprint(i))
					w := slices.Clone(v)
					w[i]++
					next(w)
				}
				if v[i] > 0 {
					w := slices.Clone(v)
					w[i]--
					next(w)
				}
			}
		}
	}
}

// TestInFlightShareAnswer: a tenant that holds as many requests as there
// are free slots is answered 429 too-many-in-flight before its body is
// read, counted under limit "share"; a tenant holding fewer still gets a
// slot.
func TestInFlightShareAnswer(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxInFlight = 4; c.MaxInFlightPerTenant = -1 })
	_, beta, err := e.admin.CreateKey(context.Background(), KeySpec{Tenant: "beta", Customers: []string{"beta-*"}})
	if err != nil {
		t.Fatal(err)
	}
	waitKeys(t, e.srv, 2)
	for range 2 {
		startSlowRequest(t, e.srv.Addr(), e.token, apiCall("slow", "acme-1"))
	}
	for deadline := time.Now().Add(5 * time.Second); e.srv.inflight.count() < 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d requests in flight, want 2", e.srv.inflight.count())
		}
	}
	// acme holds 2 of 4: as many as are free.
	status, hdr, b := e.post("/v1/events", "application/json", e.token, apiCall("third", "acme-1"))
	if status != http.StatusTooManyRequests {
		t.Fatalf("acme's third request: %d %s, want 429", status, b)
	}
	if p := problem(t, b); p.Type != "urn:meterline:problem:too-many-in-flight" || p.RetryAfter != 1 || hdr.Get("Retry-After") != "1" ||
		p.Detail != "tenant acme already has 2 requests in flight, and 2 of the ingest's 4 slots are free: the last ones are kept for tenants with fewer; wait for their answers" {
		t.Errorf("problem %+v, Retry-After %q", p, hdr.Get("Retry-After"))
	}
	if v := testutil.ToFloat64(e.srv.metrics.inflight.WithLabelValues("acme", limitShare)); v != 1 {
		t.Errorf("refused by the share: %g, want 1", v)
	}
	// beta holds none: it is served.
	if status, _, b := e.post("/v1/events", "application/json", beta, apiCall("b", "beta-1")); status != http.StatusAccepted {
		t.Fatalf("beta, with acme's 2 in flight: %d %s, want 202", status, b)
	}
}
