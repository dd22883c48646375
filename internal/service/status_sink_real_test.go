package service_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/meterline/meterline/internal/service"
	"github.com/meterline/meterline/internal/testenv"
	"github.com/meterline/meterline/internal/topics"
)

// TestRealSinkStatus: `meterline sink` on the real broker and ClickHouse
// shows on its status page, as every stage does (docs/operations.md,
// Status page), its consumer group, its instance ID and its consumer lag,
// not only the partition count its metrics give.
func TestRealSinkStatus(t *testing.T) {
	brokers := testenv.RealKafka(t)
	chAddr := testenv.RealClickHouse(t)
	_, db := testenv.ClickHouseDB(t)
	bin := testenv.Meterline(t)

	prefix := testenv.Name(t, "sinkstatus") + "."
	names := topics.DefaultNames()
	names.Prefix = prefix
	group := prefix + "sink"
	deleteAfter(t, brokers, names, group)
	if out, err := exec.Command(bin, "topics", "create", "--brokers", strings.Join(brokers, ","),
		"--topic-prefix", prefix, "--partitions", "2").CombinedOutput(); err != nil {
		t.Fatalf("meterline topics create: %v\n%s", err, out)
	}
	addr := testenv.FreeAddr(t)
	testenv.StartProcess(t, "sink", filepath.Join(t.TempDir(), "sink.log"), bin, "sink",
		"--brokers", strings.Join(brokers, ","), "--clickhouse", chAddr, "--database", db, "--migrate",
		"--topic-prefix", prefix, "--group", group, "--instance-id", "s1", "--metrics-addr", addr)

	var sg service.StageStatus
	for end := time.Now().Add(90 * time.Second); time.Now().Before(end); time.Sleep(time.Second) {
		resp, err := http.Get("http://" + addr + "/status.json")
		if err != nil {
			continue
		}
		var st service.Status
		err = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("status.json: %v", err)
		}
		for _, s := range st.Stages {
			if s.Stage == "sink" {
				sg = s
			}
		}
		if sg.Owned > 0 && sg.LagRecords != nil {
			break
		}
	}
	if sg.Group != group || sg.Instance != "s1" {
		t.Errorf("sink's status: group %q, instance %q; want %q, %q", sg.Group, sg.Instance, group, "s1")
	}
	if sg.Owned == 0 || sg.LagRecords == nil || *sg.LagRecords != 0 {
		t.Errorf("sink's status: %d partitions owned, lag %v; want its partitions and a lag of 0", sg.Owned, sg.LagRecords)
	}
}

// deleteAfter returns an admin client of the brokers, and deletes the
// test's topics and groups when the test ends.
func deleteAfter(t *testing.T, brokers []string, names topics.Names, groups ...string) *kadm.Client {
	adm := testenv.Admin(t, brokers)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var ns []string
		for _, sp := range topics.Specs(names, topics.DefaultLayout()) {
			ns = append(ns, sp.Name)
		}
		_, _ = adm.DeleteGroups(ctx, groups...)
		_, _ = adm.DeleteTopics(ctx, ns...)
	})
	return adm
}
