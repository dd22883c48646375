package deploy

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/sink"
)

// realSinkCHAlertsFired lists the alerts TestRealSinkClickHouseDownAlert
// fires.
var realSinkCHAlertsFired = []string{"MeterlineSinkClickHouseDown"}

// TestRealSinkClickHouseDownAlert runs the shipped alert rules (scaled as
// TestRealAlertsFire's, realScale) in a real Prometheus scraping a real
// `meterline sink` on the real broker, writing to the real ClickHouse
// through a TCP proxy of the test, while records arrive on usage.deduped
// (20 a second):
//
//  1. The sink writes them; no alert is pending or firing.
//  2. The proxy cut (connections closed, new ones closed at once): the
//     alert fires for reason unreachable, never for blocked, and no alert
//     but it and the lag's (MeterlineConsumerLagGrowing: the sink's lag
//     grows, as it does in production, only later) is active.
//  3. The proxy forwarding again: the alert resolves, and every record
//     is a row of usage_events, none lost or doubled.
func TestRealSinkClickHouseDownAlert(t *testing.T) {
	e := newAlertEnv(t, "alertssinkch", 2)
	conn, db := testenv.ClickHouseDB(t)
	proxy := testenv.NewProxy(t, testenv.RealClickHouse(t))

	addr := testenv.FreeAddr(t)
	w := watchScaledRules(t, e.promBin, e.work, addr)
	proc := testenv.StartProcess(t, "sink", filepath.Join(e.work, "sink.log"), e.bin, "sink",
		"--brokers", strings.Join(e.brokers, ","), "--topic-prefix", e.prefix, "--log-level", "info",
		"--clickhouse", proxy.Addr(), "--database", db, "--migrate", "--group", e.base+"-sink", "--instance-id", "s1",
		"--metrics-addr", addr, "--session-timeout", "6s", "--max-batch-wait", "200ms", "--commit-interval", "500ms")
	waitHTTP(t, "http://"+addr+"/readyz", 90*time.Second)
	stopWriting := writeDeduped(t, e.brokers, e.names, 2)
	rows := func() uint64 {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var n uint64
		if err := conn.QueryRow(ctx, "SELECT count() FROM "+sink.TableEvents).Scan(&n); err != nil {
			t.Fatalf("count rows: %v", err)
		}
		return n
	}
	down := map[string]string{"instance": addr}

	t.Log("---- 1. the sink writes")
	// Longer than the scaled rule needs to fire (8 s).
	for start := time.Now(); time.Since(start) < 12*time.Second; time.Sleep(500 * time.Millisecond) {
		if a := w.find("MeterlineSinkClickHouseDown", down); a != nil {
			t.Fatalf("MeterlineSinkClickHouseDown active while the sink writes: %v", a)
		}
	}
	if n := rows(); n == 0 {
		t.Fatal("no row written by a healthy sink")
	}
	w.expectQuiet("the sink writes")

	t.Log("---- 2. ClickHouse out of reach")
	proxy.Cut()
	w.waitFiring("MeterlineSinkClickHouseDown", down)
	// Longer than the scaled for: again, one alert for the outage, which
	// says why.
	for start := time.Now(); time.Since(start) < 10*time.Second; time.Sleep(500 * time.Millisecond) {
		n := 0
		for _, a := range w.active() {
			if matches(a, "MeterlineSinkClickHouseDown", nil) {
				n++
				if s := a.Annotations["summary"]; a.State == "firing" && !strings.HasSuffix(s, "(unreachable)") {
					t.Fatalf("ClickHouse out of reach, summary %q", s)
				}
			}
		}
		if n != 1 {
			t.Fatalf("%d alerts MeterlineSinkClickHouseDown for one outage:\n%s", n, w.describe())
		}
	}
	w.expectOnly("ClickHouse out of reach", "MeterlineSinkClickHouseDown", "MeterlineConsumerLagGrowing")
	cutRows := rows()

	t.Log("---- 3. ClickHouse in reach again")
	proxy.Restore()
	w.waitResolved("MeterlineSinkClickHouseDown", down)
	stopWriting()
	want := len(testenv.ReadAll(t, e.brokers, e.names.DedupedTopic()))
	deadline := time.Now().Add(60 * time.Second)
	for n := rows(); n != uint64(want); n = rows() {
		if n < cutRows || time.Now().After(deadline) {
			t.Fatalf("%d rows in %s (%d when ClickHouse was cut), want %d: one per record of %s",
				n, sink.TableEvents, cutRows, want, e.names.DedupedTopic())
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("%d rows written, %d of them after the outage", want, uint64(want)-cutRows)
	w.expectRulesHealthy()
	w.expectFired(realSinkCHAlertsFired)
	proc.Stop(t)
}
