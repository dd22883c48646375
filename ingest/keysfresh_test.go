package ingest

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// cutKeysTopic makes kfake fail every fetch and every listing of the
// keys topic's ends while down is set (e's replica must run without the
// quota gate), as a broker does whose connection
// is cut: the client retries without an error, and the read stops. It
// returns the count of fetches refused so.
func cutKeysTopic(t *testing.T, e *env, down *atomic.Bool) *atomic.Int32 {
	t.Helper()
	cut := errors.New("connection cut")
	var refused atomic.Int32
	// Every fetch: the keys topic's reader is the only consumer of a
	// replica without the quota gate, and a fetch of a fetch session
	// names no partition that did not change.
	e.cluster.ControlKey(kmsg.Fetch.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
		e.cluster.KeepControl()
		if !down.Load() {
			return nil, nil, false
		}
		refused.Add(1)
		return nil, cut, true
	})
	e.cluster.ControlKey(kmsg.ListOffsets.Int16(), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		e.cluster.KeepControl()
		if !down.Load() {
			return nil, nil, false
		}
		for _, rt := range kreq.(*kmsg.ListOffsetsRequest).Topics {
			if rt.Topic == e.keys {
				return nil, cut, true
			}
		}
		return nil, nil, false
	})
	return &refused
}

// TestKeysStaleWhenTopicOutOfReach: a replica that cannot read the keys
// topic (its partition out of reach: fetches and listings fail, the
// client retries without an error) answers every request 503 with
// Retry-After, never 401, once it has not confirmed the topic read to
// its end for AuthMaxAge; it is not ready, says so on the status page and
// in meterline_ingest_keys_age_seconds, and logs it once. A key revoked
// meanwhile is never accepted past the bound. Once the topic answers, it
// reads the revocation and serves again: the revoked key 401, the others
// accepted, and the recovery logged once.
func TestKeysStaleWhenTopicOutOfReach(t *testing.T) {
	const bound = 3 * time.Second
	core, logs := observer.New(zapcore.InfoLevel)
	e := newEnv(t, func(c *Config) { c.NoGate = true; c.AuthMaxAge = bound; c.Logger = zap.New(core) })
	var down atomic.Bool
	fetchesCut := cutKeysTopic(t, e, &down)
	ctx := context.Background()
	_, other, err := e.admin.CreateKey(ctx, KeySpec{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	body := mustJSON(t, prompt(t, "e1", "acme-1", map[string]any{"tokens": map[string]any{"input": 1}, "model": "m", "user": "u"}))
	send := func(token string) (int, http.Header, []byte) {
		return e.post("/api/v1/events", "application/cloudevents+json", token, body)
	}
	deadline := time.Now().Add(10 * time.Second)
	for k, _ := e.srv.Keys().Authenticate(other); k == nil; k, _ = e.srv.Keys().Authenticate(other) {
		if time.Now().After(deadline) {
			t.Fatal("the second key never reached the replica")
		}
		sleepMs(20)
	}
	for _, tok := range []string{e.token, other} {
		if status, _, b := send(tok); status != http.StatusNoContent {
			t.Fatalf("before the cut: %d %s", status, b)
		}
	}

	down.Store(true)
	downAt := time.Now()
	// The revocation is written while the topic is out of this replica's
	// reach (the producer's path still works), once the fetch that was
	// waiting on the broker as the cut came (FetchMaxWait, 1 s) is over:
	// the reader, on a single broker, sends a fetch only once its previous
	// one is answered, so a fetch refused by the cut shows none is waiting.
	for fetchesCut.Load() == 0 {
		if time.Since(downAt) > 10*time.Second {
			t.Fatal("no fetch of the keys reader reached the broker in 10s after the cut")
		}
		sleepMs(20)
	}
	key, _ := e.srv.Keys().Authenticate(e.token)
	revoked := *key
	revoked.Revoked = time.Now().UTC()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: e.keys, Key: []byte(keyRecordKey(key.ID)), Value: encodeRecord(record{Key: &revoked})}).FirstErr(); err != nil {
		t.Fatal(err)
	}

	// Past the bound, every request is answered 503, whatever its key.
	stale := 0
	for time.Since(downAt) < bound+3*time.Second {
		sent := time.Now()
		status, h, b := send(e.token)
		if sent.Sub(downAt) <= bound {
			sleepMs(50)
			continue
		}
		if status != http.StatusServiceUnavailable {
			t.Fatalf("%s after the cut (bound %s), the revoked key got %d %s; want 503", sent.Sub(downAt), bound, status, b)
		}
		if h.Get("Retry-After") == "" || problem(t, b).Type != problemTypePrefix+"unavailable" {
			t.Fatalf("503 without Retry-After or of another type: %v %s", h, b)
		}
		stale++
		sleepMs(50)
	}
	if stale == 0 {
		t.Fatal("no request was sent past the bound")
	}
	if k, _ := e.srv.Keys().Authenticate(e.token); k == nil {
		t.Fatal("the revocation reached the replica through the cut: the test proves nothing")
	}
	for _, tok := range []string{other, ""} {
		if status, _, b := send(tok); status != http.StatusServiceUnavailable {
			t.Errorf("stale replica answered token %.8q with %d %s; want 503", tok, status, b)
		}
	}
	if err := e.srv.Ready(); err == nil || !strings.Contains(err.Error(), "stale") || !strings.Contains(err.Error(), e.keys) {
		t.Errorf("Ready: %v; want stale, naming the keys topic", err)
	}
	if note := e.srv.Status().Note; !strings.Contains(note, "STALE") {
		t.Errorf("status note %q does not say the keys are stale", note)
	}
	if age := gauge(t, e.srv.cfg.Registerer, "meterline_ingest_keys_age_seconds"); age <= bound.Seconds() {
		t.Errorf("meterline_ingest_keys_age_seconds %g; want past the bound %s", age, bound)
	}

	down.Store(false)
	deadline = time.Now().Add(15 * time.Second)
	for e.srv.Ready() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("still not ready 15s after the keys topic answers again: %v", e.srv.Ready())
		}
		sleepMs(50)
	}
	if status, _, b := send(e.token); status != http.StatusUnauthorized {
		t.Errorf("after recovery the revoked key got %d %s; want 401", status, b)
	}
	if status, _, b := send(other); status != http.StatusNoContent {
		t.Errorf("after recovery the other key got %d %s; want 204", status, b)
	}
	if age := gauge(t, e.srv.cfg.Registerer, "meterline_ingest_keys_age_seconds"); age > bound.Seconds() {
		t.Errorf("meterline_ingest_keys_age_seconds %g after recovery", age)
	}
	if n := logs.FilterMessageSnippet("not confirmed read to its end").Len(); n != 1 {
		t.Errorf("%d logs of the keys going stale; want 1", n)
	}
	if n := logs.FilterMessageSnippet("read to its end again").Len(); n != 1 {
		t.Errorf("%d logs of the keys recovering; want 1", n)
	}
}

