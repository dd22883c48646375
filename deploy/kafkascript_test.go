package deploy

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meterline/meterline/internal/testenv"
)

// TestKafkaScriptHintNamesItsBroker: local/kafka.sh refuses to start a
// data dir formatted with another KAFKA_SECURITY, and the command its
// message tells to run acts on that broker: with the KAFKA_PORT and
// KAFKA_DATA_DIR it was given, not a bare "kafka.sh clean", which deletes
// the data of the default port's broker. The refusal comes before the
// script fetches Kafka's jars.
func TestKafkaScriptHintNamesItsBroker(t *testing.T) {
	if _, err := exec.LookPath("java"); err != nil {
		t.Skip("SKIP: kafka.sh start needs java on PATH")
	}
	dir := filepath.Join(t.TempDir(), "kafka")
	for _, f := range []string{".meterline-kafka", "kraft-data/meta.properties"} { // formatted, plaintext
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	_, port, _ := strings.Cut(testenv.FreeAddr(t), ":")
	c := exec.Command("local/kafka.sh", "start")
	c.Env = append(os.Environ(), "KAFKA_PORT="+port, "KAFKA_CONTROLLER_PORT=1" /* never listening */, "KAFKA_DATA_DIR="+dir,
		"KAFKA_SECURITY=sasl_ssl", "METERLINE_CACHE_DIR="+t.TempDir())
	out, err := c.CombinedOutput()
	if err == nil {
		t.Fatalf("start succeeded on a data dir formatted without SASL:\n%s", out)
	}
	want := "run 'KAFKA_PORT=" + port + " KAFKA_DATA_DIR=" + dir + " "
	if !strings.Contains(string(out), "formatted with KAFKA_SECURITY=plaintext") || !strings.Contains(string(out), want) {
		t.Fatalf("kafka.sh start said:\n%s\nwant the refusal, with a command that starts %q", out, want)
	}
}

// TestKafkaScriptStartBrokerRefusesAPausedBroker: `start-broker N` waits
// until broker N serves, and a broker paused with pause-broker (SIGSTOP)
// does not serve, though its port still takes connections: the script
// must not answer "already running" and exit 0 for it (a test that starts
// a broker after a fault would go on against a frozen broker), but say it
// is paused and how to resume it. The broker is a stand-in: a stopped
// process with the broker's command line and a listening port.
func TestKafkaScriptStartBrokerRefusesAPausedBroker(t *testing.T) {
	if _, err := exec.LookPath("java"); err != nil {
		t.Skip("SKIP: kafka.sh start-broker needs java on PATH")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	dir := filepath.Join(t.TempDir(), "cluster")
	node := filepath.Join(dir, "node-2")
	if err := os.MkdirAll(node, 0o755); err != nil {
		t.Fatal(err)
	}
	// "sleep; :" keeps bash from exec'ing sleep: its command line names
	// the broker's main class and server.properties.
	fake := exec.Command("bash", "-c", "sleep 600; :", "kafka.Kafka", filepath.Join(node, "server.properties"))
	if err := fake.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = fake.Process.Kill(); _ = fake.Wait() }()
	pid := strconv.Itoa(fake.Process.Pid)
	for f, v := range map[string]string{
		filepath.Join(dir, ".meterline-kafka-cluster"): "", filepath.Join(dir, "cluster.id"): "AAAAAAAAAAAAAAAAAAAAAB\n",
		filepath.Join(node, ".meterline-kafka"): "", filepath.Join(node, "kafka.pid"): pid + "\n", filepath.Join(node, "kafka.ready"): pid + "\n",
	} {
		if err := os.WriteFile(f, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := fake.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	script := func(args ...string) (string, error) {
		c := exec.Command("local/kafka.sh", args...)
		c.Env = append(os.Environ(), "KAFKA_CLUSTER=3", "KAFKA_PORT="+strconv.Itoa(port-1), "KAFKA_CONTROLLER_PORT=1", /* never listening */
			"KAFKA_DATA_DIR="+dir, "METERLINE_CACHE_DIR="+t.TempDir())
		out, err := c.CombinedOutput()
		return string(out), err
	}
	var out string
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if out, _ = script("status"); strings.Contains(out, "broker 2: paused pid="+pid) {
			break
		}
	}
	if !strings.Contains(out, "broker 2: paused pid="+pid) {
		t.Fatalf("kafka.sh status with broker 2 stopped:\n%s", out)
	}
	out, err = script("start-broker", "2")
	if err == nil || !strings.Contains(out, "paused") || !strings.Contains(out, "resume-broker 2") {
		t.Fatalf("kafka.sh start-broker 2 on a paused broker: %v\n%s\nwant a refusal that says it is paused and names resume-broker 2", err, out)
	}
}

// TestKafkaScriptStartKeepsARunningClusterReady: `start` on a cluster
// whose brokers all serve (what every real-cluster test's cleanup runs)
// leaves them as they are, and `status` still says each serves, after
// server.log has rolled past its ready line too (64 MB, minutes under
// load): the script keeps each broker's pid as ready, and must not
// overwrite that record (it wrote 0, read from the empty pid of a broker
// that was already running, so that status called the brokers "starting:
// not ready yet" and exited 3, and start-fresh wiped the serving
// cluster). The brokers are stand-ins: processes with the brokers' command
// lines and listening ports, and no server.log.
func TestKafkaScriptStartKeepsARunningClusterReady(t *testing.T) {
	if _, err := exec.LookPath("java"); err != nil {
		t.Skip("SKIP: kafka.sh start needs java on PATH")
	}
	base := listenRun(t, 3)
	dir := filepath.Join(t.TempDir(), "cluster")
	files := map[string]string{filepath.Join(dir, ".meterline-kafka-cluster"): "", filepath.Join(dir, "cluster.id"): "AAAAAAAAAAAAAAAAAAAAAB\n"}
	for n := 1; n <= 3; n++ {
		node := filepath.Join(dir, fmt.Sprintf("node-%d", n))
		if err := os.MkdirAll(filepath.Join(node, "kraft-data"), 0o755); err != nil {
			t.Fatal(err)
		}
		pid := fakeBroker(t, node)
		files[filepath.Join(node, ".meterline-kafka")] = ""
		files[filepath.Join(node, "kraft-data", "meta.properties")] = ""
		files[filepath.Join(node, "kafka.pid")] = pid + "\n"
		files[filepath.Join(node, "kafka.ready")] = pid + "\n"
	}
	for f, v := range files {
		if err := os.WriteFile(f, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	script := func(args ...string) (string, error) {
		c := exec.Command("local/kafka.sh", args...)
		c.Env = append(os.Environ(), "KAFKA_CLUSTER=3", "KAFKA_PORT="+strconv.Itoa(base), "KAFKA_CONTROLLER_PORT=1", /* never listening */
			"KAFKA_DATA_DIR="+dir, "KAFKA_START_TIMEOUT=10")
		// Its own process group: a script that signals pid 0 signals
		// its group, never the test's.
		c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		out, err := c.CombinedOutput()
		return string(out), err
	}
	if out, err := script("status"); err != nil {
		t.Fatalf("kafka.sh status before start: %v\n%s", err, out)
	}
	if out, err := script("start"); err != nil || strings.Count(out, "already running") != 3 {
		t.Fatalf("kafka.sh start on a running cluster: %v\n%s", err, out)
	}
	if out, err := script("status"); err != nil || strings.Count(out, ": running pid=") != 3 || strings.Contains(out, "not ready") {
		t.Fatalf("kafka.sh status after start on a running cluster: %v, want exit 0 and every broker serving\n%s", err, out)
	}
}

// listenRun listens on n consecutive ports of 127.0.0.1 until the test
// ends and returns the first.
func listenRun(t *testing.T, n int) int {
	t.Helper()
	for range 50 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns := []net.Listener{ln}
		base := ln.Addr().(*net.TCPAddr).Port
		for i := 1; i < n; i++ {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", base+i))
			if err != nil {
				break
			}
			lns = append(lns, l)
		}
		if len(lns) == n {
			t.Cleanup(func() {
				for _, l := range lns {
					_ = l.Close()
				}
			})
			return base
		}
		for _, l := range lns {
			_ = l.Close()
		}
	}
	t.Fatalf("no %d consecutive free ports", n)
	return 0
}

// fakeBroker starts a process whose command line is the broker's of the
// node directory (kafka.sh's pid check) and returns its pid.
func fakeBroker(t *testing.T, node string) string {
	t.Helper()
	// "sleep; :" keeps bash from exec'ing sleep.
	fake := exec.Command("bash", "-c", "sleep 600; :", "kafka.Kafka", filepath.Join(node, "server.properties"))
	if err := fake.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fake.Process.Kill(); _ = fake.Wait() })
	return strconv.Itoa(fake.Process.Pid)
}
