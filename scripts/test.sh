#!/usr/bin/env bash
# The body of `make test`: real Kafka + real ClickHouse, vet, the whole suite.
# PACKAGES narrows it to some packages (`make docs-check`: ./internal/docscheck).
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
TEST_TIMEOUT=${TEST_TIMEOUT:-40m}
PACKAGES=${PACKAGES:-./...}
ALONE_PACKAGES=${ALONE_PACKAGES-./internal/clustertest}
SIDE_PACKAGES=${SIDE_PACKAGES-./deploy ./entitlements ./internal/bench ./internal/cli ./internal/crashtest ./internal/demo ./internal/docscheck ./internal/standbytest ./internal/stream}
# The fast loop's tests (-short) of these packages run once more under the
# race detector, last (docs/testing.md, "The race detector"): the runtime,
# the sessions and the stages whose goroutines share the most memory.
RACE_TEST_PACKAGES=${RACE_TEST_PACKAGES-./internal/stream ./internal/session ./internal/kafka ./dedup ./ingest ./sink ./producer ./aggregator ./entitlements}
# Left out under the detector: ingest's bound on what a deep body
# allocates (the detector's sync.Pool drops items at random), and the
# aggregator's and entitlements' longest tests (models, property tests, crash loops,
# the single-goroutine abort differential; 9 s to several minutes each under the
# detector), which run without it.
RACE_SKIP=${RACE_SKIP-^(TestDeepDataCostsLittle|TestLargeDataCostsLittle|TestUncompressedHeaderBatches|TestAdjustmentOnlyLinesOnceAcrossCrashes|TestPropertyEntitlementsKFake|TestPropertyKFake|TestEntitlementsPeriodRollCrashAcrossManyPeriods|TestDecideRecordModel|TestDecompressionBombInInputs|TestKeptVersionsBoundedInBytes|TestEntitlementsSharedRejectedRestated|TestPartitionProcessArrivingDecidesAsBench|TestLedgerMatchesReference|TestRateCardBoundSameWhenLagging|TestVersionBoundSameWhenLagging|TestAbortDifferential)\$}
KAFKA_PORT=${KAFKA_PORT:-9092}
CLICKHOUSE_PORT=${CLICKHOUSE_PORT:-9000}
# The secured services (docs/operations.md, "Security and ACLs"), on ports of
# their own: a SASL_SSL broker with ACLs, and a ClickHouse whose user default
# needs a password, with native TLS and HTTPS.
KAFKA_SASL_PORT=${KAFKA_SASL_PORT:-$((KAFKA_PORT + 200))}
CLICKHOUSE_SECURE_PORT=${CLICKHOUSE_SECURE_PORT:-$((CLICKHOUSE_PORT + 400))}
CLICKHOUSE_SECURE_HTTP_PORT=${CLICKHOUSE_SECURE_HTTP_PORT:-$((CLICKHOUSE_PORT + 401))}
CLICKHOUSE_SECURE_TLS_PORT=${CLICKHOUSE_SECURE_TLS_PORT:-$((CLICKHOUSE_PORT + 440))}
CLICKHOUSE_SECURE_HTTPS_PORT=${CLICKHOUSE_SECURE_HTTPS_PORT:-$((CLICKHOUSE_PORT + 443))}
CLICKHOUSE_SECURE_PASSWORD_FILE=${CLICKHOUSE_SECURE_PASSWORD_FILE:-/tmp/meterline-clickhouse-$CLICKHOUSE_SECURE_PORT.password}
# The cluster of three brokers (docs/operations.md, Replication; internal/clustertest): node n on
# KAFKA_CLUSTER_PORT+n-1, its controller on KAFKA_CLUSTER_PORT+100+n-1.
KAFKA_CLUSTER_PORT=${KAFKA_CLUSTER_PORT:-$((KAFKA_PORT + 300))}
# Only internal/clustertest uses the cluster: its three JVMs are started
# when PACKAGES includes it (not for `make docs-check`).
if $GO list $PACKAGES | grep -x 'github.com/meterline/meterline/internal/clustertest' >/dev/null; then
  WITH_CLUSTER=1
else
  WITH_CLUSTER=
fi
log=$(mktemp -t meterline-test.XXXXXX.log)

