package ingest

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/producer"
)

// TestIdentityBlanksKeptAsSent: an id, source or subject that ends in a
// space or a no-break space (U+00A0) is taken as sent (nothing in the
// design trims an identity): the record carries it unchanged, and its
// identity, the record key dedup keys on, is another than the one
// without the blank, on both endpoints. The key is the one a Kafka
// producer makes for the same event (producer.Record, as `meterline
// produce` sends it), so that a copy sent over HTTP and one sent to Kafka
// are one event, and "a" and "a " are two on either path.
func TestIdentityBlanksKeptAsSent(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.RefusalRate = -1 })
	p, err := producer.New(producer.WithBrokers(e.brokers...), producer.WithTopic(e.topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	const nbsp = "\u00a0"
	type ident struct{ id, source, subject string }
	sent := []ident{
		{"a", "s", "acme-1"}, {"a ", "s", "acme-1"}, {"a" + nbsp, "s", "acme-1"},
		{"a", "s ", "acme-1"}, {"a", "s" + nbsp, "acme-1"},
		{"a", "s", "acme-1 "}, {"a", "s", "acme-1" + nbsp},
	}
	var evs []string
	for _, s := range sent {
		evs = append(evs, fmt.Sprintf(`{"specversion":"1.0","id":%q,"source":%q,"type":"job","subject":%q,"time":"2026-11-29T12:00:00Z","data":{"seconds":1}}`,
			s.id, s.source, s.subject))
	}
	if code, _, b := e.post("/api/v1/events", "application/cloudevents-batch+json", e.token, []byte("["+strings.Join(evs, ",")+"]")); code != http.StatusNoContent {
		t.Fatalf("CloudEvents: %d %s", code, b)
	}
	// Meterline's format: event IDs and customers with the blanks. Its
	// identity has no source: the events that differ by their source
	// only take it into their event ID.
	eventID := func(s ident) string {
		if s.source != "s" {
			return "src-" + s.source
		}
		return s.id
	}
	var lines []string
	for i, s := range sent {
		lines = append(lines, fmt.Sprintf(`{"event_id":%q,"customer_id":%q,"meter":"api_calls","quantity":%d,"event_time":"2026-11-29T12:00:00Z","source":%q}`,
			eventID(s), s.subject, i+1, s.source))
	}
	if code, _, b := e.post("/v1/events", "application/x-ndjson", e.token, []byte(strings.Join(lines, "\n"))); code != http.StatusAccepted {
		t.Fatalf("/v1/events: %d %s", code, b)
	}
	recs := e.records()
	if len(recs) != 2*len(sent) {
		t.Fatalf("%d records, want %d", len(recs), 2*len(sent))
	}
	byKey := map[string]string{}
	for _, ue := range recs {
		key := string(ue.Identity().Key())
		if prev, ok := byKey[key]; ok {
			t.Errorf("two records of one identity %q: %s and %s/%s", key, prev, ue.Meter, ue.Source)
		}
		byKey[key] = ue.Meter + "/" + strconv.Quote(ue.Source)
	}
	for i, s := range sent {
		// What a Kafka producer sends for the same two events.
		want := []producer.Event{
			{EventID: producer.EventID(s.source, s.id), CustomerID: s.subject, Meter: "gpu_ms", Quantity: 1000, Source: s.source},
			{EventID: eventID(s), CustomerID: s.subject, Meter: "api_calls", Quantity: int64(i + 1), Source: s.source},
		}
		line, err := producer.ParseJSON([]byte(lines[i]))
		if err != nil {
			t.Fatal(err)
		}
		if line.EventID != eventID(s) || line.CustomerID != s.subject || line.Source != s.source {
			t.Fatalf("ParseJSON(%s) = %+v: not as written", lines[i], line)
		}
		for _, w := range want {
			w.EventTime = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
			rec, err := p.Record(w)
			if err != nil {
				t.Fatal(err)
			}
			got, ok := byKey[string(rec.Key)]
			if !ok {
				t.Errorf("%+v (meter %s): the Kafka path's key %q is no HTTP record's", s, w.Meter, rec.Key)
				continue
			}
			if want := w.Meter + "/" + strconv.Quote(s.source); got != want {
				t.Errorf("%+v: the record of key %q is %s, want %s", s, rec.Key, got, want)
			}
		}
	}
	for _, ue := range recs {
		if strings.TrimRight(ue.CustomerID, " "+nbsp) != "acme-1" || strings.TrimRight(ue.Source, " "+nbsp) != "s" {
			t.Errorf("record %+v: customer or source not as sent", ue)
		}
	}
}
