package ingest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/producer"
)

// runNode runs the ES module script with node in dir, the directory of
// OpenMeter's Node SDK (testenv.ClientNode), with env added to the
// environment; it returns the standard output.
func runNode(t *testing.T, dir, script string, env ...string) ([]byte, error) {
	t.Helper()
	cmd := exec.Command("node", "--input-type=module")
	cmd.Dir = dir
	cmd.Stdin = strings.NewReader(script)
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("%w\n%s", err, stderr.String())
	}
	return out, nil
}

// nodeRun is what testdata/nodesdk.mjs prints.
type nodeRun struct {
	Sent []struct {
		Method, URL, ContentType, Authorization string
		Body                                    []struct {
			SpecVersion string `json:"specversion"`
			ID, Source  string
			Type        string
			Subject     string
			Time        string
			Data        struct {
				Tokens struct {
					Input json.RawMessage
				}
				Model, User string
			}
		}
		Status int
	}
	Results map[string]string
	Errors  map[string]struct {
		Thrown, IsHTTPError                bool
		Name, Message, Type, Title, Detail string
		Status                             int
		Errors                             []EventError
	}
}

// TestRealNodeSDK drives OpenMeter's Node SDK (@openmeter/sdk, the
// version scripts/client-node.sh pins) against the ingest on the real
// broker: one event and a batch, as its README ingests them, arrive in the
// events topic as sent (identity from source and id, subject as the
// customer, data, time to the millisecond); each refusal surfaces as the
// SDK's HTTPError, which reads the problem details (type, title, status,
// detail, errors), and sends nothing.
func TestRealNodeSDK(t *testing.T) {
	brokers := testenv.RealKafka(t)
	dir := testenv.ClientNode(t)
	script, err := os.ReadFile("testdata/nodesdk.mjs")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnvOn(t, brokers, nil, nil)
	out, err := runNode(t, dir, string(script), "URL="+e.srv.URL(), "TOKEN="+e.token)
	if err != nil {
		t.Fatalf("the Node SDK driver failed: %v\n%s", err, out)
	}
	var run nodeRun
	if err := json.Unmarshal(out, &run); err != nil {
		t.Fatalf("driver output: %v\n%s", err, out)
	}
	for _, call := range []string{"single", "batch", "empty"} {
		if r := run.Results[call]; r != "undefined" {
			t.Errorf("ingest (%s) resolved to %q, want undefined (204, no body)", call, r)
		}
	}

	// What the SDK sent: each call one POST of a batch, with the key as a
	// Bearer token; the three calls that succeed (the last one empty), then
	// the refused ones.
	if len(run.Sent) != 9 {
		t.Fatalf("the SDK sent %d requests, want 9: %+v", len(run.Sent), run.Sent)
	}
	uuid := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	var want []string
	for i, s := range run.Sent {
		if s.Method != http.MethodPost || s.URL != e.srv.URL()+"/api/v1/events" || s.ContentType != "application/cloudevents-batch+json" {
			t.Errorf("request %d: %s %s (%s), want POST /api/v1/events as application/cloudevents-batch+json", i, s.Method, s.URL, s.ContentType)
		}
		if i >= 3 {
			continue
		}
		if s.Authorization != "Bearer "+e.token || s.Status != http.StatusNoContent {
			t.Errorf("request %d: Authorization %q, answered %d; want the key as a Bearer token, 204", i, s.Authorization, s.Status)
		}
		for _, ev := range s.Body {
			if i == 1 && (!uuid.MatchString(ev.ID) || ev.Source != "@openmeter/sdk") {
				t.Errorf("the SDK's defaults: id %q, source %q; want a random UUID and @openmeter/sdk", ev.ID, ev.Source)
			}
			tm, err := time.Parse(time.RFC3339Nano, ev.Time)
			if err != nil || ev.SpecVersion != "1.0" || ev.Type != "prompt" || time.Since(tm) > 2*time.Minute {
				t.Errorf("request %d sent %+v (time: %v)", i, ev, err)
			}
			id, ms, input := producer.EventID(ev.Source, ev.ID), tm.UnixMilli(), strings.Trim(string(ev.Data.Tokens.Input), `"`)
			model := "[]"
			if ev.Data.Model != "" {
				model = "[{model " + ev.Data.Model + "}]"
			}
			want = append(want,
				fmt.Sprintf("%s/input_tokens/%s q=%s t=%d src=%s props=%s", ev.Subject, id, input, ms, ev.Source, model),
				fmt.Sprintf("%s/prompts/%s q=1 t=%d src=%s props=[]", ev.Subject, id, ms, ev.Source),
				fmt.Sprintf("%s/users/%s q=1 t=%d src=%s props=[{user %s}]", ev.Subject, id, ms, ev.Source, ev.Data.User))
		}
	}
	if len(want) != 9 {
		t.Fatalf("the two calls sent %d records' worth of events, want 3 events", len(want)/3)
	}
	var got []string
	for _, ue := range e.records() {
		got = append(got, fmt.Sprintf("%s/%s/%s q=%d t=%d src=%s props=%v", ue.CustomerID, ue.Meter, ue.EventID, ue.Quantity, ue.EventTime, ue.Source, ue.Properties))
	}
	sort.Strings(got)
	sort.Strings(want)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("records:\n%s\nwant (the events as the SDK sent them):\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// Each refusal is the SDK's HTTPError carrying the problem details.
	for name, w := range map[string]struct {
		status      int
		code, title string
		errors      []EventError // Index, Field and Code compared
	}{
		"badToken":    {401, "unauthorized", "Unauthorized", nil},
		"noToken":     {401, "unauthorized", "Unauthorized", nil},
		"noSubject":   {400, "invalid-events", "Invalid events", []EventError{{Index: 1, Field: "subject", Code: "invalid"}}},
		"fraction":    {400, "invalid-events", "Invalid events", []EventError{{Index: 0, Field: "data.tokens.input", Code: "invalid"}}},
		"unknownType": {400, "invalid-events", "Invalid events", []EventError{{Index: 0, Field: "type", Code: CodeUnknownEventType}}},
		"outOfScope":  {403, "forbidden", "Outside the key's scope", []EventError{{Index: 1, Field: "subject", Code: CodeOutOfScope}}},
	} {
		g, ok := run.Errors[name]
		switch {
		case !ok || !g.Thrown:
			t.Errorf("%s: the SDK threw nothing", name)
			continue
		case !g.IsHTTPError || g.Name != "HTTPError":
			t.Errorf("%s: the SDK threw %s, not its HTTPError: %s", name, g.Name, g.Message)
			continue
		}
		if g.Status != w.status || g.Type != problemTypePrefix+w.code || g.Title != w.title || g.Detail == "" ||
			!strings.HasSuffix(g.Message, fmt.Sprintf("[%d]: %s", w.status, g.Detail)) {
			t.Errorf("%s: HTTPError status %d, type %q, title %q, message %q; want %d, %s%s, %q and the problem's detail",
				name, g.Status, g.Type, g.Title, g.Message, w.status, problemTypePrefix, w.code, w.title)
		}
		if len(g.Errors) != len(w.errors) {
			t.Errorf("%s: errors %+v, want %+v", name, g.Errors, w.errors)
			continue
		}
		for i, ee := range w.errors {
			if ge := g.Errors[i]; ge.Index != ee.Index || ge.Field != ee.Field || ge.Code != ee.Code || ge.Reason == "" {
				t.Errorf("%s: error %d is %+v, want %+v with a reason", name, i, ge, ee)
			}
		}
		// The SDK's message is all a caller that logs err.message sees:
		// it names the first bad event, its field and why.
		if len(g.Errors) > 0 {
			first := g.Errors[0]
			if want := fmt.Sprintf("Event %d, %s: %s", first.Index, first.Field, first.Reason); !strings.Contains(g.Message, want) {
				t.Errorf("%s: the SDK's message %q does not name the first bad event (%q)", name, g.Message, want)
			}
		}
	}
}
