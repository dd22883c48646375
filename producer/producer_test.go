package producer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/schemas"
)

var now = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func fixedClock() time.Time { return now }

func goodEvent() Event {
	return Event{EventID: "req-42", CustomerID: "acme", Meter: "api_calls", Quantity: 3,
		EventTime: now.Add(-time.Minute), Properties: map[string]string{"model": "m1"}}
}

func TestValidation(t *testing.T) {
	p, err := New(WithClock(fixedClock), WithBrokers("127.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	bigProps := map[string]string{}
	for i := 0; i < schemas.MaxProperties+1; i++ {
		bigProps[strings.Repeat("k", 3)+string(rune('a'+i%26))+string(rune('a'+i/26))] = "v"
	}
	cases := []struct {
		name  string
		edit  func(*Event)
		field string
		code  string
	}{
		{"empty customer", func(e *Event) { e.CustomerID = "" }, "customer_id", schemas.ReasonInvalid},
		{"empty meter", func(e *Event) { e.Meter = "" }, "meter", schemas.ReasonInvalid},
		{"empty event id", func(e *Event) { e.EventID = "" }, "event_id", schemas.ReasonInvalid},
		{"negative quantity", func(e *Event) { e.Quantity = -1 }, "quantity", schemas.ReasonInvalid},
		{"zero event time", func(e *Event) { e.EventTime = time.Time{} }, "event_time", schemas.ReasonInvalid},
		{"epoch event time", func(e *Event) { e.EventTime = time.UnixMilli(0) }, "event_time", schemas.ReasonInvalid},
		{"before 2000", func(e *Event) { e.EventTime = time.Date(1999, 12, 31, 23, 59, 59, 0, time.UTC) }, "event_time", schemas.ReasonInvalid},
		{"too far ahead", func(e *Event) { e.EventTime = now.Add(time.Hour + time.Millisecond) }, "event_time", schemas.ReasonInFuture},
		// Times outside int64 milliseconds: UnixMilli wraps them around to
		// a time that looks valid (here in the year 292277026, or, chosen
		// with care, any time at all).
		{"year -292277022", func(e *Event) { e.EventTime = time.Date(-292277022, 1, 1, 0, 0, 0, 0, time.UTC) }, "event_time", schemas.ReasonInvalid},
		{"year -1000000000", func(e *Event) { e.EventTime = time.Date(-1000000000, 1, 1, 0, 0, 0, 0, time.UTC) }, "event_time", schemas.ReasonInvalid},
		{"too many properties", func(e *Event) { e.Properties = bigProps }, "properties", schemas.ReasonOversized},
		{"properties too big", func(e *Event) { e.Properties = map[string]string{"p": strings.Repeat("x", schemas.MaxPropertiesBytes)} }, "properties", schemas.ReasonOversized},
		{"long event id", func(e *Event) { e.EventID = strings.Repeat("x", schemas.MaxIdentityFieldBytes+1) }, "event_id", schemas.ReasonOversized},
		{"bad utf8", func(e *Event) { e.CustomerID = "\xff" }, "customer_id", schemas.ReasonInvalid},
		// docs/design.md, Event identity and keys: text is checked on its
		// bytes, so acme\xff and acme\xfe are both refused rather than
		// merged into acme\uFFFD; identity fields and source refuse C0
		// control characters too.
		{"bad utf8 acme ff", func(e *Event) { e.CustomerID = "acme\xff" }, "customer_id", schemas.ReasonInvalid},
		{"bad utf8 acme fe", func(e *Event) { e.CustomerID = "acme\xfe" }, "customer_id", schemas.ReasonInvalid},
		{"bad utf8 meter", func(e *Event) { e.Meter = "api\xc3" }, "meter", schemas.ReasonInvalid},
		{"bad utf8 event id", func(e *Event) { e.EventID = "\xed\xa0\x80" }, "event_id", schemas.ReasonInvalid}, // a UTF-16 surrogate
		{"bad utf8 source", func(e *Event) { e.Source = "gw\x80" }, "source", schemas.ReasonInvalid},
		{"bad utf8 property", func(e *Event) { e.Properties = map[string]string{"model": "m\xff"} }, "properties.model", schemas.ReasonInvalid},
		{"bad utf8 property name", func(e *Event) { e.Properties = map[string]string{"m\xff": "x"} }, "properties", schemas.ReasonInvalid},
		{"NUL in customer", func(e *Event) { e.CustomerID = "acme\x00" }, "customer_id", schemas.ReasonInvalid},
		{"tab in meter", func(e *Event) { e.Meter = "api\tcalls" }, "meter", schemas.ReasonInvalid},
		{"newline in event id", func(e *Event) { e.EventID = "req-1\n" }, "event_id", schemas.ReasonInvalid},
		{"escape in source", func(e *Event) { e.Source = "\x1b[31mgw" }, "source", schemas.ReasonInvalid},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := goodEvent()
			c.edit(&e)
			_, err := p.Record(e)
			var fe *FieldError
			if !errors.As(err, &fe) || !errors.Is(err, ErrInvalidEvent) {
				t.Fatalf("Record = %v, want a *FieldError", err)
			}
			if fe.Field != c.field || fe.Code != c.code {
				t.Fatalf("error %q: field %q code %q, want %q %q", err, fe.Field, fe.Code, c.field, c.code)
			}
			if !strings.Contains(err.Error(), c.field) {
				t.Fatalf("error %q does not name the field", err)
			}
			// FillRecord refuses the same event in its schema form with
			// the same error, and leaves the record alone.
			rec := kgo.Record{Topic: "untouched"}
			ue := schemas.UsageEvent{EventID: e.EventID, CustomerID: e.CustomerID, Meter: e.Meter, Quantity: e.Quantity,
				Source: e.Source, Properties: schemas.Properties(e.Properties)}
			if ferr := p.FillRecord(&rec, &ue, e.EventTime); ferr == nil || ferr.Error() != err.Error() || rec.Topic != "untouched" || rec.Key != nil {
				t.Fatalf("FillRecord = %v (record %+v), want %v", ferr, rec, err)
			}
			// Send and SendAsync refuse it the same way, without a broker.
			if err := p.Send(context.Background(), e); !errors.As(err, &fe) {
				t.Fatalf("Send = %v", err)
			}
			var got error
			p.SendAsync(e, func(err error) { got = err })
			if !errors.As(got, &fe) {
				t.Fatalf("SendAsync callback got %v", got)
			}
		})
	}
	// The edges that are allowed.
	for _, edit := range []func(*Event){
		func(e *Event) { e.EventTime = now.Add(time.Hour) },
		func(e *Event) { e.EventTime = time.UnixMilli(schemas.MinEventTime) },
		func(e *Event) { e.Quantity = 0 },
		func(e *Event) { e.Properties = nil },
		func(e *Event) { e.CustomerID = "acme\uFFFD" },                                  // a real U+FFFD is text like any other
		func(e *Event) { e.CustomerID = "Zürich" },                                      // text beyond ASCII
		func(e *Event) { e.CustomerID = "👩\u200d💻" },                                    // a zero-width joiner makes one emoji of two
		func(e *Event) { e.Properties = map[string]string{"note": "line 1\nline 2\t"} }, // controls are fine in properties
	} {
		e := goodEvent()
		edit(&e)
		if _, err := p.Record(e); err != nil {
			t.Errorf("Record(%+v) = %v, want ok", e, err)
		}
	}
}

