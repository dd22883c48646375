package ingest

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/meterline/meterline/aggregator"
)

// indexMeters are meters whose paths select by index: singular
// JSONPaths (RFC 9535), as a meters file may declare them.
const indexMeters = `meters:
  - name: item_tokens
    event_type: item
    value_property: $.items[0].tokens
    group_by: {model: "$.models[-1]", region: "$['where'][1]"}
`

// TestIndexPathDataCostsLittle: a meter whose paths select array
// elements by index reads them from the event's data text, as it reads
// names: a data of a megabyte is accepted at a cost of a few times its
// size in memory, like one read by names (TestLargeDataCostsLittle), not
// decoded whole into maps and slices for a JSONPath evaluation.
func TestIndexPathDataCostsLittle(t *testing.T) {
	cat, err := aggregator.ParseMeters([]byte(indexMeters))
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, func(c *Config) { c.RefusalRate = -1; c.Meters = cat })
	h := e.srv.Handler()
	small := strings.TrimSuffix(strings.Repeat("0,", 400_000), ",")
	body := `{"specversion":"1.0","id":"big","source":"s","type":"item","subject":"acme-1","time":"2026-11-29T12:00:00Z",` +
		`"data":{"items":[{"tokens":3}],"models":["m0","m1"],"where":["x","eu"],"pad":[` + small + `]}}`
	w, alloc := serveMeasured(h, e.token, "/api/v1/events", "application/cloudevents+json", body)
	if w.Code != http.StatusNoContent {
		t.Fatalf("%d %.300s", w.Code, w.Body)
	}
	if most := uint64(4*len(body)) + 4<<20; alloc > most {
		t.Errorf("a body of %d bytes took %d MB to accept, more than %d MB", len(body), alloc>>20, most>>20)
	}
	recs := e.records()
	if len(recs) != measureReps {
		t.Fatalf("%d records, want %d", len(recs), measureReps)
	}
	for _, ue := range recs {
		if got := fmt.Sprint(ue.Quantity, ue.Properties); got != "3 [{model m1} {region eu}]" {
			t.Errorf("record %s: %s; want 3 [{model m1} {region eu}]", ue.EventID, got)
		}
	}
}
