package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/meterline/meterline/internal/kafka"
	"github.com/meterline/meterline/internal/secret"
	"github.com/meterline/meterline/internal/tlsconfig"
	"github.com/meterline/meterline/producer"
)

// stage is one running stage process and what the sampler saw of it.
type stage struct {
	name    string
	addr    string // metrics and health
	logFile string
	cmd     *exec.Cmd

	mu      sync.Mutex
	samples []sample // scrapes of /metrics
	ready   []sample // answers of /readyz
}

// sample is one look at a stage: its committed transactions and session
// restarts so far (a scrape), or whether /readyz answered 200 (why not).
type sample struct {
	at        time.Time
	committed float64
	restarts  float64
	ready     bool
	why       string
}

type experiment struct {
	o       options
	brokers []string
	kcfg    kafka.Config
	env     []string // the children's: the connection's METERLINE_KAFKA_*
	prefix  string
	stages  []*stage
	stopc   chan struct{}
	wg      sync.WaitGroup
	cl      *kgo.Client // the load's and the admin's
	closed  sync.Once
}

func newExperiment(o options) (*experiment, error) {
	x := &experiment{o: o, prefix: fmt.Sprintf("bf%d.", time.Now().Unix()), stopc: make(chan struct{})}
	for i := range 3 {
		x.brokers = append(x.brokers, fmt.Sprintf("127.0.0.1:%d", o.kafkaPort+i))
	}
	x.kcfg = kafka.Config{Brokers: x.brokers}
	x.env = os.Environ()
	sec := filepath.Join(o.clusterDir, "security")
	if pw, err := os.ReadFile(filepath.Join(sec, "passwords", "admin")); err == nil {
		x.kcfg.SASL = kafka.SASL{Mechanism: kafka.ScramSHA512, User: "admin", Password: secret.New(string(pw))}
		x.kcfg.TLS = tlsconfig.Files{CAFile: filepath.Join(sec, "ca.pem"), CertFile: filepath.Join(sec, "client.pem"),
			KeyFile: filepath.Join(sec, "client-key.pem")}
		x.env = append(x.env, "METERLINE_KAFKA_SASL_MECHANISM=SCRAM-SHA-512", "METERLINE_KAFKA_SASL_USER=admin",
			"METERLINE_KAFKA_SASL_PASSWORD_FILE="+filepath.Join(sec, "passwords", "admin"),
			"METERLINE_KAFKA_TLS_CA_FILE="+x.kcfg.TLS.CAFile, "METERLINE_KAFKA_TLS_CERT_FILE="+x.kcfg.TLS.CertFile,
			"METERLINE_KAFKA_TLS_KEY_FILE="+x.kcfg.TLS.KeyFile)
		log.Printf("SASL_SSL as admin (%s)", sec)
	} else {
		log.Printf("plaintext (no %s)", sec)
	}
	cl, err := kafka.NewClient(x.kcfg, kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))
	if err != nil {
		return nil, err
	}
	x.cl = cl
	return x, nil
}

