#!/usr/bin/env bash
# deploy/local/prometheus.sh — Debian's Prometheus for Meterline's tests and laptops (no systemd).
#
#   deploy/local/prometheus.sh install|start|stop|status|clean
#
#   install  installs Debian's `prometheus` with apt-get when it is missing
#            (idempotent), stops any instance the package's service started,
#            and prints the binary's path on stdout. The package also ships
#            promtool, in the same directory; install fails without it. `make
#            test` exports the path as METERLINE_TEST_PROMETHEUS; the
#            dashboard and alert tests then run their own instances, with
#            their own config and data dir, on free ports, and promtool.
#   start    runs a private instance on 127.0.0.1:$PROMETHEUS_PORT that scrapes
#            a local `meterline run` (deploy/prometheus/local.yml) and
#            evaluates the alert rules (deploy/prometheus/alerts.yml, copied
#            beside the config), with its data under $PROMETHEUS_DATA_DIR.
#            Idempotent.
#   stop     stops that instance; status says whether it runs; clean also
#            removes its data dir.
#
# The package's own service (/etc/prometheus, port 9090) is never used:
# policy-rc.d usually keeps it from starting in containers, systemd starts it
# elsewhere, so install stops and disables it either way.
#
# Environment:
#   PROMETHEUS_PORT       port of the private instance      (default 9090)
#   PROMETHEUS_DATA_DIR   its config, TSDB, log and pid file
#                         (default /tmp/meterline-prometheus-$PROMETHEUS_PORT)
#   PROMETHEUS_CONFIG     config to run with                (default deploy/prometheus/local.yml)
#   PROMETHEUS_RULES      alert rules copied beside it as alerts.yml
#                                                         (default deploy/prometheus/alerts.yml)
#   PROMETHEUS_TARGETS    comma-separated host:port list that replaces the
#                         config's one list of targets (default: the config's;
#                         local.yml's are 127.0.0.1:9464,9465,9466, so against
#                         `meterline run` alone give 127.0.0.1:9464, or
#                         MeterlineStageDown fires for the two that never run)
#   PROMETHEUS_START_TIMEOUT  seconds to wait for /-/ready   (default 30)
#
# Exit codes: 0 ok; 1 failure; 2 usage; status: 0 running, 3 stopped.
# Progress goes to stderr; `install` and `status` print their answer on stdout.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$SCRIPT_DIR/../.." && pwd)
# shellcheck source=deploy/local/lib.sh
. "$SCRIPT_DIR/lib.sh"

LISTEN_HOST=127.0.0.1
PORT=${PROMETHEUS_PORT:-9090}
DATA_DIR=${PROMETHEUS_DATA_DIR:-/tmp/meterline-prometheus-$PORT}
CONFIG_SRC=${PROMETHEUS_CONFIG:-$REPO_DIR/deploy/prometheus/local.yml}
RULES_SRC=${PROMETHEUS_RULES:-$REPO_DIR/deploy/prometheus/alerts.yml}
START_TIMEOUT=${PROMETHEUS_START_TIMEOUT:-30}
TARGETS=${PROMETHEUS_TARGETS:-}

MARKER=.meterline-prometheus

