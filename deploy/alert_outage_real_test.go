package deploy

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/testenv"
)

// ownBroker is a plaintext broker of the test's own, run by
// deploy/local/kafka.sh on the test broker's port + 10 (its controller +
// 11) with its data in a directory of the test's, and stopped when the test
// ends: script runs the script (start, stop), keeping the data between a
// stop and the next start; brokers are its address.
func ownBroker(t *testing.T, work string) (script func(args ...string), brokers []string) {
	t.Helper()
	return ownKafka(t, work, 1, 10, 11)
}

// ownKafka is ownBroker for a cluster of nodes (deploy/local/kafka.sh's
// KAFKA_CLUSTER), node n's broker on the test broker's port + port + n - 1
// and its controller on its port + controller + n - 1.
func ownKafka(t *testing.T, work string, nodes, port, controller int) (script func(args ...string), brokers []string) {
	t.Helper()
	seed := testenv.RealKafka(t)[0]
	env := []string{"KAFKA_PORT=" + testenv.PortAbove(t, seed, port), "KAFKA_CONTROLLER_PORT=" + testenv.PortAbove(t, seed, controller),
		"KAFKA_CLUSTER=" + strconv.Itoa(nodes), "KAFKA_DATA_DIR=" + filepath.Join(work, "kafka"), "KAFKA_HEAP_OPTS=-Xms128m -Xmx256m"}
	for n := range nodes {
		brokers = append(brokers, "127.0.0.1:"+testenv.PortAbove(t, seed, port+n))
	}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KAFKA_") { // make exports KAFKA_PORT
			env = append(env, kv)
		}
	}
	// started: the script was asked to start brokers since its last
	// stop (even if the start failed part way, or a broker was killed
	// since: the others still run).
	started := false
	script = func(args ...string) {
		t.Helper()
		start := time.Now()
		c := exec.Command(filepath.Join("local", "kafka.sh"), args...)
		c.Env = env
		started = started || args[0] == "start" || args[0] == "start-broker"
		out, err := c.CombinedOutput()
		if err != nil {
			t.Fatalf("kafka.sh %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		if args[0] == "stop" {
			started = false
		}
		t.Logf("kafka.sh %s (%s): %s", strings.Join(args, " "), time.Since(start).Round(time.Millisecond), strings.TrimSpace(string(out)))
	}
	t.Cleanup(func() {
		if started {
			script("stop")
		}
		// No broker of the test's may outlive it: later tests reuse
		// the ports, and each holds memory and CPU.
		for _, b := range brokers {
			if conn, err := net.DialTimeout("tcp", b, time.Second); err == nil {
				conn.Close()
				t.Errorf("a broker still listens on %s after the test", b)
			}
		}
	})
	return script, brokers
}