stop_services() {
  if [ -z "${KEEP_SERVICES:-}" ]; then
    deploy/local/kafka.sh stop || true
    KAFKA_PORT=$KAFKA_SASL_PORT deploy/local/kafka.sh stop || true
    [ -z "$WITH_CLUSTER" ] || KAFKA_CLUSTER=3 KAFKA_PORT=$KAFKA_CLUSTER_PORT deploy/local/kafka.sh stop || true
    deploy/local/clickhouse.sh stop || true
    CLICKHOUSE_PORT=$CLICKHOUSE_SECURE_PORT CLICKHOUSE_HTTP_PORT=$CLICKHOUSE_SECURE_HTTP_PORT deploy/local/clickhouse.sh stop || true
  fi
  rm -rf "${build_dir:-}"
}
trap stop_services EXIT

start=$(date +%s)
# go vet, the compilation of every test package (linked and run by nothing:
# -exec true) and the meterline binary that the tests start
# (METERLINE_TEST_BIN) run beside the services' start, on the CPU the JVMs
# leave while they wait. `go test -p 1` below then only links each package.
build_dir=$(mktemp -d -t meterline-test-build.XXXXXX)
(
  echo "== go vet $PACKAGES" &&
    $GO vet $PACKAGES &&
    $GO build -o "$build_dir/meterline" ./cmd/meterline &&
    $GO test -vet=off -count=1 -run '^$' -exec true $PACKAGES >/dev/null
) >"$build_dir/build.log" 2>&1 &
build=$!
# The two brokers start side by side (a JVM start is mostly waiting), each
# on a new data dir unless it runs already (start-fresh): the topics of
# earlier runs would only slow its start.
deploy/local/kafka.sh start-fresh &
plain_kafka=$!
(
  KAFKA_PORT=$KAFKA_SASL_PORT KAFKA_SECURITY=sasl_ssl deploy/local/kafka.sh start-fresh
) &
sasl_kafka=$!
# The cluster's three JVMs start beside them; they run idle until
# internal/clustertest's turn (about 4% of a core each).
cluster_kafka=
if [ -n "$WITH_CLUSTER" ]; then
  (
    KAFKA_CLUSTER=3 KAFKA_PORT=$KAFKA_CLUSTER_PORT deploy/local/kafka.sh start-fresh
  ) &
  cluster_kafka=$!
fi
# Both ClickHouse servers on new data dirs too: the databases and system
# logs of earlier runs made a start outlast its timeout.
deploy/local/clickhouse.sh start-fresh
if [ ! -s "$CLICKHOUSE_SECURE_PASSWORD_FILE" ]; then
  (umask 077 && openssl rand -hex 16 >"$CLICKHOUSE_SECURE_PASSWORD_FILE")
fi
CLICKHOUSE_PORT=$CLICKHOUSE_SECURE_PORT CLICKHOUSE_HTTP_PORT=$CLICKHOUSE_SECURE_HTTP_PORT CLICKHOUSE_TLS_PORT=$CLICKHOUSE_SECURE_TLS_PORT CLICKHOUSE_HTTPS_PORT=$CLICKHOUSE_SECURE_HTTPS_PORT CLICKHOUSE_PASSWORD_FILE=$CLICKHOUSE_SECURE_PASSWORD_FILE deploy/local/clickhouse.sh start-fresh
wait "$plain_kafka"
wait "$sasl_kafka"
[ -z "$cluster_kafka" ] || wait "$cluster_kafka"
echo "== services up after $(( $(date +%s) - start ))s"
METERLINE_TEST_KAFKA_SASL_DIR=$(
  KAFKA_PORT=$KAFKA_SASL_PORT deploy/local/kafka.sh credentials
)
# The dashboard and alert tests run their own Prometheus; this only installs
# Debian's (promtool, which the alert tests use, comes with it).
METERLINE_TEST_PROMETHEUS=$(deploy/local/prometheus.sh install)
# The status page tests load the page in headless Chromium (Debian's).
METERLINE_TEST_CHROMIUM=$(deploy/local/chromium.sh)
# The ClickHouse migrations and documented queries also run on a current
# ClickHouse (26.x), embedded by chdb in a cached virtualenv.
METERLINE_TEST_CHDB=$(scripts/chdb-venv.sh)

