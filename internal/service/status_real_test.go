package service_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/meterline/meterline/internal/service"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/producer"
)

// TestRealStatusPage runs `meterline run` (dedup and the aggregator)
// against the real broker, feeds it events, and loads its status page in
// headless Chromium. What the browser shows must be the process's real
// state: the partitions each stage owns are the ones the broker assigned
// to its group, records in and out are the records in the topics, lag is
// zero once the groups caught up. Then it restarts the process on an empty
// state directory and checks the restore state: every partition
// processing again, and the changelog records replayed equal to the
// records in each changelog topic.
func TestRealStatusPage(t *testing.T) {
	brokers := testenv.RealKafka(t)
	chromium := testenv.Chromium(t)
	bin := buildMeterline(t)

	const partitions = 3
	prefix := testenv.Name(t, "status") + "."
	names := topics.DefaultNames()
	names.Prefix = prefix
	dedupGroup, aggGroup := prefix+"dedup", prefix+"aggregate"
	adm := testenv.Admin(t, brokers)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var ns []string
		for _, sp := range topics.Specs(names, topics.DefaultLayout()) {
			ns = append(ns, sp.Name)
		}
		_, _ = adm.DeleteGroups(ctx, dedupGroup, aggGroup)
		_, _ = adm.DeleteTopics(ctx, ns...)
	})
	if out, err := exec.Command(bin, "topics", "create", "--brokers", strings.Join(brokers, ","),
		"--topic-prefix", prefix, "--partitions", strconv.Itoa(partitions)).CombinedOutput(); err != nil {
		t.Fatalf("meterline topics create: %v\n%s", err, out)
	}

	state := t.TempDir()
	args := []string{"run", "--brokers", strings.Join(brokers, ","), "--topic-prefix", prefix,
		"--dedup-group", dedupGroup, "--aggregate-group", aggGroup, "--no-sink",
		"--instance-id", "node-1", "--state-dir", state, "--metrics-addr", "127.0.0.1:0",
		"--tick-interval", "1h", // no tick records: the input is exactly what the test sends
		"--session-timeout", "6s", "--log-level", "info"}
	p := startProcess(t, bin, args...)

	// 300 events, 20 of them sent twice.
	prod, err := producer.New(producer.WithBrokers(brokers...), producer.WithTopic(names.EventsTopic()),
		producer.WithSource("statustest"), producer.WithLinger(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	now := time.Now().Add(-time.Minute)
	for i := range 300 {
		e := producer.Event{EventID: producer.EventID("statustest", strconv.Itoa(i)),
			CustomerID: []string{"acme", "globex", "initech"}[i%3], Meter: "api_calls", Quantity: 1, EventTime: now}
		copies := 1
		if i%15 == 0 {
			copies = 2
		}
		for range copies {
			if err := prod.Send(ctx, e); err != nil {
				t.Fatal(err)
			}
		}
	}
	testenv.WaitCaughtUp(t, brokers, dedupGroup, names.EventsTopic(), time.Minute)
	testenv.WaitCaughtUp(t, brokers, aggGroup, names.DedupedTopic(), time.Minute)

	count := func(topic string) int { return len(testenv.ReadAll(t, brokers, topic)) }
	v := loadPage(t, chromium, p.statusURL(t), partitions)
	t.Logf("page: %v", v)
	expect(t, v, "ready", "ready")
	for _, sg := range []struct{ stage, group, input string }{
		{"dedup", dedupGroup, names.EventsTopic()},
		{"aggregate", aggGroup, names.DedupedTopic()},
	} {
		k := "stage/" + sg.stage + "/"
		expect(t, v, k+"state", "running")
		expect(t, v, k+"group", sg.group)
		expect(t, v, k+"instance", "node-1")
		expect(t, v, k+"input", sg.input)
		// Owned partitions: what the broker assigned to the group.
		assigned := groupAssignment(t, adm, sg.group, sg.input)
		expect(t, v, k+"partitions", joinInts(assigned))
		expect(t, v, k+"owned", strconv.Itoa(len(assigned)))
		expect(t, v, k+"restoring", "0")
		for _, part := range assigned {
			expect(t, v, fmt.Sprintf("part/%s/%d/state", sg.stage, part), "processing")
		}
		// Caught up: lag zero on every partition, if the process exports
		// lag at all; n/a otherwise.
		if _, lagged := v["lag/"+sg.group+"/"+sg.input+"/0/records"]; lagged {
			expect(t, v, k+"lag_records", "0")
			for part := range partitions {
				expect(t, v, fmt.Sprintf("lag/%s/%s/%d/records", sg.group, sg.input, part), "0")
				expect(t, v, fmt.Sprintf("part/%s/%d/lag_records", sg.stage, part), "0")
			}
		} else {
			expect(t, v, k+"lag_records", "n/a")
		}
		// A fresh start: nothing to replay.
		expect(t, v, k+"replayed", "0")
	}
	// Records in and out: the records in the topics (no transaction was
	// aborted, so nothing was consumed twice).
	events := count(names.EventsTopic())
	if events != 320 {
		t.Fatalf("usage.events holds %d records, want the 320 sent", events)
	}
	expect(t, v, "stage/dedup/in", strconv.Itoa(events))
	deduped := count(names.DedupedTopic())
	expect(t, v, "stage/dedup/out", strconv.Itoa(deduped+count(names.DuplicatesTopic())+count(names.RejectedTopic())))
	expect(t, v, "stage/aggregate/in", strconv.Itoa(deduped))
	expect(t, v, "stage/aggregate/out", strconv.Itoa(count(names.AggregatesTopic())+count(names.AdjustmentsTopic())))
	// The first look at the page: rates since the start, so above zero.
	if r, err := strconv.ParseFloat(v["stage/dedup/in_rate"], 64); err != nil || r <= 0 || r > float64(events) {
		t.Errorf("dedup in/s = %q, want a rate in (0, %d]", v["stage/dedup/in_rate"], events)
	}

	// Restart on an empty state directory: every partition restores from
	// the changelog.
	p.stop(t)
	if err := os.RemoveAll(state); err != nil {
		t.Fatal(err)
	}
	p = startProcess(t, bin, args...)
	v = loadPage(t, chromium, p.statusURL(t), partitions)
	t.Logf("page after the restart: %v", v)
	for _, sg := range []struct{ stage, group, input, changelog string }{
		{"dedup", dedupGroup, names.EventsTopic(), names.DedupChangelogTopic()},
		{"aggregate", aggGroup, names.DedupedTopic(), names.AggregateChangelogTopic()},
	} {
		k := "stage/" + sg.stage + "/"
		assigned := groupAssignment(t, adm, sg.group, sg.input)
		expect(t, v, k+"partitions", joinInts(assigned))
		expect(t, v, k+"restoring", "0")
		for _, part := range assigned {
			expect(t, v, fmt.Sprintf("part/%s/%d/state", sg.stage, part), "processing")
		}
		expect(t, v, k+"replayed", strconv.Itoa(count(sg.changelog)))
		expect(t, v, k+"in", "0") // everything was committed before the restart
	}
}

// loadPage waits until the process is ready and each of its stages owns
// partitions, none restoring (per /status.json), then loads its status page
// in headless Chromium and returns the values it shows.
func loadPage(t *testing.T, chromium, url string, partitions int) map[string]string {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	var last string
	for settled := false; !settled; {
		st, err := statusJSON(url)
		settled = err == nil && st.Ready && len(st.Stages) > 0
		for _, sg := range st.Stages {
			settled = settled && len(sg.Partitions) == partitions && sg.Restoring == 0
		}
		last = fmt.Sprintf("%+v (%v)", st, err)
		if !settled && time.Now().After(deadline) {
			t.Fatalf("%s never showed every stage ready with %d partitions; last: %s", url, partitions, last)
		}
		if !settled {
			time.Sleep(100 * time.Millisecond)
		}
	}
	// A rate needs at least a second of history (rateMin): on a fast
	// machine the stages can settle sooner after the start than that, and
	// the page then rightly shows "n/a".
	time.Sleep(1100 * time.Millisecond)
	dom := testenv.DumpDOM(t, chromium, url)
	if !strings.Contains(dom, "<h1>Meterline</h1>") {
		t.Fatalf("the browser did not render the status page:\n%s", dom)
	}
	return testenv.PageValues(dom)
}

func statusJSON(url string) (service.Status, error) {
	var st service.Status
	resp, err := http.Get(strings.TrimSuffix(url, "/") + "/status.json")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

func expect(t *testing.T, v map[string]string, key, want string) {
	t.Helper()
	got, ok := v[key]
	switch {
	case !ok:
		t.Errorf("the page does not show %s", key)
	case got != want:
		t.Errorf("the page shows %s = %q; the real state is %q", key, got, want)
	}
}

func joinInts(ps []int32) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = strconv.Itoa(int(p))
	}
	return strings.Join(s, ", ")
}

