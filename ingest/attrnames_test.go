package ingest

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/meterline/meterline/aggregator"
)

// TestAttributeNames: a CloudEvent's attributes are the members named
// exactly as the CloudEvents spec names them, in lowercase. A member
// named in another case ("ID", "Subject"), which encoding/json would have
// matched without regard to case, last-wins over the exact one, is
// refused naming it: an event's identity (its id, source and subject)
// never depends on which of two spellings a parser picks. So is an
// extension attribute whose name is not lowercase letters a-z and digits
// 0-9 (the spec's rule for every attribute name), and so is a second
// specversion or datacontenttype, null or not. Each shape of request
// answers the same: one event, a batch (the scan's fast path, and the
// element-by-element path it leaves a request to), an application/json
// object and array.
func TestAttributeNames(t *testing.T) {
	cat, err := aggregator.ParseMeters([]byte("meters:\n  - name: ts\n    aggregation: COUNT\n    event_type: t\n"))
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, func(c *Config) { c.Meters = cat })
	const ce, batch, js = "application/cloudevents+json", "application/cloudevents-batch+json", "application/json"
	good := `{"specversion":"1.0","id":"g1","source":"s","type":"t","subject":"acme-1"}`
	long := strings.Repeat("x", 300) + "_"
	cases := []struct {
		name, body string // body: one event's JSON
		field      string // the member the 400 names
		reason     string // a part of its reason
	}{
		{"ID instead of id", `{"specversion":"1.0","ID":"1","source":"s","type":"t","subject":"acme-1"}`, "ID", `"id"`},
		{"id and ID", `{"specversion":"1.0","id":"1","ID":"2","source":"s","type":"t","subject":"acme-1"}`, "ID", `"id"`},
		{"ID and id", `{"specversion":"1.0","ID":"2","id":"1","source":"s","type":"t","subject":"acme-1"}`, "ID", `"id"`},
		{"Subject and subject", `{"specversion":"1.0","id":"1","source":"s","type":"t","Subject":"acme-2","subject":"acme-1"}`, "Subject", `"subject"`},
		{"subject and SUBJECT", `{"specversion":"1.0","id":"1","source":"s","type":"t","subject":"acme-1","SUBJECT":"acme-2"}`, "SUBJECT", `"subject"`},
		{"Source", `{"specversion":"1.0","id":"1","source":"s","Source":"t","type":"t","subject":"acme-1"}`, "Source", `"source"`},
		{"Type", `{"specversion":"1.0","id":"1","source":"s","Type":"u","type":"t","subject":"acme-1"}`, "Type", `"type"`},
		{"Time", `{"specversion":"1.0","id":"1","source":"s","type":"t","subject":"acme-1","Time":"2026-11-29T12:00:00Z"}`, "Time", `"time"`},
		{"SpecVersion", `{"SpecVersion":"1.0","specversion":"1.0","id":"1","source":"s","type":"t","subject":"acme-1"}`, "SpecVersion", `"specversion"`},
		{"DataContentType", `{"specversion":"1.0","id":"1","source":"s","type":"t","subject":"acme-1","DataContentType":"application/json"}`, "DataContentType", `"datacontenttype"`},
		{"Data", `{"specversion":"1.0","id":"1","source":"s","type":"t","subject":"acme-1","Data":{"tokens":{"input":5}}}`, "Data", `"data"`},
		{"Data_Base64", `{"specversion":"1.0","id":"1","source":"s","type":"t","subject":"acme-1","Data_Base64":"e30="}`, "Data_Base64", `"data_base64"`},
		// Escapes decoded, as every JSON parser reads the name.
		{"ID escaped", `{"specversion":"1.0","id":"1","\u0049D":"2","source":"s","type":"t","subject":"acme-1"}`, "ID", `"id"`},
		// encoding/json folds Unicode: ſ (U+017F) matched s.
		{"ſubject", "{\"specversion\":\"1.0\",\"id\":\"1\",\"source\":\"s\",\"type\":\"prompt\",\"subject\":\"acme-1\",\"\u017fubject\":\"acme-2\"}", "\u017fubject", `"subject"`},
		{"extension with an underscore", `{"specversion":"1.0","id":"1","source":"s","type":"t","subject":"acme-1","trace_parent":"x"}`, "trace_parent", "a-z"},
		{"extension with a dash", `{"specversion":"1.0","id":"1","source":"s","type":"t","subject":"acme-1","trace-parent":"x"}`, "trace-parent", "a-z"},
		{"extension named empty", `{"specversion":"1.0","id":"1","source":"s","type":"t","subject":"acme-1","":"x"}`, "", "a-z"},
		{"long name, clipped", `{"specversion":"1.0","id":"1","source":"s","type":"t","subject":"acme-1","` + long + `":"x"}`, clip(long), "a-z"},
		// A second specversion or datacontenttype, whatever the value of
		// either copy: a null one is still a member named so (OpenMeter's
		// SDK refuses "specversion was already provided" before it reads
		// the value).
		{"specversion null, then 1.0", `{"specversion":null,"id":"1","source":"s","type":"t","subject":"acme-1","specversion":"1.0"}`, "specversion", "appears twice"},
		{"specversion 1.0, then null", `{"specversion":"1.0","id":"1","source":"s","type":"t","subject":"acme-1","specversion":null}`, "specversion", "appears twice"},
		{"datacontenttype null, then application/json", `{"specversion":"1.0","id":"1","source":"s","type":"t","subject":"acme-1","datacontenttype":null,"datacontenttype":"application/json"}`, "datacontenttype", "appears twice"},
		{"datacontenttype application/json, then null", `{"specversion":"1.0","id":"1","source":"s","type":"t","subject":"acme-1","datacontenttype":"application/json","datacontenttype":null}`, "datacontenttype", "appears twice"},
		{"datacontenttype null twice", `{"specversion":"1.0","id":"1","source":"s","type":"t","subject":"acme-1","datacontenttype":null,"datacontenttype":null}`, "datacontenttype", "appears twice"},
	}
	refused := testutil.ToFloat64(e.srv.metrics.byReason.WithLabelValues("acme", "invalid"))
	for _, c := range cases {
		for _, r := range []struct {
			shape, ct, body string
			index           int
		}{
			{"single", ce, c.body, 0},
			{"batch", batch, "[" + good + "," + c.body + "]", 1},
			{"json object", js, c.body, 0},
			{"json array", js, "[" + good + "," + c.body + "]", 1},
		} {
			status, _, b := e.post("/api/v1/events", r.ct, e.token, []byte(r.body))
			if status != http.StatusBadRequest {
				t.Errorf("%s, %s: %d %s, want 400", c.name, r.shape, status, b)
				continue
			}
			p := problem(t, b)
			if len(p.Errors) != 1 || p.Errors[0].Index != r.index || p.Errors[0].Field != c.field || p.Errors[0].Code != "invalid" ||
				!strings.Contains(p.Errors[0].Reason, c.reason) {
				t.Errorf("%s, %s: %s, want event %d's %q invalid, the reason naming %s", c.name, r.shape, b, r.index, c.field, c.reason)
				continue
			}
			refused++
		}
	}
	if got := testutil.ToFloat64(e.srv.metrics.byReason.WithLabelValues("acme", "invalid")); got != refused {
		t.Errorf("meterline_ingest_refused_events_total{reason=invalid} = %v, want %v", got, refused)
	}
	if n := len(e.records()); n != 0 {
		t.Errorf("%d records, want none", n)
	}

	// Extension names of letters and digits (upper case too, as
	// OpenMeter's SDK takes them), and the v0.3 attributes that 1.0 reads
	// as extensions, are taken (and ignored), on both paths.
	ok := `{"specversion":"1.0","id":"x%d","source":"s","type":"t","subject":"acme-1","traceparent":"00-1","partitionkey":"p","ext2":"x","TraceState":"t","X9":1,"schemaurl":"u","datacontentencoding":"base64"}`
	for i, r := range []struct{ ct, body string }{
		{ce, fmt.Sprintf(ok, 1)},
		{batch, "[" + fmt.Sprintf(ok, 2) + "," + fmt.Sprintf(ok, 3) + "]"},
		{js, fmt.Sprintf(ok, 4)},
	} {
		if status, _, b := e.post("/api/v1/events", r.ct, e.token, []byte(r.body)); status/100 != 2 {
			t.Errorf("request %d: %d %s, want 2xx", i, status, b)
		}
	}
}