// TestKeysNoBound: with AuthMaxAge negative a replica serves with the
// keys it holds however long the topic is out of reach.
func TestKeysNoBound(t *testing.T) {
	k := NewKeys("k", nil)
	k.SetMaxAge(-1)
	k.markLoaded()
	k.confirmed = time.Now().Add(-time.Hour)
	if age, stale := k.Staleness(); stale || age < time.Hour {
		t.Fatalf("Staleness = %s, %v; want an hour, not stale", age, stale)
	}
	k.SetMaxAge(time.Minute)
	if _, stale := k.Staleness(); !stale {
		t.Fatal("an hour-old set is not stale with a bound of a minute")
	}
}

// TestKeysAgeBeforeFirstLoad: before its first load a replica's
// meterline_ingest_keys_age_seconds is the time since its key set was
// made, near 0 at its start and growing while it does not load, so that
// MeterlineIngestKeysStale (docs/operations.md, MeterlineIngestKeysStale)
// fires for a replica that never loads its keys, not for one starting. The
// set is not stale meanwhile: the replica answers 503 "not loaded yet".
func TestKeysAgeBeforeFirstLoad(t *testing.T) {
	k := NewKeys("k", nil)
	k.SetMaxAge(time.Minute)
	reg := prometheus.NewRegistry()
	newMetrics(reg, k, nil, newInflight(1, 1), newConns(1, zap.NewNop()))
	now := time.Now()
	k.clock = func() time.Time { return now }
	if age := gauge(t, reg, "meterline_ingest_keys_age_seconds"); age < 0 || age > 1 {
		t.Errorf("age %g at the start; want about 0", age)
	}
	now = now.Add(3 * time.Minute)
	if age := gauge(t, reg, "meterline_ingest_keys_age_seconds"); age < 180 || age > 181 {
		t.Errorf("age %g 3 minutes after the start, keys never loaded; want about 180", age)
	}
	if _, stale := k.Staleness(); stale {
		t.Error("a set not loaded yet is stale")
	}
}

// TestReadMarks: a listing of the ends is reached once every partition is
// read up to its end there; the newest reached is reported, once.
func TestReadMarks(t *testing.T) {
	var got []time.Time
	m := &readMarks{next: map[int32]int64{}, reached: func(at time.Time) { got = append(got, at) }}
	t0 := time.Unix(100, 0)
	m.add(map[int32]int64{0: 0, 1: 0}, t0) // empty: reached at once
	m.add(map[int32]int64{0: 2, 1: 1}, t0.Add(time.Second))
	m.add(map[int32]int64{0: 3, 1: 1}, t0.Add(2*time.Second))
	m.read(0, 0)
	m.read(1, 0)
	m.read(0, 1) // first listing reached
	m.read(0, 2) // second
	if len(got) != 3 || !got[0].Equal(t0) || !got[1].Equal(t0.Add(time.Second)) || !got[2].Equal(t0.Add(2*time.Second)) {
		t.Fatalf("reached %v", got)
	}
	m.add(map[int32]int64{0: 5}, t0.Add(3*time.Second))
	m.add(map[int32]int64{0: 5}, t0.Add(4*time.Second))
	m.read(0, 4)
	if len(got) != 4 || !got[3].Equal(t0.Add(4*time.Second)) {
		t.Fatalf("two listings reached at once: %v; want the newest, once", got)
	}
}

// gauge reads a gauge without labels from reg.
func gauge(t *testing.T, reg prometheus.Registerer, name string) float64 {
	t.Helper()
	mfs, err := reg.(prometheus.Gatherer).Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge %s", name)
	return 0
}