// groupAssignment is the partitions of topic the broker assigned to the
// group's members.
func groupAssignment(t *testing.T, adm *kadm.Client, group, topic string) []int32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dg, err := adm.DescribeGroups(ctx, group)
	if err != nil {
		t.Fatalf("describe group %s: %v", group, err)
	}
	var out []int32
	for _, m := range dg[group].Members {
		if ca, ok := m.Assigned.AsConsumer(); ok {
			for _, tp := range ca.Topics {
				if tp.Topic == topic {
					out = append(out, tp.Partitions...)
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

func buildMeterline(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "meterline")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/meterline/meterline/cmd/meterline").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

type process struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// startProcess runs the binary with a clean METERLINE_* environment; it is
// killed when the test ends, and its log printed if the test failed.
func startProcess(t *testing.T, bin string, args ...string) *process {
	t.Helper()
	p := &process{log: filepath.Join(t.TempDir(), "meterline.log"), done: make(chan struct{})}
	lf, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	p.cmd = exec.Command(bin, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "METERLINE_") {
			p.cmd.Env = append(p.cmd.Env, kv)
		}
	}
	p.cmd.Stdout, p.cmd.Stderr = lf, lf
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = p.cmd.Wait()
		lf.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			b, _ := os.ReadFile(p.log)
			t.Logf("log of meterline %s:\n%s", args[0], b)
		}
	})
	return p
}

var statusLine = regexp.MustCompile(`"status_page":"(http://[^"]+)"`)

// statusURL reads the status page's address from the process's log.
func (p *process) statusURL(t *testing.T) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if f, err := os.Open(p.log); err == nil {
			sc := bufio.NewScanner(f)
			sc.Buffer(make([]byte, 1<<20), 1<<24)
			for sc.Scan() {
				if m := statusLine.FindStringSubmatch(sc.Text()); m != nil {
					f.Close()
					return m[1]
				}
			}
			f.Close()
		}
		select {
		case <-p.done:
			t.Fatalf("meterline exited (%v) before serving its status page", p.cmd.ProcessState)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("no status page address in the log after 30s")
		}
	}
}

// stop ends the process with SIGTERM, as an operator would, and waits.
func (p *process) stop(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		t.Fatal("meterline did not stop within 60s of SIGTERM")
	}
	if !p.cmd.ProcessState.Success() {
		t.Fatalf("meterline exited with %v after SIGTERM", p.cmd.ProcessState)
	}
}
