package sink

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/proto"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestRefusedLoginStopsTheSink: ClickHouse refusing the sink's user or
// password while it runs (a password changed on the server; the sink reads
// it at start only) stops the sink at its next INSERT or resume lookup,
// with ErrAuthentication naming the user, not the password, instead of
// backing off for ever as from an unavailable server.
func TestRefusedLoginStopsTheSink(t *testing.T) {
	for _, code := range []int32{192, 193, 194, 516} {
		w := &Writer{log: zap.NewNop(), m: newMetrics(prometheus.NewRegistry()),
			cfg: Config{UnknownErrorLimit: time.Hour, ClickHouse: "ch:9440", ClickHouseServer: Server{Addr: "ch:9440", User: "sink"}}}
		ex := &proto.Exception{Code: code, Name: "DB::Exception", Message: "Wrong password for user sink"}
		for _, err := range []error{ex, &prepareError{ex}} {
			got := w.unknownSpell(&table{name: TableEvents}, err)
			if !errors.Is(got, ErrAuthentication) {
				t.Fatalf("code %d (%T): unknownSpell = %v, want ErrAuthentication", code, err, got)
			}
			for _, want := range []string{`"sink"`, "ch:9440", "read at start"} {
				if !strings.Contains(got.Error(), want) {
					t.Errorf("code %d: error %q does not say %q", code, got, want)
				}
			}
		}
	}
}

// TestRefusedLoginLogged: the health check finding the login refused
// (an idle sink, which has nothing to write) logs it at error level once,
// naming the user, until ClickHouse answers again.
func TestRefusedLoginLogged(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	w := &Writer{log: zap.New(core), m: newMetrics(prometheus.NewRegistry()),
		cfg: Config{ClickHouse: "ch:9440", ClickHouseServer: Server{Addr: "ch:9440", User: "sink"}}}
	w.up.Store(true)
	ex := &proto.Exception{Code: 193, Name: "DB::Exception", Message: "Wrong password for user sink"}
	w.setUp(errors.New("EOF"))
	w.setUp(ex)
	w.setUp(ex)
	refused := logs.FilterLevelExact(zapcore.ErrorLevel).FilterMessageSnippet("refuses").All()
	if len(refused) != 1 || !strings.Contains(refused[0].Message, `"sink"`) {
		t.Fatalf("error lines about the refused login: %+v, want one naming user sink", refused)
	}
	w.setUp(nil)
	w.setUp(ex)
	if n := logs.FilterLevelExact(zapcore.ErrorLevel).FilterMessageSnippet("refuses").Len(); n != 2 {
		t.Errorf("after ClickHouse answered again, a new refusal logged %d lines in all, want 2", n)
	}
}