// TestDecodeBatchAttributeNames: the fast path takes no batch with a
// member that is not an attribute's exact name or an extension's valid
// one, so that the element-by-element path names it; it still takes a
// batch of lowercase extensions.
func TestDecodeBatchAttributeNames(t *testing.T) {
	ev := func(extra string) string {
		return `{"specversion":"1.0","id":"1","source":"s","type":"t","subject":"c"` + extra + `}`
	}
	for _, extra := range []string{`,"ID":"2"`, `,"Subject":"d"`, `,"a_b":1`, `,"":1`, `,"\u0049D":"2"`, "," + `"ſubject":"d"`,
		`,"ext9":{"a":[1]}`, `,"ext9":[]`, `,"ext9":2147483648`} {
		body := "[" + ev("") + "," + ev(extra) + "]"
		if _, ok := decodeBatch(nil, []byte(body), body, DefaultMaxEvents); ok {
			t.Errorf("decodeBatch(%s) took it", body)
		}
		if _, fe := parseCloudEvent([]byte(ev(extra))); fe == nil {
			t.Errorf("parseCloudEvent(%s) took it", ev(extra))
		}
	}
	body := "[" + ev(`,"traceparent":"x","ext9":-2147483648,"ext10":true,"ext11":null`) + "]"
	// An upper-case extension name is left to encoding/json (the fast
	// path cannot tell it from an attribute's), and taken.
	up := "[" + ev(`,"Foo":1`) + "]"
	if as, ok := decodeBatch(nil, []byte(up), up, DefaultMaxEvents); !ok || len(as) != 1 {
		t.Errorf("decodeBatch(%s) = %v, %v", up, as, ok)
	}
	if _, ok := scanBatch(nil, up, DefaultMaxEvents); ok {
		t.Errorf("scanBatch(%s) took it", up)
	}
	if _, fe := parseCloudEvent([]byte(ev(`,"Foo":1`))); fe != nil {
		t.Errorf("parseCloudEvent(%s): %v", ev(`,"Foo":1`), fe)
	}
	if as, ok := decodeBatch(nil, []byte(body), body, DefaultMaxEvents); !ok || len(as) != 1 || as[0].attr[0] != "1" {
		t.Errorf("decodeBatch(%s) = %v, %v", body, as, ok)
	}
}
