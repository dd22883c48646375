// Command brokerfault measures how the stages ride out the loss of one
// broker of a three-broker cluster (docs/operations.md, "One broker paused
// or killed"): it runs dedup, the aggregator and (with -clickhouse) the
// sink as processes of the meterline binary under a steady load, then, one
// target at a time, pauses (SIGSTOP) or kills (kill -9) the broker that is
// the transaction coordinator of dedup, the group coordinator of the
// aggregator, and the leader of the most partitions, for -down, and brings
// it back. Per stage and fault it prints the longest time without a
// committed transaction after the fault (the stall), when that ended, how
// much of it /readyz answered 200, and the warnings its log wrote.
//
//	KAFKA_CLUSTER=3 KAFKA_PORT=26092 KAFKA_SECURITY=sasl_ssl deploy/local/kafka.sh start
//	go build -o /tmp/meterline ./cmd/meterline
//	go run ./scripts/brokerfault -kafka-port 26092 -bin /tmp/meterline -clickhouse 127.0.0.1:26000 -fault pause
//
// A cluster started with KAFKA_SECURITY=sasl_ssl is used over SASL_SSL as
// its admin user (the credentials kafka.sh made); a plaintext one in the
// clear. It only talks to the cluster and ClickHouse given, on 127.0.0.1.
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
	"time"
)

type options struct {
	kafkaPort  int
	clusterDir string
	bin        string
	clickhouse string
	fault      string
	down       time.Duration
	targets    string
	rate       int
	out        string
	recoverMax time.Duration
	metricBase int
	debug      map[string]bool
}

func main() {
	var o options
	flag.IntVar(&o.kafkaPort, "kafka-port", 26092, "KAFKA_PORT of the cluster (brokers on it and the next two ports)")
	flag.StringVar(&o.clusterDir, "cluster-dir", "", "KAFKA_DATA_DIR of the cluster (default /tmp/meterline-kafka-cluster-<port>)")
	flag.StringVar(&o.bin, "bin", "meterline", "the meterline binary")
	flag.StringVar(&o.clickhouse, "clickhouse", "", "ClickHouse native address; empty: no sink")
	flag.StringVar(&o.fault, "fault", "pause", "pause (SIGSTOP, then SIGCONT) or kill (kill -9, then start)")
	flag.DurationVar(&o.down, "down", time.Minute, "how long the broker stays paused or dead")
	flag.StringVar(&o.targets, "targets", "txn,group,leader", "the brokers to hit, in order: txn (dedup's transaction coordinator), group (the aggregator's group coordinator), leader (the most partitions), seed (the first of the stages' --brokers)")
	flag.IntVar(&o.rate, "rate", 100, "events per second")
	flag.StringVar(&o.out, "out", "", "directory for the stages' logs (default: a new temporary one)")
	flag.DurationVar(&o.recoverMax, "recover-max", 4*time.Minute, "how long after the broker is back to wait for every stage")
	flag.IntVar(&o.metricBase, "metrics-port", 26400, "first of three ports for the stages' /metrics and /readyz")
	debug := flag.String("debug", "", "stages to run at log level debug (kgo's own lines too), comma-separated")
	flag.Parse()
	o.debug = map[string]bool{}
	for _, n := range strings.Split(*debug, ",") {
		o.debug[n] = true
	}
	if o.clusterDir == "" {
		o.clusterDir = fmt.Sprintf("/tmp/meterline-kafka-cluster-%d", o.kafkaPort)
	}
	if o.out == "" {
		d, err := os.MkdirTemp("", "brokerfault-")
		if err != nil {
			log.Fatal(err)
		}
		o.out = d
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		log.Fatal(err)
	}
	if o.fault != "pause" && o.fault != "kill" {
		log.Fatalf("-fault %s: pause or kill", o.fault)
	}
	var err error
	if o.bin, err = filepath.Abs(o.bin); err != nil {
		log.Fatal(err)
	}
	x, err := newExperiment(o)
	if err != nil {
		log.Fatal(err)
	}
	defer x.close()
	if err := x.run(strings.Split(o.targets, ",")); err != nil {
		x.close()
		log.Fatal(err) //nolint:gocritic // closed above
	}
}
