#!/usr/bin/env bash
# deploy/local/kafka.sh — run a real, throwaway Apache Kafka 4.x broker for local
# development and integration tests: one JVM in KRaft combined mode
# (process.roles=broker,controller) bound to 127.0.0.1. No Docker needed: the jars
# come from Maven Central via `mvn` once and are cached for later runs.
#
# Usage: deploy/local/kafka.sh start|start-fresh|stop|restart|status|clean|libs
#   start    fetch jars (first run only), format the data dir if new, start the
#            broker in the background and wait until it serves; no-op if running,
#            refused if paused (SIGSTOP: it serves nothing; resume it instead)
#   start-fresh  start, on a new data dir unless the broker is running: what
#            `make test` does, so that the topics earlier runs left behind
#            (hundreds, whose loading can outlast the start timeout) are gone
#   stop     SIGTERM, wait up to KAFKA_STOP_TIMEOUT s, then SIGKILL; no-op if stopped
#   restart  stop + start
#   status   print running/stopped; exit 0 if running, 3 if not
#   clean    stop and delete the data dir
#   libs     print the cached classpath dir (fetching jars if needed), e.g. for
#            java -cp "$(deploy/local/kafka.sh libs)/*" org.apache.kafka.tools.TopicCommand ...
#   credentials  with KAFKA_SECURITY=sasl_ssl: print the directory of the CA,
#            client certificate and passwords
#
# Environment:
#   KAFKA_PORT             client listener port                 (default 9092)
#   KAFKA_CONTROLLER_PORT  KRaft controller port                (default KAFKA_PORT+1, i.e. 9093)
#   KAFKA_DATA_DIR         data dir: logs, pid, config, server.log
#                                                               (default /tmp/meterline-kafka-$KAFKA_PORT)
#   METERLINE_CACHE_DIR    jar cache root                       (default $HOME/.cache/meterline)
#   KAFKA_HEAP_OPTS        JVM heap flags                       (default -Xms256m -Xmx512m)
#   KAFKA_START_TIMEOUT    seconds to wait for readiness        (default 90)
#   KAFKA_STOP_TIMEOUT     seconds to wait after SIGTERM        (default 30)
#   KAFKA_SECURITY         plaintext, or sasl_ssl               (default plaintext)
#   KAFKA_SASL_USERS       with sasl_ssl: SASL users to create besides admin
#                                       (default "meterline producer ingest dedup aggregate sink operator billing keyadmin")
#
# KAFKA_SECURITY=sasl_ssl starts a broker whose only client listener is SASL_SSL
# on KAFKA_PORT (SCRAM-SHA-512 and PLAIN; a client certificate is required) with
# ACLs on (StandardAuthorizer, super user admin). When it formats a new data dir
# it makes a CA and certificates (openssl) and a random password per user, and
# creates the SCRAM users (kafka-storage format --add-scram, read from a file
# of the data dir: no password is ever on a command line). On every start,
# once the broker serves, kafka/SecuritySetup.java (one JVM, as admin) sets the
# SCRAM password of every user of KAFKA_SASL_USERS to its file's, creating the
# users the storage lacks (a data dir formatted with fewer; a user added to a
# running broker gets PLAIN at its next start) and setting back a password
# changed on the broker by hand (write a new one to its file instead), and the
# ACLs of kafka/acls (docs/operations.md's) it lacks, and deletes any other ACL
# of the principals kafka/acls names (removed from the file, or granted by
# hand; each is logged); other principals' ACLs are left alone. Everything
# a client needs is in $KAFKA_DATA_DIR/security: ca.pem, client.pem,
# client-key.pem and passwords/<user> (one password per file, no newline).
# `credentials` prints that directory. A data dir keeps the mode it was
# formatted with: `clean` first to switch. Example:
#   KAFKA_PORT=9292 KAFKA_SECURITY=sasl_ssl deploy/local/kafka.sh start
#
# Progress goes to stderr; `status` and `libs` print their answer on stdout.
set -euo pipefail

PROG=kafka.sh
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CONF_DIR="$SCRIPT_DIR/kafka"
POM="$CONF_DIR/pom.xml"
TEMPLATE="$CONF_DIR/server.properties.template"
SASL_SSL_TEMPLATE="$CONF_DIR/sasl_ssl.properties.template"
CLUSTER_TEMPLATE="$CONF_DIR/cluster.properties.template"
SECURITY_SETUP="$CONF_DIR/SecuritySetup.java"
ACLS="$CONF_DIR/acls"
# shellcheck source=deploy/local/lib.sh
. "$SCRIPT_DIR/lib.sh"
LOG4J_CONF="$CONF_DIR/log4j2.properties"

# SELF is this script with the settings that chose its broker or cluster, for
# the commands a message tells to run: a bare "kafka.sh clean" would act on
# the default port's broker, not on this one.
SELF=$(printf '%q' "$0")
[[ -n ${KAFKA_DATA_DIR:-} ]] && SELF="KAFKA_DATA_DIR=$(printf '%q' "$KAFKA_DATA_DIR") $SELF"
[[ -n ${KAFKA_PORT:-} ]] && SELF="KAFKA_PORT=$(printf '%q' "$KAFKA_PORT") $SELF"
[[ ${KAFKA_CLUSTER:-1} != 1 ]] && SELF="KAFKA_CLUSTER=$(printf '%q' "$KAFKA_CLUSTER") $SELF"

KAFKA_PORT=${KAFKA_PORT:-9092}
[[ $KAFKA_PORT =~ ^[0-9]+$ ]] || { echo "kafka.sh: KAFKA_PORT must be a number, got '$KAFKA_PORT'" >&2; exit 1; }
if [[ ${KAFKA_CLUSTER:-1} == 1 ]]; then
  KAFKA_CONTROLLER_PORT=${KAFKA_CONTROLLER_PORT:-$((KAFKA_PORT + 1))}
  KAFKA_DATA_DIR=${KAFKA_DATA_DIR:-/tmp/meterline-kafka-$KAFKA_PORT}
  KAFKA_HEAP_OPTS=${KAFKA_HEAP_OPTS:--Xms256m -Xmx512m}
