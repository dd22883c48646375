package service_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/service"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/topics"
	"github.com/meterline/meterline/producer"
)

// TestMain removes the meterline binary testenv.Meterline built.
func TestMain(m *testing.M) { testenv.Main(m) }

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
	bin := testenv.Meterline(t)

	const partitions = 3
	prefix := testenv.Name(t, "status") + "."
	names := topics.DefaultNames()
	names.Prefix = prefix
	dedupGroup, aggGroup := prefix+"dedup", prefix+"aggregate"
	adm := deleteAfter(t, brokers, names, dedupGroup, aggGroup)
	if out, err := exec.Command(bin, "topics", "create", "--brokers", strings.Join(brokers, ","),
		"--topic-prefix", prefix, "--partitions", strconv.Itoa(partitions)).CombinedOutput(); err != nil {
		t.Fatalf("meterline topics create: %v\n%s", err, out)
	}

	state := t.TempDir()
	args := []string{"run", "--brokers", strings.Join(brokers, ","), "--topic-prefix", prefix,
		"--dedup-group", dedupGroup, "--aggregate-group", aggGroup, "--no-sink",
		"--instance-id", "node-1", "--state-dir", state, "--metrics-addr", "127.0.0.1:0",
		"--dedup-tick-interval", "1h", // no tick records: the input is exactly what the test sends
		"--session-timeout", "6s", "--log-level", "info", "--dedup-keys-file", testenv.DedupKeysFile(t)}
	p := testenv.StartProcess(t, "meterline run", filepath.Join(t.TempDir(), "meterline.log"), bin, args...)

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
	v := loadPage(t, chromium, statusURL(t, p), partitions)
	t.Logf("page: %v", v)
	testenv.ExpectPageValue(t, v, "ready", "ready")
	for _, sg := range []struct{ stage, group, input string }{
		{"dedup", dedupGroup, names.EventsTopic()},
		{"aggregate", aggGroup, names.DedupedTopic()},
	} {
		k := "stage/" + sg.stage + "/"
		testenv.ExpectPageValue(t, v, k+"state", "running")
		testenv.ExpectPageValue(t, v, k+"group", sg.group)
		testenv.ExpectPageValue(t, v, k+"instance", "node-1")
		testenv.ExpectPageValue(t, v, k+"input", sg.input)
		// Owned partitions: what the broker assigned to the group.
		assigned := testenv.GroupAssignment(t, adm, sg.group, sg.input)
		testenv.ExpectPageValue(t, v, k+"partitions", joinInts(assigned))
		testenv.ExpectPageValue(t, v, k+"owned", strconv.Itoa(len(assigned)))
		testenv.ExpectPageValue(t, v, k+"restoring", "0")
		for _, part := range assigned {
			testenv.ExpectPageValue(t, v, fmt.Sprintf("part/%s/%d/state", sg.stage, part), "processing")
		}
		// Caught up: lag zero on every partition, if the process exports
		// lag at all; n/a otherwise.
		if _, lagged := v["lag/"+sg.group+"/"+sg.input+"/0/records"]; lagged {
			testenv.ExpectPageValue(t, v, k+"lag_records", "0")
			for part := range partitions {
				testenv.ExpectPageValue(t, v, fmt.Sprintf("lag/%s/%s/%d/records", sg.group, sg.input, part), "0")
				testenv.ExpectPageValue(t, v, fmt.Sprintf("part/%s/%d/lag_records", sg.stage, part), "0")
			}
		} else {
			testenv.ExpectPageValue(t, v, k+"lag_records", "n/a")
		}
		// A fresh start: nothing to replay.
		testenv.ExpectPageValue(t, v, k+"replayed", "0")
	}
	// Records in and out: the records in the topics (no transaction was
	// aborted, so nothing was consumed twice).
	events := count(names.EventsTopic())
	if events != 320 {
		t.Fatalf("usage.events holds %d records, want the 320 sent", events)
	}
	testenv.ExpectPageValue(t, v, "stage/dedup/in", strconv.Itoa(events))
	deduped := count(names.DedupedTopic())
	testenv.ExpectPageValue(t, v, "stage/dedup/out", strconv.Itoa(deduped+count(names.DuplicatesTopic())+count(names.RejectedTopic())))
	testenv.ExpectPageValue(t, v, "stage/aggregate/in", strconv.Itoa(deduped))
	testenv.ExpectPageValue(t, v, "stage/aggregate/out", strconv.Itoa(count(names.AggregatesTopic())+count(names.AdjustmentsTopic())))
	// The first look at the page: rates since the start, so above zero.
	if r, err := strconv.ParseFloat(v["stage/dedup/in_rate"], 64); err != nil || r <= 0 || r > float64(events) {
		t.Errorf("dedup in/s = %q, want a rate in (0, %d]", v["stage/dedup/in_rate"], events)
	}

	// Restart on an empty state directory: every partition restores from
	// the changelog.
	p.Stop(t)
	if err := os.RemoveAll(state); err != nil {
		t.Fatal(err)
	}
	p = testenv.StartProcess(t, "meterline run", filepath.Join(t.TempDir(), "meterline.log"), bin, args...)
	v = loadPage(t, chromium, statusURL(t, p), partitions)
	t.Logf("page after the restart: %v", v)
	for _, sg := range []struct{ stage, group, input, changelog string }{
		{"dedup", dedupGroup, names.EventsTopic(), names.DedupChangelogTopic()},
		{"aggregate", aggGroup, names.DedupedTopic(), names.AggregateChangelogTopic()},
	} {
		k := "stage/" + sg.stage + "/"
		assigned := testenv.GroupAssignment(t, adm, sg.group, sg.input)
		testenv.ExpectPageValue(t, v, k+"partitions", joinInts(assigned))
		testenv.ExpectPageValue(t, v, k+"restoring", "0")
		for _, part := range assigned {
			testenv.ExpectPageValue(t, v, fmt.Sprintf("part/%s/%d/state", sg.stage, part), "processing")
		}
		testenv.ExpectPageValue(t, v, k+"replayed", strconv.Itoa(count(sg.changelog)))
		testenv.ExpectPageValue(t, v, k+"in", "0") // everything was committed before the restart
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

func joinInts(ps []int32) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = strconv.Itoa(int(p))
	}
	return strings.Join(s, ", ")
}

var statusLine = regexp.MustCompile(`"status_page":"(http://[^"]+)"`)

// statusURL reads the status page's address from the process's log.
func statusURL(t *testing.T, p *testenv.Process) string {
	t.Helper()
	return p.WaitLog(t, statusLine, 30*time.Second)[1]
}