build_status=0
wait "$build" || build_status=$?
cat "$build_dir/build.log"
if [ "$build_status" != 0 ]; then
  echo "FAIL: go vet or the build failed" >&2
  exit "$build_status"
fi
echo "== vet and build done after $(( $(date +%s) - start ))s"
export METERLINE_TEST_BIN=$build_dir/meterline

echo "== go test $PACKAGES (real Kafka on 127.0.0.1:$KAFKA_PORT, SASL_SSL on $KAFKA_SASL_PORT${WITH_CLUSTER:+, a cluster of three on $KAFKA_CLUSTER_PORT-$((KAFKA_CLUSTER_PORT + 2))}; real ClickHouse on 127.0.0.1:$CLICKHOUSE_PORT, password and TLS on $CLICKHOUSE_SECURE_TLS_PORT)"
export METERLINE_TEST_KAFKA=127.0.0.1:$KAFKA_PORT
# Tests that check what the broker logged read its server.log, in the data
# dir that kafka.sh reports for the plain broker (absolute).
kafka_data=$(deploy/local/kafka.sh status | sed -n 's/.* data=//p') ||
  { echo "test.sh: the broker on port $KAFKA_PORT is not running" >&2; exit 1; }
export METERLINE_TEST_KAFKA_LOG=$kafka_data/server.log
export METERLINE_TEST_CLICKHOUSE=127.0.0.1:$CLICKHOUSE_PORT
export METERLINE_TEST_PROMETHEUS
export METERLINE_TEST_CHROMIUM
export METERLINE_TEST_CHDB
export METERLINE_TEST_KAFKA_SASL=127.0.0.1:$KAFKA_SASL_PORT
if [ -n "$WITH_CLUSTER" ]; then
  METERLINE_TEST_KAFKA_CLUSTER=$(KAFKA_CLUSTER=3 KAFKA_PORT=$KAFKA_CLUSTER_PORT deploy/local/kafka.sh brokers)
  export METERLINE_TEST_KAFKA_CLUSTER
fi
export METERLINE_TEST_KAFKA_SASL_DIR
export METERLINE_TEST_CLICKHOUSE_SECURE=127.0.0.1:$CLICKHOUSE_SECURE_TLS_PORT
export METERLINE_TEST_CLICKHOUSE_SECURE_DIR=/tmp/meterline-clickhouse-$CLICKHOUSE_SECURE_PORT/security
export METERLINE_TEST_CLICKHOUSE_SECURE_PASSWORD_FILE=$CLICKHOUSE_SECURE_PASSWORD_FILE
# The packages run in two `go test -p 1`, one package at a time each: those
# of SIDE_PACKAGES in the second, beside the others. Packages share the
# services (every test names its own topics, groups and databases), and a
# one-lane run kept the two cores about half busy: most tests wait for the
# broker, a rule's window or a timeout. The second lane's output follows
# the first's. SIDE_PACKAGES= runs every package in one lane.
# The packages of ALONE_PACKAGES run after both lanes, with no other lane
# beside them (only the race detector's run at nice 19, if it is still
# going): the cluster tests time sessions against a paused broker, and
# beside another lane a session outlasted its bound (docs/testing.md).
side_all=
[ -z "$SIDE_PACKAGES" ] || side_all=$($GO list $SIDE_PACKAGES | sort)
alone_all=
[ -z "$ALONE_PACKAGES" ] || alone_all=$($GO list $ALONE_PACKAGES | sort)
listed=$($GO list $PACKAGES | sort)
alone=$(comm -12 <(echo "$listed") <(echo "$alone_all"))
listed=$(comm -23 <(echo "$listed") <(echo "$alone_all"))
side=$(comm -12 <(echo "$listed") <(echo "$side_all"))
rest=$(comm -23 <(echo "$listed") <(echo "$side_all"))
side_log=$build_dir/side.log
# Under the race detector, with -short, beside both lanes at the lowest CPU
# priority (nice 19): the lanes keep the two cores about half busy, most of
# their tests waiting for the broker, a rule's window or a timeout, and the
# detector's run, CPU-bound and on kfake, takes what they leave (a task at
# nice 19 gets about 1.5 % of a core that a task at nice 0 wants). Its log
# is kept apart, since -short skips every integration test (which the
# check below would count as skipped) and the detector's failures are told
# on their own, after the lanes' and the alone packages' results.
race_all=
[ -z "$RACE_TEST_PACKAGES" ] || race_all=$($GO list $RACE_TEST_PACKAGES | sort)
race=$(comm -12 <($GO list $PACKAGES | sort) <(echo "$race_all"))
race_log=$build_dir/race.log
: >"$race_log"
set +e
if [ -n "$race" ]; then
  race_start=$(date +%s)
  (
    nice -n 19 $GO test -race -short -p 1 -count=1 -timeout "$TEST_TIMEOUT" -skip "$RACE_SKIP" -v $race >"$race_log" 2>&1
    echo $? >"$build_dir/race.status"
    echo $(( $(date +%s) - race_start )) >"$build_dir/race.seconds"
  ) &
  race_pid=$!
