package sink

import (
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/proto"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestErrorLogsNameTheClass: a ClickHouse error code the sink does not
// know is logged as such, with its code and what to do, and never as
// "clickhouse unavailable", whether an INSERT failed with it, the INSERT
// failed to start with it or a resume lookup did; an unavailable server
// is logged as unavailable, with the code when it gave one and what to
// do. A lookup failing with an unknown code is counted and bounded as an
// INSERT failing with one is (docs/operations.md, Outages).
func TestErrorLogsNameTheClass(t *testing.T) {
	unknownCode := &proto.Exception{Code: 160, Name: "DB::Exception", Message: "The maximum sleep time is 3000000 microseconds"}
	netErr := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	for _, c := range []struct {
		name        string
		err         error
		during      string
		wantMsg     string // the one line logged
		wantKind    string
		wantAction  string
		wantCode    bool
		unknownStop bool
	}{
		{"insert, unknown code", unknownCode, "insert", "does not know", "unknown", "fix what the server says", true, true},
		{"insert failed to start, unknown code", &prepareError{unknownCode}, "insert", "does not know", "unknown", "fix what the server says", true, true},
		{"resume lookup, unknown code", unknownCode, "resume lookup", "does not know", "unknown", "fix what the server says", true, true},
		{"insert, unreachable", netErr, "insert", "clickhouse unavailable", "unavailable", "resumes by itself", false, false},
		{"insert, transient code", &proto.Exception{Code: 252, Name: "DB::Exception"}, "insert", "clickhouse unavailable", "unavailable", "merges", true, false},
		{"insert, table missing", &prepareError{&proto.Exception{Code: 60, Name: "DB::Exception"}}, "insert", "clickhouse unavailable", "unavailable", "meterline migrate", true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			core, logs := observer.New(zapcore.InfoLevel)
			reg := prometheus.NewRegistry()
			w := &Writer{log: zap.New(core), m: newMetrics(reg), cfg: Config{UnknownErrorLimit: time.Hour}}
			w.blocked.Store("")
			w.paused.Store(true) // no Kafka session here: fetching counts as paused
			tbl := &table{name: TableEvents}
			// As writeRows does on a failed INSERT or lookup.
			if err := w.unknownSpell(tbl, c.err); err != nil {
				t.Fatalf("unknownSpell = %v at the spell's start", err)
			}
			w.unavailable(tbl, c.err, c.during)
			entries := logs.All()
			if len(entries) != 1 {
				t.Fatalf("%d log lines, want 1: %v", len(entries), entries)
			}
			e := entries[0]
			if !strings.Contains(e.Message, c.wantMsg) {
				t.Errorf("logged %q, want %q", e.Message, c.wantMsg)
			}
			f := e.ContextMap()
			if a, _ := f["action"].(string); !strings.Contains(a, c.wantAction) {
				t.Errorf("action %q, want it to say %q", a, c.wantAction)
			}
			if _, ok := f["code"]; ok != c.wantCode {
				t.Errorf("code logged: %v, want %v (fields %v)", ok, c.wantCode, f)
			}
			if got := metric(t, reg, "meterline_sink_insert_errors_total", "table", TableEvents, "kind", c.wantKind); got != 1 {
				t.Errorf("%v errors counted as %s, want 1", got, c.wantKind)
			}
			w.cfg.UnknownErrorLimit = 0
			if err := w.unknownSpell(tbl, c.err); errors.Is(err, ErrUnknownServerError) != c.unknownStop {
				t.Errorf("past the limit, unknownSpell = %v; want a stop: %v", err, c.unknownStop)
			}
		})
	}
}