// httpStatus is the status code of a GET of u, or 0 when it fails.
func httpStatus(u string) int {
	resp, err := http.Get(u)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestRealKafkaOutageAlert runs the shipped alert rules (scaled as
// TestRealAlertsFire's, realScale) in a real Prometheus scraping a real
// `meterline dedup` on a broker of the test's own (ownBroker):
//
//  1. Prometheus scrapes dedup from before it joins its group: joining
//     for the first time fires nothing; once ready, no alert is active.
//  2. The broker stopped: dedup loses its group (/readyz 503) while its
//     scrapes succeed, and MeterlineStageNotInGroup fires.
//  3. The broker started again: dedup rejoins, is ready, and the alert
//     resolves.
func TestRealKafkaOutageAlert(t *testing.T) {
	promBin := realPrometheus(t, "alert rules")
	parallelAlertTest(t)
	testStart := time.Now()
	work := testenv.LogDir(t, "meterline-alerts-outage-test-*")
	bin := testenv.Meterline(t)
	keys := testenv.DedupKeysFile(t)
	script, brokers := ownBroker(t, work)
	script("start")

	prefix := testenv.Name(t, "alertsoutage") + "."
	runCmd(t, bin, filepath.Join(work, "topics.log"), "topics", "create", "--brokers", strings.Join(brokers, ","),
		"--topic-prefix", prefix, "--partitions", "2", "--replication-factor", "1")
	rulesFile := filepath.Join(work, "alerts.yml")
	if err := os.WriteFile(rulesFile, scaledRules(t, realScale), 0o644); err != nil {
		t.Fatal(err)
	}
	dedupAddr := testenv.FreeAddr(t)
	phase := func(name string) {
		t.Logf("---- %s (at %s)", name, time.Since(testStart).Round(100*time.Millisecond))
	}

	phase("1. dedup joins its group")
	dedup := testenv.StartProcess(t, "dedup", filepath.Join(work, "dedup.log"), bin, "dedup",
		"--brokers", strings.Join(brokers, ","), "--topic-prefix", prefix, "--log-level", "info",
		"--state-dir", filepath.Join(work, "state"), "--session-timeout", "6s", "--transaction-timeout", "10s",
		"--group", strings.TrimSuffix(prefix, ".")+"-dedup", "--instance-id", "d1", "--metrics-addr", dedupAddr,
		"--tick-interval", "1s", "--dedup-keys-file", keys)
	waitHTTP(t, "http://"+dedupAddr+"/healthz", 30*time.Second)
	prom := startPrometheus(t, promBin, work, rulesFile, dedupAddr)
	w := &alertWatch{t: t, prom: prom, fired: map[string]bool{}}
	notInGroup := map[string]string{"instance": dedupAddr, "stage": "dedup"}
	// Longer than the scaled rule needs to fire (8 s), from before the
	// join: a first join is no alert.
	var joined time.Time
	for ; joined.IsZero() || time.Since(joined) < 10*time.Second; time.Sleep(500 * time.Millisecond) {
		if a := w.find("MeterlineStageNotInGroup", notInGroup); a != nil && a.State == "firing" {
			t.Fatalf("MeterlineStageNotInGroup fires while dedup joins its group: %v", a)
		}
		if joined.IsZero() && httpStatus("http://"+dedupAddr+"/readyz") == http.StatusOK {
			joined = time.Now()
			t.Logf("dedup ready after %s", joined.Sub(dedup.Started()).Round(100*time.Millisecond))
		}
		if time.Since(dedup.Started()) > 60*time.Second {
			t.Fatalf("dedup not ready after 60 s")
		}
	}
	w.waitValue(`meterline_stream_group_member{stage="dedup"}`, 1, 10*time.Second)
	w.expectQuiet("dedup in its group")

	phase("2. the broker stopped")
	script("stop")
	w.waitFiring("MeterlineStageNotInGroup", notInGroup)
	if s := httpStatus("http://" + dedupAddr + "/readyz"); s != http.StatusServiceUnavailable {
		t.Errorf("/readyz of dedup without its broker: %d; want 503", s)
	}
	w.expectOnly("the broker stopped", "MeterlineStageNotInGroup", "MeterlineSessionRestarts", "MeterlineConsumerLagUnknown")

	phase("3. the broker started again")
	script("start")
	waitHTTP(t, "http://"+dedupAddr+"/readyz", 60*time.Second)
	w.waitResolved("MeterlineStageNotInGroup", notInGroup)
	phase("resolved")
	w.expectRulesHealthy()
	dedup.Stop(t)
}

// TestRealDuplicateInstanceAlert runs the shipped alert rules (scaled as
// TestRealAlertsFire's, realScale) in a real Prometheus scraping a real
// `meterline dedup` on the real broker:
//
//  1. Alone: no alert is active.
//  2. A second `meterline dedup` started with the same --group and
//     --instance-id (the same transactional ID): each new session of one
//     fences the other's producer, the first one's sessions are rebuilt
//     again and again, and MeterlineSessionRestarts fires; a log line
//     names the likely cause, another process with the same instance ID.
//  3. The second one stopped: the restarts stop and the alert resolves.
func TestRealDuplicateInstanceAlert(t *testing.T) {
	promBin := realPrometheus(t, "alert rules")
	parallelAlertTest(t)
	brokers := testenv.RealKafka(t)
	testStart := time.Now()
	work := testenv.LogDir(t, "meterline-alerts-dup-test-*")
	bin := testenv.Meterline(t)
	keys := testenv.DedupKeysFile(t)

	prefix := testenv.Name(t, "alertsdup") + "."
	deleteTopicsAfter(t, brokers, prefix)
	runCmd(t, bin, filepath.Join(work, "topics.log"), "topics", "create", "--brokers", strings.Join(brokers, ","),
		"--topic-prefix", prefix, "--partitions", "2", "--replication-factor", "1")
	rulesFile := filepath.Join(work, "alerts.yml")
	if err := os.WriteFile(rulesFile, scaledRules(t, realScale), 0o644); err != nil {
		t.Fatal(err)
	}
	phase := func(name string) {
		t.Logf("---- %s (at %s)", name, time.Since(testStart).Round(100*time.Millisecond))
	}
	start := func(n int, addr string) *testenv.Process {
		name := fmt.Sprintf("dedup-%d", n)
		return testenv.StartProcess(t, name, filepath.Join(work, name+".log"), bin, "dedup",
			"--brokers", strings.Join(brokers, ","), "--topic-prefix", prefix, "--log-level", "info",
			"--state-dir", filepath.Join(work, "state-"+name), "--session-timeout", "6s", "--transaction-timeout", "10s",
			"--group", strings.TrimSuffix(prefix, ".")+"-dedup", "--instance-id", "d1", "--metrics-addr", addr,
			"--tick-interval", "1s", "--dedup-keys-file", keys)
	}

	phase("1. one dedup")
	addr1 := testenv.FreeAddr(t)
	dedup1 := start(1, addr1)
	waitHTTP(t, "http://"+addr1+"/readyz", 60*time.Second)
	prom := startPrometheus(t, promBin, work, rulesFile, addr1)
	w := &alertWatch{t: t, prom: prom, fired: map[string]bool{}}
	w.waitValue(`meterline_stream_group_member{stage="dedup"}`, 1, 10*time.Second)
	time.Sleep(5 * time.Second)
	w.expectQuiet("one dedup")

	phase("2. a second dedup with the same --instance-id")
	dedup2 := start(2, testenv.FreeAddr(t))
	restarts := map[string]string{"instance": addr1, "stage": "dedup"}
	w.waitFiring("MeterlineSessionRestarts", restarts)
	hint := regexp.MustCompile(`another process is most likely running with the same --group and --instance-id`)
	dedup1.WaitLog(t, hint, 30*time.Second)
	w.expectOnly("two dedups with one instance ID", "MeterlineSessionRestarts", "MeterlineStageNotInGroup")

	phase("3. the second dedup stopped")
	dedup2.Stop(t)
	w.waitResolved("MeterlineSessionRestarts", restarts)
	phase("resolved")
	w.expectRulesHealthy()
	dedup1.Stop(t)
}
