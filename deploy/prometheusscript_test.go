package deploy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/testenv"
)

// TestRealPrometheusScriptTargets: local/prometheus.sh started with
// PROMETHEUS_TARGETS scrapes those targets and no other. local.yml's
// three targets are those of the stages run one per process; against
// `meterline run` alone (docs/operations.md, Dashboard and
// docker-compose) two of them never answer, and MeterlineStageDown
// fires for them.
func TestRealPrometheusScriptTargets(t *testing.T) {
	promBin := realPrometheus(t, "prometheus.sh targets")
	work := testenv.LogDir(t, "meterline-prometheus-script-*") // "meterline" marks our prometheus for prometheus.sh
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "meterline_build_info 1")
	}))
	defer target.Close()
	_, port, _ := strings.Cut(testenv.FreeAddr(t), ":")
	script := func(cmd string) {
		c := exec.Command("local/prometheus.sh", cmd)
		c.Env = append(os.Environ(), "PROMETHEUS_PORT="+port, "PROMETHEUS_DATA_DIR="+filepath.Join(work, "prom"),
			"PROMETHEUS_TARGETS="+target.Listener.Addr().String(), "PATH="+filepath.Dir(promBin)+":"+os.Getenv("PATH"))
		if out, err := c.CombinedOutput(); err != nil {
			t.Fatalf("prometheus.sh %s: %v\n%s", cmd, err, out)
		}
	}
	script("start")
	defer script("stop")
	deadline := time.Now().Add(30 * time.Second)
	for {
		var got []string
		resp, err := http.Get("http://127.0.0.1:" + port + "/api/v1/targets")
		if err != nil {
			t.Fatal(err)
		}
		var body struct {
			Data struct {
				ActiveTargets []struct {
					ScrapeURL string `json:"scrapeUrl"`
					Health    string `json:"health"`
				} `json:"activeTargets"`
			} `json:"data"`
		}
		err = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range body.Data.ActiveTargets {
			got = append(got, a.ScrapeURL+" "+a.Health)
		}
		want := target.URL + "/metrics up"
		if len(got) == 1 && got[0] == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("targets %s; want only %q", strings.Join(got, ", "), want)
		}
		time.Sleep(500 * time.Millisecond)
	}
}