// command runs the meterline binary to completion.
func (x *experiment) command(args ...string) error {
	cmd := exec.Command(x.o.bin, args...)
	cmd.Env = x.env
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("meterline %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// setup creates the topics, the ClickHouse database and dedup's key ring.
func (x *experiment) setup() (keys string, err error) {
	b := strings.Join(x.brokers, ",")
	if err := x.command("topics", "create", "--brokers", b, "--topic-prefix", x.prefix, "--partitions", "6"); err != nil {
		return "", err
	}
	if x.o.clickhouse != "" {
		if err := x.command("migrate", "--clickhouse", x.o.clickhouse, "--database", x.db()); err != nil {
			return "", err
		}
	}
	keys = filepath.Join(x.o.out, "dedup-keys")
	return keys, x.command("dedup-key", "--out", keys)
}

func (x *experiment) db() string { return strings.TrimSuffix(x.prefix, ".") }

func (x *experiment) group(st string) string { return x.prefix + st }

// start runs the stages, each with the defaults of its flags besides its
// names and state.
func (x *experiment) start(keys string) error {
	names := []string{"dedup", "aggregate"}
	if x.o.clickhouse != "" {
		names = append(names, "sink")
	}
	for i, n := range names {
		st := &stage{name: n, addr: fmt.Sprintf("127.0.0.1:%d", x.o.metricBase+i), logFile: filepath.Join(x.o.out, n+".log")}
		args := []string{n, "--brokers", strings.Join(x.brokers, ","), "--topic-prefix", x.prefix, "--group", x.group(n),
			"--instance-id", "i1", "--metrics-addr", st.addr}
		if x.o.debug[n] {
			args = append(args, "--log-level", "debug")
		}
		switch n {
		case "dedup":
			args = append(args, "--state-dir", filepath.Join(x.o.out, "state-dedup"), "--dedup-keys-file", keys)
		case "aggregate":
			args = append(args, "--state-dir", filepath.Join(x.o.out, "state-aggregate"))
		case "sink":
			args = append(args, "--clickhouse", x.o.clickhouse, "--database", x.db())
		}
		f, err := os.Create(st.logFile)
		if err != nil {
			return err
		}
		st.cmd = exec.Command(x.o.bin, args...)
		st.cmd.Env, st.cmd.Stdout, st.cmd.Stderr = x.env, f, f
		if err := st.cmd.Start(); err != nil {
			return err
		}
		x.stages = append(x.stages, st)
		x.wg.Add(1)
		go func() { defer x.wg.Done(); x.sample(st) }()
	}
	x.wg.Add(1)
	go func() { defer x.wg.Done(); x.load() }()
	return nil
}

// load sends o.rate events a second until the experiment stops.
func (x *experiment) load() {
	p, err := producer.New(producer.WithClient(x.cl), producer.WithTopic(x.prefix+"usage.events"), producer.WithSource("brokerfault"))
	if err != nil {
		log.Printf("load: %v", err)
		return
	}
	tk := time.NewTicker(10 * time.Millisecond)
	defer tk.Stop()
	n, carry := 0, 0.0
	for {
		select {
		case <-x.stopc:
			return
		case <-tk.C:
		}
		for carry += float64(x.o.rate) / 100; carry >= 1; carry-- {
			n++
			p.SendAsync(producer.Event{EventID: fmt.Sprintf("e%d-%d", time.Now().UnixNano(), n), CustomerID: fmt.Sprintf("c%d", n%50),
				Meter: "api_calls", Quantity: 1, EventTime: time.Now()}, func(error) {})
		}
	}
}

func (x *experiment) close() {
	x.closed.Do(func() {
		close(x.stopc)
		for _, st := range x.stages {
			if st.cmd.Process != nil {
				_ = st.cmd.Process.Signal(os.Interrupt)
			}
		}
		done := make(chan struct{})
		go func() {
			for _, st := range x.stages {
				_ = st.cmd.Wait()
			}
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(45 * time.Second):
			for _, st := range x.stages {
				_ = st.cmd.Process.Kill()
			}
		}
		x.wg.Wait()
		x.cl.Close()
		log.Printf("logs in %s", x.o.out)
	})
}

// kafkaSh runs deploy/local/kafka.sh on the cluster.
func (x *experiment) kafkaSh(args ...string) error {
	cmd := exec.Command("bash", append([]string{"deploy/local/kafka.sh"}, args...)...)
	cmd.Env = append(os.Environ(), "KAFKA_CLUSTER=3", "KAFKA_PORT="+strconv.Itoa(x.o.kafkaPort), "KAFKA_DATA_DIR="+x.o.clusterDir,
		"KAFKA_START_TIMEOUT=300", "KAFKA_SECURITY="+map[bool]string{true: "sasl_ssl", false: "plaintext"}[x.kcfg.SASL.Mechanism != ""])
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("kafka.sh %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// target returns the broker a target names, now.
func (x *experiment) target(name string) (int32, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	adm := kadm.NewClient(x.cl)
	var resp kadm.FindCoordinatorResponses
	switch name {
	case "txn":
		resp = adm.FindTxnCoordinators(ctx, x.group("dedup")+"-i1")
	case "group":
		resp = adm.FindGroupCoordinators(ctx, x.group("aggregate"))
	case "seed":
		return 1, nil // the first of --brokers: node 1 listens on -kafka-port
	case "leader":
		md, err := adm.Metadata(ctx)
		if err != nil {
			return 0, err
		}
		count := map[int32]int{}
		for _, t := range md.Topics {
			if strings.HasPrefix(t.Topic, x.prefix) {
				for _, p := range t.Partitions {
					count[p.Leader]++
				}
			}
		}
		best := int32(-1)
		for b, n := range count {
			if best < 0 || n > count[best] || (n == count[best] && b < best) {
				best = b
			}
		}
		return best, nil
	default:
		return 0, fmt.Errorf("target %q: txn, group, leader or seed", name)
	}
	for _, r := range resp {
		if r.Err != nil {
			return 0, r.Err
		}
		return r.NodeID, nil
	}
	return 0, fmt.Errorf("no coordinator for %s", name)
}