fi
if [ -n "$side" ]; then
  $GO test -p 1 -count=1 -timeout "$TEST_TIMEOUT" -v $side >"$side_log" 2>&1 &
  side_pid=$!
fi
status=0
if [ -n "$rest" ]; then
  $GO test -p 1 -count=1 -timeout "$TEST_TIMEOUT" -v $rest 2>&1 | tee "$log"
  status=${PIPESTATUS[0]}
fi
if [ -n "$side" ]; then
  wait "$side_pid"
  side_status=$?
  echo "== go test $(echo $side) (beside the packages above)"
  cat "$side_log" | tee -a "$log"
  [ "$side_status" = 0 ] || status=$side_status
fi
if [ -n "$alone" ]; then
  echo "== go test $(echo $alone) (alone)"
  $GO test -p 1 -count=1 -timeout "$TEST_TIMEOUT" -v $alone 2>&1 | tee -a "$log"
  alone_status=${PIPESTATUS[0]}
  [ "$alone_status" = 0 ] || status=$alone_status
fi
if [ -n "$race" ]; then
  echo "== go test -race -short $(echo $race) (beside the lanes, nice 19)"
  wait "$race_pid"
  race_status=$(cat "$build_dir/race.status" 2>/dev/null || echo 1)
  grep -E '^(ok|FAIL|panic:)|^\s*--- FAIL|WARNING: DATA RACE' "$race_log"
  echo "== race detector: $(grep -c -E '^\s*--- PASS' "$race_log") passed, $(grep -c -E '^\s*--- FAIL' "$race_log") failed in $(cat "$build_dir/race.seconds" 2>/dev/null)s"
  [ "$race_status" = 0 ] || status=$race_status
fi
set -e

echo
echo "== integration tests (real Kafka / ClickHouse)"
grep -E '^\s*--- (PASS|FAIL|SKIP): Test(Real|.*Integration|TopicsCreateAndCheck|ProduceBadLines/real|ClickHouse)' "$log" | sed 's/^\s*//' || true
if grep -q 'SKIP: real' "$log"; then
  echo "FAIL: an integration test skipped although the services are up:"
  grep -B1 'SKIP: real' "$log" | head -20
  status=1
fi
echo "== make test took $(( $(date +%s) - start ))s"
echo "summary: $(grep -c -E '^\s*--- PASS' "$log") passed, $(grep -c -E '^\s*--- FAIL' "$log") failed, $(grep -c -E '^\s*--- SKIP' "$log") skipped"
if grep -q -E '^\s*--- FAIL|^panic: ' "$log"; then
  # Last, so that the reasons are in the tail of a long run's output.
  echo "== what the failed tests said"
  MAX_LINES=40 scripts/test-failures.sh "$log" || true
fi
if grep -q -E '^\s*--- FAIL|^panic: |WARNING: DATA RACE' "$race_log"; then
  echo "== what the failed tests said under the race detector"
  MAX_LINES=60 scripts/test-failures.sh "$race_log" || true
  # The detector's reports: the two accesses and where the goroutines began.
  grep -m 3 -A 60 'WARNING: DATA RACE' "$race_log" || true
fi
rm -f "$log"
exit "$status"