// TestRecordBytes: Record's key is the event's canonical key and its value
// the schema's encoding (Encode), whatever the properties' order in the
// map; FillRecord gives the same record from the schema form, fills the
// default source, and refuses unsorted properties.
func TestRecordBytes(t *testing.T) {
	p, err := New(WithClock(fixedClock), WithBrokers("127.0.0.1:1"), WithTopic("t1"), WithSource("svc"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	e := goodEvent()
	e.Properties = map[string]string{"z": "1", "a": "2", "m": "3"}
	e.EventTime = now.Add(-time.Minute + 1500*time.Microsecond) // kept to the millisecond
	rec, err := p.Record(e)
	if err != nil {
		t.Fatal(err)
	}
	ue := &schemas.UsageEvent{EventID: e.EventID, CustomerID: e.CustomerID, Meter: e.Meter, Quantity: e.Quantity,
		EventTime: e.EventTime.UnixMilli(), Source: "svc", Properties: []schemas.Property{{Name: "a", Value: "2"}, {Name: "m", Value: "3"}, {Name: "z", Value: "1"}}}
	want, err := schemas.Encode(ue)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Topic != "t1" || string(rec.Key) != string(e.Key()) || string(rec.Value) != string(want) {
		t.Fatalf("Record = %s %q % x, want t1 %q % x", rec.Topic, rec.Key, rec.Value, e.Key(), want)
	}
	var filled kgo.Record
	u2 := *ue
	u2.Source, u2.EventTime = "", 0
	if err := p.FillRecord(&filled, &u2, e.EventTime); err != nil {
		t.Fatal(err)
	}
	if filled.Topic != "t1" || string(filled.Key) != string(rec.Key) || string(filled.Value) != string(rec.Value) || u2.Source != "svc" {
		t.Fatalf("FillRecord = %s %q % x (source %q), want Record's", filled.Topic, filled.Key, filled.Value, u2.Source)
	}
	u2.Properties = []schemas.Property{{Name: "z", Value: "1"}, {Name: "a", Value: "2"}}
	var fe *FieldError
	if err := p.FillRecord(&filled, &u2, e.EventTime); !errors.As(err, &fe) || fe.Field != "properties.a" {
		t.Fatalf("FillRecord with unsorted properties = %v, want a properties.a error", err)
	}
}

// TestAppendRecord: records appended to one buffer, which grows on the
// way, are FillRecord's byte for byte, each still its own once the
// buffer has moved; a refused event leaves the record and the buffer's
// bytes alone; the skew is judged against the given reading of the
// clock, not a new one.
func TestAppendRecord(t *testing.T) {
	p, err := New(WithClock(fixedClock), WithBrokers("127.0.0.1:1"), WithTopic("t1"), WithSource("svc"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	event := func(i int) schemas.UsageEvent {
		return schemas.UsageEvent{EventID: fmt.Sprintf("req-%d-%s", i, strings.Repeat("x", i%7)), CustomerID: fmt.Sprintf("cust-%d", i%13),
			Meter: "api_calls", Quantity: int64(i), Properties: schemas.Properties(map[string]string{"model": fmt.Sprint("m", i%3)})}
	}
	at := now.Add(-time.Minute)
	buf := make([]byte, 0, 16) // grows several times
	recs := make([]kgo.Record, 40)
	for i := range recs {
		ue := event(i)
		if buf, err = p.AppendRecord(buf, &recs[i], &ue, at, now); err != nil {
			t.Fatal(err)
		}
		if i == 20 { // a refused event in the middle
			bad, before := event(i), string(buf)
			bad.CustomerID = "acme\x00"
			rec := kgo.Record{Topic: "untouched"}
			var fe *FieldError
			if buf, err = p.AppendRecord(buf, &rec, &bad, at, now); !errors.As(err, &fe) || fe.Field != "customer_id" ||
				rec.Topic != "untouched" || rec.Key != nil || string(buf) != before {
				t.Fatalf("AppendRecord of a bad event = %v, record %+v, buffer changed %v", err, rec, string(buf) != before)
			}
		}
	}
	for i := range recs {
		var want kgo.Record
		ue := event(i)
		if err := p.FillRecord(&want, &ue, at); err != nil {
			t.Fatal(err)
		}
		if recs[i].Topic != "t1" || string(recs[i].Key) != string(want.Key) || string(recs[i].Value) != string(want.Value) {
			t.Fatalf("record %d = %s %q % x, want FillRecord's %q % x", i, recs[i].Topic, recs[i].Key, recs[i].Value, want.Key, want.Value)
		}
	}
	// The clock says now; the reading given is an hour later: an event 90
	// minutes ahead of the clock passes against the reading, not against
	// the clock (FillRecord), nor against now.
	ahead := now.Add(90 * time.Minute)
	var rec kgo.Record
	ue := event(1)
	if _, err := p.AppendRecord(nil, &rec, &ue, ahead, now.Add(time.Hour)); err != nil {
		t.Fatalf("AppendRecord against a later reading: %v", err)
	}
	var fe *FieldError
	for _, err := range []error{p.FillRecord(&rec, &ue, ahead), func() error { _, err := p.AppendRecord(nil, &rec, &ue, ahead, now); return err }()} {
		if !errors.As(err, &fe) || fe.Code != schemas.ReasonInFuture {
			t.Fatalf("an event 90 minutes ahead: %v, want in_future", err)
		}
	}
}

// TestProduceRecords: one callback for many records, called once per
// record: nil once each is acknowledged, ErrClosed for each after Close.
func TestProduceRecords(t *testing.T) {
	const topic = "usage.events"
	_, brokers := testenv.KFake(t, kfake.SeedTopics(4, topic))
	p, err := New(WithBrokers(brokers...), WithClock(fixedClock))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var rs []*kgo.Record
	for i := range 10 {
		e := goodEvent()
		e.EventID = fmt.Sprint("req-", i)
		r, err := p.Record(e)
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, r)
	}
	var mu sync.Mutex
	var errs []error
	done := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		errs = append(errs, err)
	}
	p.ProduceRecords(rs, done)
	if err := p.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(errs) != len(rs) || errors.Join(errs...) != nil {
		t.Fatalf("callbacks %v, want %d times nil", errs, len(rs))
	}
	if got := len(testenv.ReadAll(t, brokers, topic)); got != len(rs) {
		t.Fatalf("%d records in the topic, want %d", got, len(rs))
	}
	p.Close()
	errs = nil
	p.ProduceRecords(rs[:3], done)
	if len(errs) != 3 || !errors.Is(errs[0], ErrClosed) || !errors.Is(errs[2], ErrClosed) {
		t.Fatalf("after Close: callbacks %v, want 3 times ErrClosed", errs)
	}
}

func TestSendOnKFake(t *testing.T) {
	const topic = "usage.events"
	_, brokers := testenv.KFake(t, kfake.SeedTopics(8, topic))
	p, err := New(WithBrokers(brokers...), WithClock(fixedClock), WithSource("svc-a"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	e := goodEvent()
	if err := p.Send(ctx, e); err != nil {
		t.Fatal(err)
	}
	e2 := goodEvent()
	e2.EventID = "req-43"
	e2.Source = "svc-b"
	done := make(chan error, 1)
	p.SendAsync(e2, func(err error) { done <- err })
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	recs := testenv.ReadAll(t, brokers, topic)
	if len(recs) != 2 {
		t.Fatalf("read %d records, want 2", len(recs))
	}
	for _, r := range recs {
		id, err := schemas.ParseKey(r.Key)
		if err != nil {
			t.Fatal(err)
		}
		if want := schemas.Partition(r.Key, 8); r.Partition != want {
			t.Errorf("%s in partition %d, murmur2 says %d", r.Key, r.Partition, want)
		}
		var ue schemas.UsageEvent
		if err := schemas.DecodeInto(r.Value, &ue); err != nil {
			t.Fatal(err)
		}
		if ue.Identity() != id {
			t.Errorf("key %v, payload identity %v", id, ue.Identity())
		}
		wantSource := map[string]string{"req-42": "svc-a", "req-43": "svc-b"}[ue.EventID]
		if ue.Source != wantSource || ue.Quantity != 3 || ue.EventTime != now.Add(-time.Minute).UnixMilli() {
			t.Errorf("payload %+v", ue)
		}
		if len(ue.Properties) != 1 || ue.Properties[0] != (schemas.Property{Name: "model", Value: "m1"}) {
			t.Errorf("properties %+v", ue.Properties)
		}
	}
	p.Close()
	if err := p.Send(ctx, e); !errors.Is(err, ErrClosed) {
		t.Fatalf("Send after Close = %v", err)
	}
	p.Close() // idempotent
}

func TestParseJSON(t *testing.T) {
	e, err := ParseJSON([]byte(`{"event_id":"req-42","customer_id":"acme","meter":"api_calls","quantity":3,"event_time":"2026-11-29T12:00:00.250Z","source":"api-gateway","properties":{"model":"m1"}}`))
	if err != nil {
		t.Fatal(err)
	}
	want := Event{EventID: "req-42", CustomerID: "acme", Meter: "api_calls", Quantity: 3,
		EventTime: time.Date(2026, 11, 29, 12, 0, 0, 250e6, time.UTC), Source: "api-gateway",
		Properties: map[string]string{"model": "m1"}}
	if e.EventID != want.EventID || !e.EventTime.Equal(want.EventTime) || e.Quantity != 3 || e.Source != want.Source || e.Properties["model"] != "m1" {
		t.Fatalf("ParseJSON = %+v", e)
	}
	ms, err := ParseJSON([]byte(`{"event_id":"r","customer_id":"c","meter":"m","quantity":0,"event_time":1795003200250}`))
	if err != nil || ms.EventTime.UnixMilli() != 1795003200250 {
		t.Fatalf("epoch ms: %+v, %v", ms, err)
	}
	round, err := e.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseJSON(round)
	if err != nil || !back.EventTime.Equal(e.EventTime) || back.Properties["model"] != "m1" {
		t.Fatalf("MarshalJSON round trip: %s → %+v, %v", round, back, err)
	}

	bad := []struct {
		line, field string
	}{
		{`{"customer_id":"c","meter":"m","quantity":1,"event_time":1795003200250}`, "event_id"},
		{`{"event_id":"e","meter":"m","quantity":1,"event_time":1795003200250}`, "customer_id"},
		{`{"event_id":"e","customer_id":"c","quantity":1,"event_time":1795003200250}`, "meter"},
		{`{"event_id":"e","customer_id":"c","meter":"m","event_time":1795003200250}`, "quantity"},
		{`{"event_id":"e","customer_id":"c","meter":"m","quantity":1.5,"event_time":1795003200250}`, "quantity"},
		{`{"event_id":"e","customer_id":"c","meter":"m","quantity":"1","event_time":1795003200250}`, "quantity"},
		{`{"event_id":"e","customer_id":"c","meter":"m","quantity":1}`, "event_time"},
		{`{"event_id":"e","customer_id":"c","meter":"m","quantity":1,"event_time":"yesterday"}`, "event_time"},
		{`{"event_id":7,"customer_id":"c","meter":"m","quantity":1,"event_time":1795003200250}`, "event_id"},
		{`{"event_id":"e","customer_id":"c","meter":"m","quantity":1,"event_time":1795003200250,"qty":2}`, "qty"},
		{`{"event_id":"e","customer_id":"c","meter":"m","quantity":1,"event_time":1795003200250,"properties":{"a":1}}`, "properties.a"},
	}
	for _, b := range bad {
		_, err := ParseJSON([]byte(b.line))
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != b.field {
			t.Errorf("ParseJSON(%s) = %v, want field %q", b.line, err, b.field)
		}
	}
	for _, line := range []string{`{"event_id":`, `[1,2]`, `{} {}`, `nonsense`} {
		if _, err := ParseJSON([]byte(line)); !errors.Is(err, ErrMalformedJSON) {
			t.Errorf("ParseJSON(%s) = %v, want ErrMalformedJSON", line, err)
		}
	}
}

// TestParseJSONText: text is checked on the raw bytes of the line
// (docs/design.md, Event identity and keys). encoding/json turns invalid
// UTF-8 and unpaired surrogate escapes into U+FFFD, which merged "acme\xff"
// and "acme\xfe" into one customer; each is now an error naming its field,
// and a real U+FFFD (literal or escaped) and a surrogate pair still decode.
func TestParseJSONText(t *testing.T) {
	line := func(customer, rest string) string {
		return `{"event_id":"e","customer_id":"` + customer + `","meter":"m","quantity":1,"event_time":1795003200250` + rest + `}`
	}
	bad := []struct {
		line, field string
	}{
		{line("acme\xff", ""), "customer_id"},
		{line("acme\xfe", ""), "customer_id"},
		{line("acme\xc3", ""), "customer_id"},         // truncated sequence
		{line("acme\xed\xa0\x80", ""), "customer_id"}, // an encoded surrogate
		{line("acme\\ud800", ""), "customer_id"},      // unpaired high surrogate
		{line("acme\\uDC00x", ""), "customer_id"},     // unpaired low surrogate
		{line("acme\\ud800\\u0041", ""), "customer_id"},
		{line("c", ",\"source\":\"gw\x80\""), "source"},
		{line("c", ",\"properties\":{\"model\":\"m\xff\"}"), "properties.model"},
		{line("c", `,"properties":{"region":"eu","model":"\udfff"}`), "properties.model"},
		{line("c", ",\"properties\":{\"m\xff\":\"x\"}"), "properties"},
		{"{\"event_id\":\"e\xfe\",\"customer_id\":\"c\",\"meter\":\"m\",\"quantity\":1,\"event_time\":1795003200250}", "event_id"},
		{"{\"event_id\":\"e\",\"customer_id\":\"c\",\"meter\":\"m\xff\",\"quantity\":1,\"event_time\":1795003200250}", "meter"},
		{"{\"event_id\":\"e\",\"customer_id\":\"c\",\"meter\":\"m\",\"quantity\":1,\"event_time\":\"2026-11-29T12:00:00Z\xff\"}", "event_time"},
		// C0 controls in identity fields and source, escaped in JSON:
		// ParseJSON decodes them, Record refuses them (below).
	}
	for _, b := range bad {
		_, err := ParseJSON([]byte(b.line))
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != b.field || fe.Code != schemas.ReasonInvalid || !strings.Contains(err.Error(), b.field) {
			t.Errorf("ParseJSON(%q) = %v, want an invalid error naming %q", b.line, err, b.field)
		}
	}

	p, err := New(WithClock(fixedClock), WithBrokers("127.0.0.1:1"), WithMaxSkew(24*365*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, c := range []struct{ line, field string }{
		{line(`acme\u0000`, ""), "customer_id"},
		{line(`acme\t`, ""), "customer_id"},
		{line(`c`, `,"source":"gw\n"`), "source"},
		{`{"event_id":"e\u001f","customer_id":"c","meter":"m","quantity":1,"event_time":1795003200250}`, "event_id"},
		// DEL, C1 and bidirectional controls too, escaped or not.
		{line(`acme\u007f`, ""), "customer_id"},
		{line("acme\u0085", ""), "customer_id"},
		{line(`acme\u202e1-`, ""), "customer_id"},
		{line("c", `,"source":"gw\u2067"`), "source"},
		{`{"event_id":"e\u200f","customer_id":"c","meter":"m","quantity":1,"event_time":1795003200250}`, "event_id"},
		{`{"event_id":"e","customer_id":"c","meter":"m\u009b","quantity":1,"event_time":1795003200250}`, "meter"},
	} {
		e, err := ParseJSON([]byte(c.line))
		if err != nil {
			t.Fatalf("ParseJSON(%q) = %v", c.line, err)
		}
		_, err = p.Record(e)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != c.field || !strings.Contains(err.Error(), "control") {
			t.Errorf("Record(%q) = %v, want a control character error naming %q", c.line, err, c.field)
		}
	}

	// Still text: U+FFFD written out or escaped is one and the same
	// customer; a surrogate pair is one code point; an escaped backslash
	// before "ud800" is not an escape.
	for _, c := range []struct{ line, customer string }{
		{line("acme\uFFFD", ""), "acme\uFFFD"},
		{line(`acme\ufffd`, ""), "acme\uFFFD"},
		{line(`acme\ud83d\ude00`, ""), "acme😀"},
		{line(`acme\\ud800`, ""), `acme\ud800`},
		{line("Zürich", ""), "Zürich"},
	} {
		e, err := ParseJSON([]byte(c.line))
		if err != nil || e.CustomerID != c.customer {
			t.Errorf("ParseJSON(%q) = %q, %v; want customer %q", c.line, e.CustomerID, err, c.customer)
			continue
		}
		if _, err := p.Record(e); err != nil {
			t.Errorf("Record(%q) = %v", c.line, err)
		}
	}
}

// BenchmarkParseJSON: one line of the public JSON format, as `meterline
// produce` parses it.
func BenchmarkParseJSON(b *testing.B) {
	line := []byte(`{"event_id":"req-42","customer_id":"acme","meter":"api_calls","quantity":3,"event_time":"2026-11-29T12:00:00.250Z","source":"api-gateway","properties":{"model":"m1"}}`)
	for b.Loop() {
		if _, err := ParseJSON(line); err != nil {
			b.Fatal(err)
		}
	}
}

// TestParseJSONClipsQuotedValues: an error of ParseJSON repeats at most
// a clipped prefix of a value it quotes (cut at a character's start),
// never the whole value: a line of a megabyte would otherwise make an
// error of a megabyte, in the CLI's output as in the ingest's answers.
func TestParseJSONClipsQuotedValues(t *testing.T) {
	long := strings.Repeat("é", 5000) // 10,000 bytes
	for name, line := range map[string]string{
		"event_time string":  `{"event_id":"e","customer_id":"c","meter":"m","quantity":1,"event_time":"` + long + `"}`,
		"event_time object":  `{"event_id":"e","customer_id":"c","meter":"m","quantity":1,"event_time":{"x":"` + long + `"}}`,
		"quantity":           `{"event_id":"e","customer_id":"c","meter":"m","quantity":"` + long + `","event_time":1}`,
		"unknown field name": `{"event_id":"e","customer_id":"c","meter":"m","quantity":1,"event_time":1,"` + long + `":1}`,
		// The field of a string that is not valid text is named by the
		// member names on its way: the producer's text too.
		"property name": `{"event_id":"e","customer_id":"c","meter":"m","quantity":1,"event_time":1,"properties":{"` + long + `":"\ud800"}}`,
		"nested names":  `{"event_id":"e","customer_id":"c","meter":"m","quantity":1,"event_time":1,"x":` + strings.Repeat(`{"ab":`, 2000) + `"\udc00"` + strings.Repeat("}", 2000) + `}`,
	} {
		_, err := ParseJSON([]byte(line))
		if err == nil {
			t.Fatalf("%s: ParseJSON accepted %.80s…", name, line)
		}
		var fe *FieldError
		if !errors.As(err, &fe) {
			t.Fatalf("%s: error %v is not a FieldError", name, err)
		}
		if msg := err.Error(); len(msg) > 300 || !utf8.ValidString(msg) || !strings.Contains(msg, "…") {
			t.Errorf("%s: error of %d bytes (valid UTF-8: %t), want a clipped value of at most 300: %.120s", name, len(msg), utf8.ValidString(msg), msg)
		}
	}
}