else
  KAFKA_CONTROLLER_PORT=${KAFKA_CONTROLLER_PORT:-$((KAFKA_PORT + 100))}
  KAFKA_DATA_DIR=${KAFKA_DATA_DIR:-/tmp/meterline-kafka-cluster-$KAFKA_PORT}
  KAFKA_HEAP_OPTS=${KAFKA_HEAP_OPTS:--Xms128m -Xmx384m}
fi
[[ $KAFKA_DATA_DIR == /* ]] || KAFKA_DATA_DIR="$PWD/$KAFKA_DATA_DIR"   # pid checks match on the path
KAFKA_START_TIMEOUT=${KAFKA_START_TIMEOUT:-90}
KAFKA_STOP_TIMEOUT=${KAFKA_STOP_TIMEOUT:-30}
CACHE_ROOT=${METERLINE_CACHE_DIR:-${HOME:-/root}/.cache/meterline}
KAFKA_SECURITY=${KAFKA_SECURITY:-plaintext}
KAFKA_SASL_USERS=${KAFKA_SASL_USERS:-meterline producer ingest dedup aggregate sink operator billing keyadmin}

# Logged by kafka.server.KafkaRaftServer once broker + controller are fully up:
#   [KafkaRaftServer nodeId=1] Kafka Server started (kafka.server.KafkaRaftServer)
READY_LINE='Kafka Server started'

# The files of one node, in KAFKA_DATA_DIR (cluster mode: select_node sets it
# to the node's directory first).
node_paths() {
  PID_FILE="$KAFKA_DATA_DIR/kafka.pid"
  SERVER_LOG="$KAFKA_DATA_DIR/server.log"
  CONSOLE_LOG="$KAFKA_DATA_DIR/kafka.out"   # JVM stdout/stderr (crashes before log4j is up)
  PROPS="$KAFKA_DATA_DIR/server.properties"
  LAUNCH_OFFSET_FILE="$KAFKA_DATA_DIR/kafka.log-offset"   # server.log size at the last launch
  READY_FILE="$KAFKA_DATA_DIR/kafka.ready"               # pid of the broker that became ready
  LOG_DIRS="$KAFKA_DATA_DIR/kraft-data"
  OWNER_MARK="$KAFKA_DATA_DIR/.meterline-kafka"
  SECURITY_DIR="$KAFKA_DATA_DIR/security"
  MODE_FILE="$KAFKA_DATA_DIR/security.mode"   # the KAFKA_SECURITY the storage was formatted with
  if ((KAFKA_CLUSTER > 1)); then
    SECURITY_DIR="$CLUSTER_DIR/security"   # one CA and one set of users for every node
  fi
}
BROKER_MAIN=kafka.Kafka

# Cluster mode: KAFKA_CLUSTER nodes, node n (1-based) on KAFKA_PORT+n-1 with its
# controller on KAFKA_CONTROLLER_PORT+n-1 and its files in CLUSTER_DIR/node-n.
KAFKA_CLUSTER=${KAFKA_CLUSTER:-1}
[[ $KAFKA_CLUSTER =~ ^[1-9]$ ]] || { echo "kafka.sh: KAFKA_CLUSTER must be a node count from 1 to 9, got '$KAFKA_CLUSTER'" >&2; exit 1; }
if ((KAFKA_CLUSTER > 1)); then
  BASE_PORT=$KAFKA_PORT
  CONTROLLER_BASE_PORT=$KAFKA_CONTROLLER_PORT
  CLUSTER_DIR=$KAFKA_DATA_DIR
  CLUSTER_MARK="$CLUSTER_DIR/.meterline-kafka-cluster"
  CLUSTER_ID_FILE="$CLUSTER_DIR/cluster.id"
fi
node_paths

# select_node N — makes node N the one the per-node functions act on: its
# ports, its node id and its files.
select_node() {
  NODE_ID=$1
  KAFKA_PORT=$((BASE_PORT + NODE_ID - 1))
  KAFKA_CONTROLLER_PORT=$((CONTROLLER_BASE_PORT + NODE_ID - 1))
  KAFKA_DATA_DIR="$CLUSTER_DIR/node-$NODE_ID"
  node_paths
}

say() { printf 'kafka: %s\n' "$*" >&2; }
die() { printf '%s: %s\n' "$PROG" "$*" >&2; exit 1; }

now() { printf '%s' "${EPOCHREALTIME/,/.}"; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

validate_env() {
  local p
  for p in KAFKA_PORT KAFKA_CONTROLLER_PORT KAFKA_START_TIMEOUT KAFKA_STOP_TIMEOUT; do
    [[ ${!p} =~ ^[0-9]+$ ]] || die "$p must be a number, got '${!p}'"
  done
  [[ $KAFKA_PORT != "$KAFKA_CONTROLLER_PORT" ]] || die "KAFKA_PORT and KAFKA_CONTROLLER_PORT must differ"
  if ((KAFKA_CLUSTER > 1)); then
    local gap=$((KAFKA_PORT - KAFKA_CONTROLLER_PORT))
    ((gap >= KAFKA_CLUSTER || -gap >= KAFKA_CLUSTER)) ||
      die "the brokers' ports $KAFKA_PORT.. and the controllers' ports $KAFKA_CONTROLLER_PORT.. overlap ($KAFKA_CLUSTER nodes); set KAFKA_CONTROLLER_PORT"
  fi
  [[ -n $KAFKA_DATA_DIR && $KAFKA_DATA_DIR != / ]] || die "refusing KAFKA_DATA_DIR='$KAFKA_DATA_DIR'"
  [[ $KAFKA_SECURITY == plaintext || $KAFKA_SECURITY == sasl_ssl ]] ||
    die "KAFKA_SECURITY must be plaintext or sasl_ssl, got '$KAFKA_SECURITY'"
  local u
  for u in $KAFKA_SASL_USERS; do
    [[ $u =~ ^[A-Za-z0-9_-]+$ && $u != admin ]] || die "KAFKA_SASL_USERS: bad user name '$u' (letters, digits, _ and -; admin is always made)"
  done
}

kafka_version() {
  local v
  v=$(sed -n 's:.*<kafka.version>\([^<]*\)</kafka.version>.*:\1:p' "$POM" | head -n1)
  [[ -n $v ]] || die "cannot read <kafka.version> from $POM"
  printf '%s' "$v"
}

find_java() {
  if [[ -n ${JAVA_HOME:-} && -x $JAVA_HOME/bin/java ]]; then
    JAVA="$JAVA_HOME/bin/java"
  elif command -v java >/dev/null 2>&1; then
    JAVA=$(command -v java)
  else
    die "java not found: install a Java 17+ runtime, e.g. apt-get install -y openjdk-17-jre-headless"
  fi
  local major
  major=$("$JAVA" -XshowSettings:properties -version 2>&1 |
    sed -n 's/^ *java\.specification\.version = \([0-9.]*\).*/\1/p' | head -n1)
  major=${major#1.}; major=${major%%.*}
  if [[ -n $major && $major -lt 17 ]]; then
    die "java $major at $JAVA is too old: Kafka 4.x needs Java 17+, e.g. apt-get install -y openjdk-17-jre-headless"
  fi
}

# ---------------------------------------------------------------------------------
# Jars: $CACHE_ROOT/kafka-<version>/libs, filled once by Maven. The marker holds
# the pom's checksum, so editing the pom (e.g. a bump) refetches; a warm run never
# calls mvn.
# ---------------------------------------------------------------------------------
ensure_libs() {
  local version dir sum
  version=$(kafka_version)
  dir="$CACHE_ROOT/kafka-$version"
  LIBS="$dir/libs"
  sum=$(sha256sum "$POM" | cut -d' ' -f1)
  if [[ -f $dir/libs.complete && $(<"$dir/libs.complete") == "$sum" && -d $LIBS ]]; then
    return 0
  fi
  command -v mvn >/dev/null 2>&1 ||
    die "mvn not found (needed once to fetch the Kafka jars from Maven Central): apt-get install -y maven"
  mkdir -p "$dir"
  # Serialise concurrent first runs (e.g. two brokers on different ports).
  exec 8>"$dir/.fetch.lock"
  flock 8
  if [[ -f $dir/libs.complete && $(<"$dir/libs.complete") == "$sum" && -d $LIBS ]]; then
    exec 8>&-
    return 0
  fi
  say "fetching jars for Kafka $version with Maven (first run) ..."
  local t0 tmp mvnlog
  t0=$(now)
  tmp="$dir/libs.tmp.$$"
  mvnlog="$dir/mvn.log"
  rm -rf "$tmp"
  if ! mvn -B -q -ntp -f "$POM" dependency:copy-dependencies \
      -DincludeScope=runtime -DoutputDirectory="$tmp" </dev/null >"$mvnlog" 2>&1; then
    tail -n 40 "$mvnlog" >&2 || true
    rm -rf "$tmp"
    die "fetching Kafka jars with mvn failed (full output: $mvnlog)"
  fi
  [[ -f $tmp/kafka_2.13-$version.jar ]] || die "mvn did not produce kafka_2.13-$version.jar in $tmp"
  rm -rf "$LIBS" "$dir/libs.complete"
  mv "$tmp" "$LIBS"
  printf '%s\n' "$sum" >"$dir/libs.complete"
  exec 8>&-
  say "fetched $(find "$LIBS" -name '*.jar' | wc -l) jars into $LIBS in $(elapsed "$t0")s"
}

# ---------------------------------------------------------------------------------
# Process helpers
# ---------------------------------------------------------------------------------
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Prints the pid if the pid file names a live broker JVM for this data dir.
broker_pid() {
  [[ -f $PID_FILE ]] || return 1
  local pid
  pid=$(<"$PID_FILE")
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  # Guard against pid reuse: it must be our kafka.Kafka with our server.properties.
  local cmd
  cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
  [[ $cmd == *" $BROKER_MAIN $PROPS"* ]] || return 1
  printf '%s' "$pid"
}

# Shows what the last launch wrote: JVM stdout/stderr (e.g. a crash before log4j
# is up) and the last 80 lines of server.log since the launch.
print_log_tail() {
  if [[ -s $CONSOLE_LOG ]]; then
    printf -- '----- %s (this launch) -----\n' "$CONSOLE_LOG" >&2
    awk '/^===== .* start \(port/ { buf = ""; n = 0 } { buf = buf $0 "\n"; n++ } END { printf "%s", buf }' \
      "$CONSOLE_LOG" | tail -n 40 >&2 || true
  fi
  printf -- '----- last 80 lines of %s (this launch) -----\n' "$SERVER_LOG" >&2
  log_since "$(launch_offset)" | tail -n 80 >&2 || true
  printf -- '-----\n' >&2
}

# Waits until the broker at $1 is up: JVM alive, the client port accepts and
# server.log (from byte offset $2 on, i.e. this launch) has the readiness line.
wait_ready() {
  local pid=$1 offset=$2 t0=$3 deadline=$((SECONDS + KAFKA_START_TIMEOUT))
  # kill 0 would signal this script's whole process group, its caller's too.
  [[ $pid =~ ^[1-9][0-9]*$ && $offset =~ ^[0-9]+$ ]] || die "no broker to wait for (pid '$pid', log offset '$offset')"
  while ((SECONDS < deadline)); do
    if ! kill -0 "$pid" 2>/dev/null; then
      print_log_tail
      rm -f "$PID_FILE"
      die "broker exited during startup (see $SERVER_LOG)"
    fi
    if ready_since "$offset"; then
      printf '%s\n' "$pid" >"$READY_FILE"
      say "started on 127.0.0.1:$KAFKA_PORT (pid $pid, controller 127.0.0.1:$KAFKA_CONTROLLER_PORT, data $KAFKA_DATA_DIR) in $(elapsed "$t0")s"
      [[ $KAFKA_SECURITY == sasl_ssl ]] &&
        say "SASL_SSL with ACLs: users admin (super user) $KAFKA_SASL_USERS; CA, client certificate and passwords in $SECURITY_DIR"
      return 0
    fi
    sleep 0.2
  done
  print_log_tail
  say "not ready after ${KAFKA_START_TIMEOUT}s; killing pid $pid"
  kill -TERM "$pid" 2>/dev/null || true
  sleep 2
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$PID_FILE"
  die "broker not ready after ${KAFKA_START_TIMEOUT}s (log: $SERVER_LOG)"
}

launch_offset() {
  local o=0
  [[ -f $LAUNCH_OFFSET_FILE ]] && o=$(<"$LAUNCH_OFFSET_FILE")
  [[ $o =~ ^[0-9]+$ ]] || o=0
  printf '%s' "$o"
}

# The client port accepts and server.log has the ready line after byte offset $1.
# (grep without -q: an early exit would SIGPIPE tail and fail the pipe under pipefail.)
ready_since() {
  port_open "$KAFKA_PORT" && log_since "$1" | grep -F "$READY_LINE" >/dev/null
}

# Healthy = live JVM (checked by caller) + ready since the last launch: either this
# broker's pid was recorded as ready (server.log may have rolled since), or the
# ready line is in the log since the launch.
broker_ready() {
  local pid
  pid=$(broker_pid 2>/dev/null) || return 1
  if [[ -f $READY_FILE && $(<"$READY_FILE") == "$pid" ]] && port_open "$KAFKA_PORT"; then
    return 0
  fi
  ready_since "$(launch_offset)"
}

log_since() {
  local offset=$1 size=0
  [[ -f $SERVER_LOG ]] || return 0
  size=$(stat -c %s "$SERVER_LOG")
  if ((size < offset)); then offset=0; fi   # rolled over: read it all
  tail -c +"$((offset + 1))" "$SERVER_LOG"
}

# Same format as `kafka.tools.StorageTool random-uuid` (Uuid.randomUuid: 16 random
# bytes, base64url, no padding, never starting with '-'), without paying a JVM start.
new_cluster_id() {
  local id
  while :; do
    id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')
    [[ ${#id} -eq 22 && $id != -* && $id != AAAAAAAAAAAAAAAAAAAAA[AQ] ]] && break
  done
  printf '%s' "$id"
}

render_config() {
  local t
  t=$(<"$TEMPLATE")
  if [[ $KAFKA_SECURITY == sasl_ssl ]]; then
    local plain_users="" u
    for u in $KAFKA_SASL_USERS; do
      plain_users+="user_$u=\"$(<"$SECURITY_DIR/passwords/$u")\" "
    done
    t+=$'\n'$(<"$SASL_SSL_TEMPLATE")
    t=${t//@SECURITY_DIR@/"$SECURITY_DIR"}
    t=${t//@ADMIN_PASSWORD@/"$(<"$SECURITY_DIR/passwords/admin")"}
    t=${t//@PLAIN_USERS@/"user_admin=\"$(<"$SECURITY_DIR/passwords/admin")\" $plain_users"}
  fi
  if ((KAFKA_CLUSTER > 1)); then
    local voters="" n rf=$((KAFKA_CLUSTER < 3 ? KAFKA_CLUSTER : 3))
    for ((n = 1; n <= KAFKA_CLUSTER; n++)); do
      voters+="${voters:+,}$n@127.0.0.1:$((CONTROLLER_BASE_PORT + n - 1))"
    done
    t+=$'\n'$(<"$CLUSTER_TEMPLATE")
    t=${t//@NODE_ID@/"$NODE_ID"}
    t=${t//@QUORUM_VOTERS@/"$voters"}
    t=${t//@REPLICATION_FACTOR@/"$rf"}
    t=${t//@MIN_INSYNC@/"$((rf >= 3 ? 2 : 1))"}
  fi
  t=${t//@KAFKA_PORT@/"$KAFKA_PORT"}
  t=${t//@KAFKA_CONTROLLER_PORT@/"$KAFKA_CONTROLLER_PORT"}
  t=${t//@KAFKA_LOG_DIRS@/"$LOG_DIRS"}
  # It holds the users' passwords in sasl_ssl mode.
  (umask 077 && printf '%s\n' "$t" >"$PROPS.tmp")
  mv "$PROPS.tmp" "$PROPS"
}

# sasl_ssl: the CA and certificates (lib.sh make_certs), the broker's PEM
# keystore (key, then certificate chain) and a random password per user, made
# once per data dir.
ensure_credentials() {
  [[ $KAFKA_SECURITY == sasl_ssl ]] || return 0
  make_certs "$SECURITY_DIR"
  if [[ ! -f $SECURITY_DIR/broker-keystore.pem ]]; then
    (umask 077 && cat "$SECURITY_DIR/server-key.pem" "$SECURITY_DIR/server.pem" "$SECURITY_DIR/ca.pem" \
      >"$SECURITY_DIR/broker-keystore.pem")
  fi
  mkdir -p "$SECURITY_DIR/passwords"
  chmod 700 "$SECURITY_DIR/passwords"
  local u
  for u in admin $KAFKA_SASL_USERS; do
    [[ -s $SECURITY_DIR/passwords/$u ]] && continue
    (umask 077 && random_password | tr -d '\n' >"$SECURITY_DIR/passwords/$u")
  done
}

# write_scram_args FILE — the --add-scram arguments of kafka-storage format,
# one SCRAM-SHA-512 user per password file, into FILE (mode 0600), one
# argument a line: the storage tool reads them from @FILE (argparse4j's
# fromFilePrefix), so that no password is on its command line, which every
# user of the machine can read (ps, /proc/<pid>/cmdline).
write_scram_args() {
  local u out=""
  for u in admin $KAFKA_SASL_USERS; do
    out+=$'--add-scram\n'"SCRAM-SHA-512=[name=$u,password=$(<"$SECURITY_DIR/passwords/$u")]"$'\n'
  done
  (umask 077 && printf '%s' "$out" >"$1")
}

# Refuses to start a data dir formatted with another KAFKA_SECURITY: its SCRAM
# users (or their absence) are in the storage.
check_mode() {
  [[ -f $LOG_DIRS/meta.properties ]] || return 0
  local formatted=plaintext
  [[ -f $MODE_FILE ]] && formatted=$(<"$MODE_FILE")
  [[ $formatted == "$KAFKA_SECURITY" ]] ||
    die "$KAFKA_DATA_DIR was formatted with KAFKA_SECURITY=$formatted, not $KAFKA_SECURITY; run '$SELF clean' first (it deletes the data) or use another KAFKA_DATA_DIR"
}

# setup_security BOOTSTRAP — sasl_ssl, once the brokers serve: as admin, in
# one JVM (a single-file Java program, hence the jdk.compiler module), sets
# the SCRAM password of each user of KAFKA_SASL_USERS to its file's (creating
# the users the cluster lacks) and creates the ACLs of
# kafka/acls it lacks, deletes (and names) every other ACL of the principals
# kafka/acls names, and waits until the broker lists exactly that.
# Idempotent: every start runs it.
setup_security() {
  [[ $KAFKA_SECURITY == sasl_ssl ]] || return 0
  ensure_libs
  ensure_credentials   # a user new to a broker that was already running
  "$JAVA" --list-modules 2>/dev/null | grep -q '^jdk\.compiler@' ||
    die "$JAVA has no jdk.compiler module, needed to run $SECURITY_SETUP (Debian's openjdk-17-jre-headless has it; elsewhere install a JDK 17+)"
  local t0 out log="$KAFKA_DATA_DIR/security-setup.log"
  t0=$(now)
  # shellcheck disable=SC2086 # one argument per user
  if ! out=$("$JAVA" -Xmx256m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -cp "$LIBS/*" "$SECURITY_SETUP" \
      "$1" "$SECURITY_DIR" "$ACLS" $KAFKA_SASL_USERS </dev/null 2>"$log"); then
    cat "$log" >&2
    die "setting the users and ACLs as admin on $1 failed (log: $log); if admin's password was changed on the broker, write it to $SECURITY_DIR/passwords/admin"
  fi
  local last=${out##*$'\n'} line
  if [[ $out == *$'\n'* ]]; then
    while IFS= read -r line; do say "$line"; done <<<"${out%$'\n'*}"   # the ACLs removed
  fi
  say "$last, in $(elapsed "$t0")s"
}

# True if the data dir holds files but not our marker (someone else's directory).
foreign_data_dir() {
  [[ -d $KAFKA_DATA_DIR && ! -f $OWNER_MARK ]] || return 1
  [[ -n $(find "$KAFKA_DATA_DIR" -mindepth 1 -maxdepth 1 ! -name .lock -print -quit) ]]
}

lock_data_dir() {
  mkdir -p "$KAFKA_DATA_DIR"
  exec 9>"$KAFKA_DATA_DIR/.lock"
  flock 9
}

# ---------------------------------------------------------------------------------
# Subcommands
# ---------------------------------------------------------------------------------

# launch_node — for the current node (the only one, or the one select_node
# chose), with the caller holding the lock: if its broker runs, LAUNCHED is
# empty when it serves and its pid when it is still starting; otherwise it
# formats the storage if new, starts the JVM in the background and sets
# LAUNCHED to its pid. LAUNCH_OFFSET is where this launch's server.log starts,
# for wait_ready.
launch_node() {
  local pid
  LAUNCHED=""
  LAUNCH_OFFSET=0
  if pid=$(broker_pid); then
    # A paused JVM's port still takes connections: it is running, not serving.
    if is_paused "$pid"; then
      local resume="kill -CONT $pid"
      ((KAFKA_CLUSTER > 1)) && resume="$SELF resume-broker $NODE_ID"
      die "the broker on 127.0.0.1:$KAFKA_PORT (pid $pid) is paused (SIGSTOP) and serves nothing; resume it with '$resume'"
    fi
    if broker_ready; then
      say "already running on 127.0.0.1:$KAFKA_PORT (pid $pid)"
      return 0
    fi
    say "pid $pid is running but not serving yet; waiting ..."
    LAUNCHED=$pid
    LAUNCH_OFFSET=$(launch_offset)
    return 0
  fi
  if port_open "$KAFKA_PORT"; then
    die "127.0.0.1:$KAFKA_PORT is already in use by another process (not a broker of $KAFKA_DATA_DIR); set KAFKA_PORT"
  fi
  if port_open "$KAFKA_CONTROLLER_PORT"; then
    die "127.0.0.1:$KAFKA_CONTROLLER_PORT (controller) is already in use; set KAFKA_CONTROLLER_PORT"
  fi

  if foreign_data_dir; then
    die "$KAFKA_DATA_DIR exists and was not created by $PROG; pick another KAFKA_DATA_DIR"
  fi
  check_mode
  ensure_libs
  mkdir -p "$KAFKA_DATA_DIR"
  touch "$OWNER_MARK"
  rm -f "$PID_FILE"
  ensure_credentials
  render_config

  local cp="$LIBS/*"
  local -a heap
  read -r -a heap <<<"$KAFKA_HEAP_OPTS"
  local -a jvm=(
    "${heap[@]}"
    -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35
    -XX:+ExplicitGCInvokesConcurrent
    -Djava.awt.headless=true
    -Dlog4j2.configurationFile="$LOG4J_CONF"
    -Dkafka.logs.dir="$KAFKA_DATA_DIR"
  )

  if [[ ! -f $LOG_DIRS/meta.properties ]]; then
    say "formatting new KRaft storage in $LOG_DIRS ..."
    local cluster_id fmtlog="$KAFKA_DATA_DIR/format.log"
    rm -rf "$LOG_DIRS"
    : >"$fmtlog"
    if ((KAFKA_CLUSTER > 1)); then
      cluster_id=$(<"$CLUSTER_ID_FILE")   # every node of the cluster shares it
    else
      cluster_id=$(new_cluster_id)
    fi
    local -a scram=()
    local scram_file="$KAFKA_DATA_DIR/format-scram.args"
    if [[ $KAFKA_SECURITY == sasl_ssl ]]; then
      write_scram_args "$scram_file"
      scram=("@$scram_file")
    fi
    if ! "$JAVA" "${jvm[@]}" -cp "$cp" kafka.tools.StorageTool format \
        -t "$cluster_id" -c "$PROPS" "${scram[@]}" </dev/null >>"$fmtlog" 2>&1; then
      rm -f "$scram_file"
      cat "$fmtlog" >&2
      die "formatting $LOG_DIRS failed"
    fi
    rm -f "$scram_file"
    printf '%s\n' "$KAFKA_SECURITY" >"$MODE_FILE"
  fi

  local offset=0
  [[ -f $SERVER_LOG ]] && offset=$(stat -c %s "$SERVER_LOG")
  printf '%s\n' "$offset" >"$LAUNCH_OFFSET_FILE"
  printf '\n===== %s start (port %s) =====\n' "$(date -u +%FT%TZ)" "$KAFKA_PORT" >>"$CONSOLE_LOG"

  say "starting broker on 127.0.0.1:$KAFKA_PORT ..."
  # setsid+nohup: own session, survives the calling shell and its SIGHUP. The inner
  # shell records its own pid and execs the JVM, so the pid file is the JVM's pid.
  # Close fds 8/9 (our flocks) so the broker does not hold them.
  # shellcheck disable=SC2016 # $$/$1/$@ are for the inner shell
  setsid nohup bash -c 'echo $$ >"$1"; shift; exec "$@"' kafka-launch "$PID_FILE" \
    "$JAVA" "${jvm[@]}" -cp "$cp" "$BROKER_MAIN" "$PROPS" \
    </dev/null >>"$CONSOLE_LOG" 2>&1 8>&- 9>&- &
  local i
  for ((i = 0; i < 50; i++)); do
    [[ -s $PID_FILE ]] && break
    sleep 0.1
  done
  pid=$(<"$PID_FILE") || die "broker did not record its pid in $PID_FILE"
  LAUNCHED=$pid
  LAUNCH_OFFSET=$offset
}

cmd_start() {
  local t0
  t0=$(now)
  find_java
  # Held until this script exits: a second concurrent `start` waits here, then sees
  # the running broker.
  lock_data_dir
  launch_node
  if [[ -n $LAUNCHED ]]; then
    wait_ready "$LAUNCHED" "$LAUNCH_OFFSET" "$t0"
  fi
  setup_security "127.0.0.1:$KAFKA_PORT"
}

# True if the process is stopped (SIGSTOP: state T in /proc/PID/stat).
is_paused() {
  local stat
  stat=$(<"/proc/$1/stat") 2>/dev/null || return 1
  stat=${stat##*) }
  [[ ${stat%% *} == T ]]
}

# stop_node — stops the current node's broker (the caller holds the lock):
# SIGTERM (after SIGCONT, in case it is paused), SIGKILL after
# KAFKA_STOP_TIMEOUT s.
stop_node() {
  local pid
  if ! pid=$(broker_pid); then
    rm -f "$PID_FILE"
    say "not running (127.0.0.1:$KAFKA_PORT)"
    return 0
  fi
  local t0 deadline
  t0=$(now)
  say "stopping pid $pid (127.0.0.1:$KAFKA_PORT) ..."
  kill -CONT "$pid" 2>/dev/null || true
  kill -TERM "$pid" 2>/dev/null || true
  deadline=$((SECONDS + KAFKA_STOP_TIMEOUT))
  while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do
    sleep 0.2
  done
  if kill -0 "$pid" 2>/dev/null; then
    say "pid $pid still alive after ${KAFKA_STOP_TIMEOUT}s; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  fi
  rm -f "$PID_FILE"
  say "stopped in $(elapsed "$t0")s"
}

cmd_stop() {
  [[ -d $KAFKA_DATA_DIR ]] || { say "not running (no $KAFKA_DATA_DIR)"; return 0; }
  lock_data_dir
  stop_node
}

# node_status — one line about the current node; exit 0 if its broker runs
# and serves, 3 if not.
node_status() {
  local pid prefix=""
  ((KAFKA_CLUSTER > 1)) && prefix="broker $NODE_ID: "
  if [[ -d $KAFKA_DATA_DIR ]] && pid=$(broker_pid); then
    if is_paused "$pid"; then
      echo "${prefix}paused pid=$pid port=127.0.0.1:$KAFKA_PORT controller=127.0.0.1:$KAFKA_CONTROLLER_PORT data=$KAFKA_DATA_DIR"
      return 3
    fi
    if broker_ready; then
      echo "${prefix}running pid=$pid port=127.0.0.1:$KAFKA_PORT controller=127.0.0.1:$KAFKA_CONTROLLER_PORT data=$KAFKA_DATA_DIR"
      return 0
    fi
    echo "${prefix}running pid=$pid port=127.0.0.1:$KAFKA_PORT (starting: not ready yet) data=$KAFKA_DATA_DIR"
    # Starting counts as running, as it always did for one broker.
    ((KAFKA_CLUSTER > 1)) && return 3
    return 0
  fi
  echo "${prefix}stopped port=127.0.0.1:$KAFKA_PORT data=$KAFKA_DATA_DIR"
  return 3
}

cmd_status() { node_status; }

cmd_clean() {
  cmd_stop
  exec 9>&- || true
  if [[ -d $KAFKA_DATA_DIR ]]; then
    if foreign_data_dir; then
      die "$KAFKA_DATA_DIR was not created by $PROG; not deleting it"
    fi
    rm -rf -- "$KAFKA_DATA_DIR"
    say "removed $KAFKA_DATA_DIR"
  fi
}

cmd_libs() {
  ensure_libs
  printf '%s\n' "$LIBS"
}

cmd_credentials() {
  [[ -f $SECURITY_DIR/ca.pem ]] || die "no credentials in $SECURITY_DIR (start with KAFKA_SECURITY=sasl_ssl first)"
  say "passwords/<user> hold the SCRAM passwords each start sets; to change one, write it to its file and run 'KAFKA_SECURITY=sasl_ssl $SELF start'"
  printf '%s\n' "$SECURITY_DIR"
}

# ---------------------------------------------------------------------------------
# Cluster mode (KAFKA_CLUSTER=N, N > 1)
# ---------------------------------------------------------------------------------

# One lock for the whole cluster (fd 9), held until the script exits.
lock_cluster() {
  mkdir -p "$CLUSTER_DIR"
  exec 9>"$CLUSTER_DIR/.lock"
  flock 9
}

# True if the cluster dir holds files but not our marker.
foreign_cluster_dir() {
  [[ -d $CLUSTER_DIR && ! -f $CLUSTER_MARK ]] || return 1
  [[ -n $(find "$CLUSTER_DIR" -mindepth 1 -maxdepth 1 ! -name .lock -print -quit) ]]
}

# The node argument of the *-broker commands: 1..KAFKA_CLUSTER.
node_arg() {
  [[ ${1:-} =~ ^[1-9]$ ]] && (($1 <= KAFKA_CLUSTER)) ||
    die "name a broker from 1 to $KAFKA_CLUSTER, got '${1:-}'"
  printf '%s' "$1"
}

bootstrap() {
  local n out=""
  for ((n = 1; n <= KAFKA_CLUSTER; n++)); do
    out+="${out:+,}127.0.0.1:$((BASE_PORT + n - 1))"
  done
  printf '%s' "$out"
}

# Starts every node that is not running, side by side (a combined node
# becomes ready only once a majority of the controller quorum runs), and
# waits until each serves.
cmd_cluster_start() {
  local t0 n
  t0=$(now)
  find_java
  lock_cluster
  foreign_cluster_dir && die "$CLUSTER_DIR exists and was not created by $PROG; pick another KAFKA_DATA_DIR"
  touch "$CLUSTER_MARK"
  ensure_libs
  [[ -s $CLUSTER_ID_FILE ]] || new_cluster_id >"$CLUSTER_ID_FILE"
  select_node 1
  ensure_credentials   # shared by the nodes: made once, before they start side by side
  # Each node is formatted and launched in a subshell of its own, all at once
  # (a JVM start is mostly waiting); each leaves "pid offset" in a file, with
  # "-" for the pid of a broker that already serves (nothing to wait for: an
  # empty field would shift the offset into the pid).
  local -a jobs=() pids=() offsets=()
  for ((n = 1; n <= KAFKA_CLUSTER; n++)); do
    rm -f "$CLUSTER_DIR/node-$n.launch"
    (
      select_node "$n"
      launch_node
      printf '%s %s\n' "${LAUNCHED:--}" "$LAUNCH_OFFSET" >"$CLUSTER_DIR/node-$n.launch"
    ) &
    jobs[n]=$!
  done
  local failed=0
  for ((n = 1; n <= KAFKA_CLUSTER; n++)); do
    wait "${jobs[n]}" || failed=1
  done
  ((failed == 0)) || die "starting the cluster failed (see above); '$SELF stop' stops the brokers that did start"
  for ((n = 1; n <= KAFKA_CLUSTER; n++)); do
    read -r pids[n] offsets[n] <"$CLUSTER_DIR/node-$n.launch" || true
    [[ ${pids[n]:-} == - ]] && pids[n]=""
    rm -f "$CLUSTER_DIR/node-$n.launch"
  done
  for ((n = 1; n <= KAFKA_CLUSTER; n++)); do
    select_node "$n"
    if [[ -n ${pids[n]:-} ]]; then
      wait_ready "${pids[n]}" "${offsets[n]}" "$t0"
    fi
  done
  setup_security "$(bootstrap)"
  say "cluster of $KAFKA_CLUSTER brokers ready on $(bootstrap) in $(elapsed "$t0")s"
}

# Stops every node at once: one by one, the last nodes would lose the
# controller quorum their controlled shutdown waits for.
cmd_cluster_stop() {
  [[ -d $CLUSTER_DIR ]] || { say "not running (no $CLUSTER_DIR)"; return 0; }
  lock_cluster
  local n pid t0 deadline
  local -a pids=()
  t0=$(now)
  for ((n = 1; n <= KAFKA_CLUSTER; n++)); do
    select_node "$n"
    if pid=$(broker_pid); then
      pids+=("$pid")
      kill -CONT "$pid" 2>/dev/null || true
      kill -TERM "$pid" 2>/dev/null || true
    fi
  done
  if ((${#pids[@]} == 0)); then
    say "not running ($(bootstrap))"
    return 0
  fi
  say "stopping ${#pids[@]} brokers (pids ${pids[*]}) ..."
  if ! wait_gone "$KAFKA_STOP_TIMEOUT" "${pids[@]}"; then
    say "still alive after ${KAFKA_STOP_TIMEOUT}s; sending SIGKILL"
    for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
    wait_gone 30 "${pids[@]}" || true
  fi
  for ((n = 1; n <= KAFKA_CLUSTER; n++)); do
    select_node "$n"
    rm -f "$PID_FILE"
  done
  say "stopped in $(elapsed "$t0")s"
}

# Prints one line per broker; exit 0 if every broker serves, 3 if not.
cmd_cluster_status() {
  local n rc=0
  for ((n = 1; n <= KAFKA_CLUSTER; n++)); do
    select_node "$n"
    node_status || rc=3
  done
  return "$rc"
}

cmd_cluster_clean() {
  cmd_cluster_stop
  exec 9>&- || true
  if [[ -d $CLUSTER_DIR ]]; then
    foreign_cluster_dir && die "$CLUSTER_DIR was not created by $PROG; not deleting it"
    rm -rf -- "$CLUSTER_DIR"
    say "removed $CLUSTER_DIR"
  fi
}

cmd_start_broker() {
  local t0 n
  n=$(node_arg "${1:-}")
  t0=$(now)
  find_java
  lock_cluster
  [[ -f $CLUSTER_MARK && -s $CLUSTER_ID_FILE ]] || die "no cluster in $CLUSTER_DIR: run '$SELF start' first"
  select_node "$n"
  launch_node
  if [[ -n $LAUNCHED ]]; then
    wait_ready "$LAUNCHED" "$LAUNCH_OFFSET" "$t0"
  fi
}

cmd_stop_broker() {
  local n
  n=$(node_arg "${1:-}")
  lock_cluster
  select_node "$n"
  stop_node
}

# signal_broker SIGNAL N VERB — sends SIGNAL to broker N's JVM.
signal_broker() {
  local sig=$1 n pid
  n=$(node_arg "${2:-}")
  select_node "$n"
  pid=$(broker_pid) || die "broker $n (127.0.0.1:$KAFKA_PORT) is not running"
  kill -"$sig" "$pid" || die "kill -$sig $pid failed"
  case $sig in
    KILL)
      wait_gone 30 "$pid" || die "pid $pid still alive 30s after SIGKILL"
      say "killed broker $n (pid $pid, 127.0.0.1:$KAFKA_PORT) with SIGKILL" ;;
    STOP)
      # The JVM's threads stop as each is scheduled: return once the
      # process is stopped, so that status says "paused" at once after.
      local tries
      for ((tries = 0; tries < 100; tries++)); do
        is_paused "$pid" && break
        sleep 0.05
      done
      is_paused "$pid" || die "pid $pid not stopped 5s after SIGSTOP"
      say "paused broker $n (pid $pid, 127.0.0.1:$KAFKA_PORT) with SIGSTOP" ;;
    CONT) say "resumed broker $n (pid $pid, 127.0.0.1:$KAFKA_PORT) with SIGCONT" ;;
  esac
}

usage() {
  cat >&2 <<USAGE
usage: $0 start|start-fresh|stop|restart|status|clean|libs|credentials
       KAFKA_CLUSTER=3 $0 start|start-fresh|stop|restart|status|clean|libs|credentials|brokers
       KAFKA_CLUSTER=3 $0 start-broker|stop-broker|kill-broker|pause-broker|resume-broker N
  (env: KAFKA_PORT, KAFKA_CONTROLLER_PORT, KAFKA_DATA_DIR, KAFKA_SECURITY, KAFKA_CLUSTER, METERLINE_CACHE_DIR)
USAGE
}

main() {
  validate_env
  if ((KAFKA_CLUSTER > 1)); then
    case "${1:-}" in
      start) cmd_cluster_start ;;
      start-fresh)
        cmd_cluster_status >/dev/null 2>&1 || { cmd_cluster_clean; exec 9>&- || true; }
        cmd_cluster_start ;;
      stop) cmd_cluster_stop ;;
      restart) cmd_cluster_stop; exec 9>&-; cmd_cluster_start ;;
      status) cmd_cluster_status ;;
      clean) cmd_cluster_clean ;;
      libs) cmd_libs ;;
      credentials) cmd_credentials ;;
      brokers) bootstrap; echo ;;
      start-broker) cmd_start_broker "${2:-}" ;;
      stop-broker) cmd_stop_broker "${2:-}" ;;
      kill-broker) signal_broker KILL "${2:-}" ;;
      pause-broker) signal_broker STOP "${2:-}" ;;
      resume-broker) signal_broker CONT "${2:-}" ;;
      -h | --help | help) usage ;;
      *) usage; exit 2 ;;
    esac
    return
  fi
  case "${1:-}" in
    start) cmd_start ;;
    start-fresh)
      cmd_status >/dev/null 2>&1 || { cmd_clean; exec 9>&- || true; }
      cmd_start ;;
    stop) cmd_stop ;;
    restart) cmd_stop; cmd_start ;;
    status) cmd_status ;;
    clean) cmd_clean ;;
    libs) cmd_libs ;;
    credentials) cmd_credentials ;;
    brokers) echo "127.0.0.1:$KAFKA_PORT" ;;
    start-broker | stop-broker | kill-broker | pause-broker | resume-broker)
      die "$1 needs cluster mode: KAFKA_CLUSTER=3 $0 $1 N" ;;
    -h | --help | help) usage ;;
    *) usage; exit 2 ;;
  esac
}

main "$@"