log() { printf 'prometheus: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

usage() {
    echo "usage: $0 install|start|stop|status|clean" >&2
    exit 2
}

if ! [[ $PORT =~ ^[0-9]+$ ]] || (( PORT < 1 || PORT > 65535 )); then
    die "PROMETHEUS_PORT '$PORT' is not a port number"
fi
[[ $START_TIMEOUT =~ ^[0-9]+$ ]] || die "PROMETHEUS_START_TIMEOUT must be whole seconds"
[[ -z $TARGETS || $TARGETS =~ ^[A-Za-z0-9.:_-]+(,[A-Za-z0-9.:_-]+)*$ ]] ||
    die "PROMETHEUS_TARGETS must be host:port[,host:port...], got '$TARGETS'"
[[ $DATA_DIR == /* ]] || DATA_DIR="$PWD/$DATA_DIR"
DATA_DIR=${DATA_DIR%/}
[[ -n $DATA_DIR && $DATA_DIR != / ]] || die "refusing to use / as the data dir"

PID_FILE="$DATA_DIR/prometheus.pid"
CONFIG_FILE="$DATA_DIR/prometheus.yml"
RULES_FILE="$DATA_DIR/alerts.yml"
LOG_FILE="$DATA_DIR/prometheus.log"

# ---------------------------------------------------------------- install

find_binary() { command -v prometheus 2>/dev/null || { [[ -x /usr/bin/prometheus ]] && echo /usr/bin/prometheus; }; }

# The package's service: a prometheus reading /etc/prometheus (Debian's
# default config, with or without --config.file). Ours always run with a
# config file under a data dir whose name has "meterline" in it (this
# script's, or the dashboard test's temporary one); others are left alone.
system_instance_pids() {
    local d pid cmd exe
    for d in /proc/[0-9]*; do
        pid=${d#/proc/}
        exe=$(readlink "$d/exe" 2>/dev/null || true)
        [[ $exe == */prometheus ]] || continue
        cmd=$(cmdline_of "$pid")
        [[ $cmd == *meterline* ]] && continue
        [[ $cmd == */etc/prometheus* || $cmd != *--config.file* ]] || continue
        echo "$pid"
    done
}

