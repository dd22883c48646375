package aggregator

import (
	"strings"
	"testing"
)

// The meters file's OpenMeter fields: event_type, value_property, group_by
// as a map or a list, scale.
func TestParseMetersIngestFields(t *testing.T) {
	cat, err := ParseMeters([]byte(`meters:
  - name: input_tokens
    event_type: prompt
    value_property: $.tokens.input
    group_by: {model: $.model, region: "$['region']"}
  - name: prompts
    aggregation: COUNT
    event_type: prompt
  - name: gpu_seconds
    event_type: job
    value_property: $.seconds
    scale: 3
    group_by: [pool]
  - name: api_calls
    group_by: [route]
`))
	if err != nil {
		t.Fatal(err)
	}
	ms := cat.ForEventType("prompt")
	if len(ms) != 2 || ms[0].Name != "input_tokens" || ms[1].Name != "prompts" {
		t.Fatalf("ForEventType(prompt) = %v, want input_tokens then prompts", ms)
	}
	in := ms[0]
	if strings.Join(in.GroupBy, ",") != "model,region" || in.GroupByPaths["model"] != "$.model" || in.ValueProperty != "$.tokens.input" {
		t.Errorf("input_tokens = %+v", in)
	}
	gpu, _ := cat.Lookup("gpu_seconds")
	if gpu.Scale != 3 || gpu.GroupByPaths["pool"] != `$["pool"]` {
		t.Errorf("gpu_seconds = %+v", gpu)
	}
	if api, _ := cat.Lookup("api_calls"); strings.Join(api.GroupBy, ",") != "route" || api.EventType != "" {
		t.Errorf("api_calls = %+v", api)
	}
	if got := cat.ForEventType("nothing"); got != nil {
		t.Errorf("ForEventType(nothing) = %v", got)
	}
	if got := strings.Join(cat.EventTypes(), ","); got != "job,prompt" {
		t.Errorf("EventTypes = %s", got)
	}
}

// Every mistake in the ingest fields is reported at once, naming the meter
// and the field.
func TestParseMetersIngestErrors(t *testing.T) {
	_, err := ParseMeters([]byte(`meters:
  - {name: a, event_type: e}
  - {name: b, aggregation: COUNT, event_type: e, value_property: $.n}
  - {name: c, value_property: $.n}
  - {name: d, event_type: e, value_property: "$.items[*]"}
  - {name: f, event_type: e, value_property: "$.["}
  - {name: g, event_type: e, value_property: $.n, scale: 19}
  - {name: h, aggregation: UNIQUE_COUNT, property: user, event_type: e, value_property: $.u, scale: 2}
  - {name: i, event_type: e, value_property: $.n, group_by: {model: "$..m"}}
`))
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{
		"meters[0] (a).value_property is required for SUM",
		"meters[1] (b).value_property is not allowed for COUNT",
		"meters[2] (c).value_property is only for meters with an event_type",
		`meters[3] (d).value_property "$.items[*]": selects several values`,
		`meters[4] (f).value_property "$.["`,
		"meters[5] (g).scale 19 is not between 0 and 18",
		"meters[6] (h).scale is only for SUM, MAX and LATEST",
		`meters[7] (i).group_by.model "$..m": selects several values`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}

// A group_by that is neither a list nor a map says what it should be.
func TestParseMetersGroupByShape(t *testing.T) {
	_, err := ParseMeters([]byte("meters:\n  - {name: j, event_type: e, value_property: $.n, group_by: 3}\n"))
	if err == nil || !strings.Contains(err.Error(), "group_by: want a list of property names or a map") {
		t.Fatalf("err = %v", err)
	}
}

// Unknown keys stay an error with the custom decoding of a meter.
func TestParseMetersUnknownKey(t *testing.T) {
	_, err := ParseMeters([]byte("meters:\n  - {name: a, evnet_type: e}\n"))
	if err == nil || !strings.Contains(err.Error(), "evnet_type") {
		t.Fatalf("err = %v, want the unknown key named", err)
	}
}
