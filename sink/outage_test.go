package sink

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/meterline/meterline/internal/testenv"
)

// outageServer is the ClickHouse instance that TestClickHouseOutage stops
// and starts, not the shared one: on the ports 124 (native) and 125 (HTTP)
// above the test server's native port, in the block of ports its runner
// owns (testenv.PortAbove), so that two runs on one machine, each with a
// test server of its own, do not collide.
type outageServer struct{ native, http string }

func newOutageServer(t *testing.T) outageServer {
	addr := testenv.RealClickHouse(t)
	return outageServer{testenv.PortAbove(t, addr, 124), testenv.PortAbove(t, addr, 125)}
}

func (s outageServer) script(t *testing.T, cmd string) {
	t.Helper()
	c := exec.Command("../deploy/local/clickhouse.sh", cmd)
	c.Env = append(os.Environ(), "CLICKHOUSE_PORT="+s.native, "CLICKHOUSE_HTTP_PORT="+s.http, "CLICKHOUSE_TLS_PORT=")
	out, err := c.CombinedOutput()
	if err != nil {
		t.Fatalf("clickhouse.sh %s (port %s): %v\n%s", cmd, s.native, err, out)
	}
	t.Logf("clickhouse.sh %s: %s", cmd, strings.TrimSpace(string(out)))
}

var servingAddr = regexp.MustCompile(`"msg":"serving metrics and health","addr":"([^"]+)"`)

func httpAddr(p *testenv.Process, t *testing.T) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if m := servingAddr.FindStringSubmatch(p.LogText()); m != nil {
			return m[1]
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("the sink did not log its HTTP address:\n%s", testenv.Tail(p.LogText(), 20))
	return ""
}

func readyz(addr string) (int, string) {
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

func waitReady(t *testing.T, addr string, want int, d time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		code, body := readyz(addr)
		if code == want {
			return body
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz = %d %q; want %d within %s", code, body, want, d)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestClickHouseOutage stops a ClickHouse instance for 30 s while events
// keep arriving and the real sink binary writes them. During the outage
// /readyz is not ready, no offset is committed and lag grows; after the
// restart every event is in the table exactly once (plain count()).
func TestClickHouseOutage(t *testing.T) {
	waitsMostly(t)
	e := newEnv(t, 4)
	testenv.Meterline(t) // built now, not while the load runs
	ch := newOutageServer(t)
	ch.script(t, "start")
	t.Cleanup(func() { ch.script(t, "stop") })
	addr := "127.0.0.1:" + ch.native
	db := fmt.Sprintf("outage_%d_%d", os.Getpid(), time.Now().UnixNano()%1e9)
	conn, err := Dial(ctxT(t, time.Minute), addr, db, true)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := Migrate(ctxT(t, time.Minute), conn); err != nil {
		t.Fatal(err)
	}
	e.addr, e.db, e.conn = addr, db, conn

	// A steady load: 40 events every 100 ms over the four partitions.
	var (
		mu       sync.Mutex
		produced int
	)
	loadCtx, stopLoad := context.WithCancel(context.Background())
	loadDone := make(chan struct{})
	go func() {
		defer close(loadDone)
		i := 0
		for loadCtx.Err() == nil {
			var recs []*kgo.Record
			for k := 0; k < 40; k++ {
				p := int32(i % 4)
				recs = append(recs, deduped(e.names.DedupedTopic(), p, i, base.Add(time.Duration(i)*time.Millisecond)))
				i++
			}
			if err := e.prod.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
				t.Errorf("produce: %v", err)
				return
			}
			mu.Lock()
			produced += len(recs)
			mu.Unlock()
			select {
			case <-loadCtx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	defer stopLoad()

	p := e.spawn("", e.sinkArgs("--max-batch-records", "1000")...)
	http := httpAddr(p, t)
	waitReady(t, http, 200, time.Minute)
	// The outage hits a sink that has committed offsets on every partition
	// of usage.deduped.
	adm := testenv.Admin(t, e.brokers)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		offs, err := adm.FetchOffsets(context.Background(), e.group)
		n := 0
		if err == nil {
			offs.Each(func(o kadm.OffsetResponse) {
				if o.Topic == e.names.DedupedTopic() && o.Err == nil && o.At >= 0 {
					n++
				}
			})
		}
		if n == int(e.parts) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sink committed offsets on %d of %d partitions in a minute", n, e.parts)
		}
	}
	before := e.count(TableEvents)
	if before == 0 {
		t.Fatal("nothing written before the outage")
	}

	ch.script(t, "stop")
	stopped := time.Now()
	body := waitReady(t, http, 503, 15*time.Second)
	t.Logf("/readyz during the outage: %s", body)
	time.Sleep(3 * time.Second)
	c1 := e.committed(e.names.DedupedTopic())
	time.Sleep(20 * time.Second)
	c2 := e.committed(e.names.DedupedTopic())
	if fmt.Sprint(c1) != fmt.Sprint(c2) {
		t.Errorf("offsets committed while ClickHouse was down: %v → %v", c1, c2)
	}
	if code, body := readyz(http); code != 503 {
		t.Errorf("/readyz = %d %q late in the outage, want 503", code, body)
	}
	if ok, _ := testenv.CaughtUp(e.brokers, e.group, e.names.DedupedTopic()); ok {
		t.Errorf("caught up during the outage: lag should grow")
	}
	time.Sleep(time.Until(stopped.Add(30 * time.Second)))
	ch.script(t, "start")
	t.Logf("clickhouse was down %s", time.Since(stopped).Round(time.Second))
	waitReady(t, http, 200, time.Minute)
	time.Sleep(3 * time.Second)
	stopLoad()
	<-loadDone
	e.waitCaughtUp(2*time.Minute, e.names.DedupedTopic())
	p.Stop(t)
	mu.Lock()
	n := produced
	mu.Unlock()
	t.Logf("%d events produced, %d written before the outage", n, before)
	e.exact(TableEvents, uint64(n))
	if !strings.Contains(p.LogText(), "clickhouse unavailable: pausing fetching and backing off") {
		t.Errorf("no log line for the outage")
	}
	if !t.Failed() {
		_ = conn.Exec(context.Background(), "DROP DATABASE "+db)
	}
}