stop_system_instance() {
    if [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null 2>&1; then
        systemctl disable --now prometheus >/dev/null 2>&1 || true
    elif [[ -x /etc/init.d/prometheus ]]; then
        /etc/init.d/prometheus stop >/dev/null 2>&1 || true
    fi
    local pids=()
    mapfile -t pids < <(system_instance_pids)
    (( ${#pids[@]} > 0 )) || return 0
    log "stopping the prometheus service started by the package (pid ${pids[*]}) ..."
    kill -TERM "${pids[@]}" 2>/dev/null || true
    if ! wait_gone 15 "${pids[@]}"; then
        kill -KILL "${pids[@]}" 2>/dev/null || true
        wait_gone 5 "${pids[@]}" || die "could not stop the system prometheus (pid ${pids[*]})"
    fi
}

ensure_installed() { # prints the binary path
    local bin
    if bin=$(find_binary); then
        check_promtool "$bin"
        echo "$bin"
        return 0
    fi
    # --no-install-recommends: the package recommends prometheus-node-exporter,
    # another service we do not want.
    apt_install_locked prometheus find_binary "install Prometheus (2.x) by hand" \
        --no-install-recommends prometheus
    bin=$(find_binary) || die "prometheus installed but no binary found on PATH"
    stop_system_instance
    check_promtool "$bin"
    echo "$bin"
}

# promtool checks and unit-tests the alert rules; Debian's prometheus
# package installs it beside prometheus.
check_promtool() {
    [[ -x $(dirname "$1")/promtool ]] || die "no promtool beside $1 (Debian's prometheus package ships /usr/bin/promtool)"
}

# ---------------------------------------------------------------- instance

running_pid() { pid_of_file "$PID_FILE" "--config.file=$CONFIG_FILE"; }

ready() { curl -fsS --max-time 2 "http://$LISTEN_HOST:$PORT/-/ready" >/dev/null 2>&1; }

cmd_status() {
    local pid
    if pid=$(running_pid); then
        echo "prometheus: running (pid $pid, http://$LISTEN_HOST:$PORT, data $DATA_DIR)"
        return 0
    fi
    echo "prometheus: stopped (http://$LISTEN_HOST:$PORT, data $DATA_DIR)"
    return 3
}

# with_targets CONFIG — CONFIG with the items of its one `- targets:` list
# replaced by those of PROMETHEUS_TARGETS.
with_targets() {
    local n
    n=$(grep -c '^[[:space:]]*- targets:[[:space:]]*$' "$1" || true)
    [[ $n == 1 ]] || die "PROMETHEUS_TARGETS needs a config with one '- targets:' list, one item a line; $1 has $n"
    awk -v targets="$TARGETS" '
        skip && /^[[:space:]]*- / { next }
        skip {
            skip = 0
            n = split(targets, t, ",")
            for (i = 1; i <= n; i++) print indent "- " t[i]
        }
        /^[[:space:]]*- targets:[[:space:]]*$/ { skip = 1; indent = substr($0, 1, index($0, "-") - 1) "    "; print; next }
        { print }
        END {
            if (skip) { n = split(targets, t, ","); for (i = 1; i <= n; i++) print indent "- " t[i] }
        }' "$1"
}

cmd_start() {
    local bin pid
    bin=$(ensure_installed)
    stop_system_instance
    if pid=$(running_pid); then
        log "already running (pid $pid, http://$LISTEN_HOST:$PORT)"
        return 0
    fi
    if [[ -d $DATA_DIR && ! -e $DATA_DIR/$MARKER ]] && [[ -n $(ls -A "$DATA_DIR") ]]; then
        die "$DATA_DIR exists, is not empty and was not made by this script; set PROMETHEUS_DATA_DIR elsewhere"
    fi
    [[ -f $CONFIG_SRC ]] || die "missing config $CONFIG_SRC"
    [[ -f $RULES_SRC ]] || die "missing alert rules $RULES_SRC"
    mkdir -p "$DATA_DIR/tsdb"
    : >"$DATA_DIR/$MARKER"
    if [[ -n $TARGETS ]]; then
        with_targets "$CONFIG_SRC" >"$CONFIG_FILE"
    else
        cp -f "$CONFIG_SRC" "$CONFIG_FILE"
    fi
    cp -f "$RULES_SRC" "$RULES_FILE"
    log "starting $bin on $LISTEN_HOST:$PORT (config $CONFIG_SRC, data $DATA_DIR) ..."
    (
        cd "$DATA_DIR"
        exec setsid nohup "$bin" --config.file="$CONFIG_FILE" --storage.tsdb.path="$DATA_DIR/tsdb" \
            --web.listen-address="$LISTEN_HOST:$PORT" </dev/null >"$LOG_FILE" 2>&1 8>&-
    ) &
    pid=$!
    disown "$pid" 2>/dev/null || true
    echo "$pid" >"$PID_FILE"
    local deadline=$(( $(date +%s) + START_TIMEOUT ))
    until ready; do
        if ! kill -0 "$pid" 2>/dev/null || (( $(date +%s) >= deadline )); then
            tail -n 20 "$LOG_FILE" >&2 || true
            kill -KILL "$pid" 2>/dev/null || true
            rm -f "$PID_FILE"
            die "start failed (log $LOG_FILE)"
        fi
        sleep 0.2
    done
    log "ready on http://$LISTEN_HOST:$PORT (pid $pid)"
}

cmd_stop() {
    local pid
    if ! pid=$(running_pid); then
        rm -f "$PID_FILE"
        log "not running (http://$LISTEN_HOST:$PORT)"
        return 0
    fi
    kill -TERM "$pid" 2>/dev/null || true
    if ! wait_gone 20 "$pid"; then
        kill -KILL "$pid" 2>/dev/null || true
        wait_gone 5 "$pid" || die "pid $pid did not exit after SIGKILL"
    fi
    rm -f "$PID_FILE"
    log "stopped"
}

cmd_clean() {
    cmd_stop
    [[ -e $DATA_DIR ]] || return 0
    [[ -e $DATA_DIR/$MARKER ]] || die "$DATA_DIR was not made by this script (no $MARKER); not removing it"
    rm -rf -- "$DATA_DIR"
    log "removed $DATA_DIR"
}

case ${1:-} in
    install)
        ensure_installed
        stop_system_instance
        ;;
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    clean) cmd_clean ;;
    *) usage ;;
esac
