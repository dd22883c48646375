#!/usr/bin/env bash
# deploy/local/clickhouse.sh — throwaway local ClickHouse for Meterline (no systemd).
#
#   deploy/local/clickhouse.sh start|start-fresh|stop|status|clean
#
#   start-fresh  start on a new data dir unless the server is running: what
#                `make test` does, so that the tables and system logs earlier
#                runs left behind (whose loading can outlast the start
#                timeout) are gone
#
# Runs Debian's clickhouse-server (bookworm ships 18.16.1) as a private instance
# on 127.0.0.1, with every path inside one data dir. Installs the package with
# apt-get when the binary is missing (needs root). Any system instance that the
# package may have started is stopped; /etc/clickhouse-server is never used.
#
# Environment:
#   CLICKHOUSE_PORT           native port               (default 9000)
#   CLICKHOUSE_HTTP_PORT      HTTP port                 (default 8123, or that of
#                             the server running from the data dir)
#   CLICKHOUSE_DATA_DIR       data dir, holds configs, logs, pid file
#                             (default /tmp/meterline-clickhouse-$CLICKHOUSE_PORT)
#   CLICKHOUSE_START_TIMEOUT  seconds to wait for readiness (default 90)
#   CLICKHOUSE_STOP_TIMEOUT   seconds to wait after SIGTERM before SIGKILL (default 20)
#   CLICKHOUSE_PASSWORD_FILE  file holding the password of user `default`
#                             (default: none, no password), read as Meterline
#                             reads --clickhouse-password-file: one trailing
#                             "\n" or "\r\n" dropped; only its SHA-256 is
#                             written to the server's users.xml
#   CLICKHOUSE_TLS_PORT       also serve the native protocol over TLS on this port
#                             (tcp_port_secure), a client certificate required;
#                             the CA, server and client certificates are made
#                             with openssl in $CLICKHOUSE_DATA_DIR/security
#                             (ca.pem, client.pem, client-key.pem) (default: none)
#   CLICKHOUSE_HTTPS_PORT     also serve HTTP over TLS on this port (https_port),
#                             with the same certificates, a client certificate
#                             required; start checks that /ping answers there
#                             with the client certificate and refuses a client
#                             without one (default: none)
#
# Example, a password-protected server with TLS:
#   CLICKHOUSE_PORT=9400 CLICKHOUSE_HTTP_PORT=8423 CLICKHOUSE_TLS_PORT=9440 \
#     CLICKHOUSE_HTTPS_PORT=9443 CLICKHOUSE_PASSWORD_FILE=/path/to/pw \
#     deploy/local/clickhouse.sh start
#
# Exit codes: 0 ok; 1 failure; 2 usage; status: 0 running, 3 stopped.
# Progress goes to stderr; `status` prints its one-line answer on stdout.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TEMPLATE_DIR="$SCRIPT_DIR/clickhouse"
# shellcheck source=deploy/local/lib.sh
. "$SCRIPT_DIR/lib.sh"

LISTEN_HOST=127.0.0.1
TCP_PORT=${CLICKHOUSE_PORT:-9000}
HTTP_PORT=${CLICKHOUSE_HTTP_PORT:-8123}
DATA_DIR=${CLICKHOUSE_DATA_DIR:-/tmp/meterline-clickhouse-$TCP_PORT}
START_TIMEOUT=${CLICKHOUSE_START_TIMEOUT:-90}
TLS_PORT=${CLICKHOUSE_TLS_PORT:-}
HTTPS_PORT=${CLICKHOUSE_HTTPS_PORT:-}
PASSWORD_FILE=${CLICKHOUSE_PASSWORD_FILE:-}
STOP_TIMEOUT=${CLICKHOUSE_STOP_TIMEOUT:-20}

MARKER=.meterline-clickhouse
# Debian puts the server in /usr/sbin, which a non-login PATH may lack.
PATH="$PATH:/usr/sbin:/sbin"

log() { printf 'clickhouse: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

usage() {
    echo "usage: $0 start|start-fresh|stop|status|clean" >&2
    exit 2
}

is_port() { [[ $1 =~ ^[0-9]+$ ]] && (( $1 >= 1 && $1 <= 65535 )); }
is_port "$TCP_PORT" || die "CLICKHOUSE_PORT '$TCP_PORT' is not a port number"
is_port "$HTTP_PORT" || die "CLICKHOUSE_HTTP_PORT '$HTTP_PORT' is not a port number"
[[ $TCP_PORT != "$HTTP_PORT" ]] || die "CLICKHOUSE_PORT and CLICKHOUSE_HTTP_PORT must differ"
if [[ -n $TLS_PORT ]]; then
    is_port "$TLS_PORT" || die "CLICKHOUSE_TLS_PORT '$TLS_PORT' is not a port number"
    [[ $TLS_PORT != "$TCP_PORT" && $TLS_PORT != "$HTTP_PORT" ]] || die "CLICKHOUSE_TLS_PORT must differ from the other ports"
fi
if [[ -n $HTTPS_PORT ]]; then
    is_port "$HTTPS_PORT" || die "CLICKHOUSE_HTTPS_PORT '$HTTPS_PORT' is not a port number"
    [[ $HTTPS_PORT != "$TCP_PORT" && $HTTPS_PORT != "$HTTP_PORT" && $HTTPS_PORT != "$TLS_PORT" ]] ||
        die "CLICKHOUSE_HTTPS_PORT must differ from the other ports"
fi
# The password, read as Meterline reads --clickhouse-password-file (lib.sh
# read_secret), so that the server requires the one Meterline sends.
PASSWORD=
if [[ -n $PASSWORD_FILE ]]; then
    read_secret "$PASSWORD_FILE" || die "CLICKHOUSE_PASSWORD_FILE '$PASSWORD_FILE': $SECRET_ERROR"
    PASSWORD=$SECRET
    # clickhouse-client, which the script checks the server with, refuses them.
    [[ $PASSWORD != *[[:cntrl:]]* ]] ||
        die "CLICKHOUSE_PASSWORD_FILE '$PASSWORD_FILE': the password holds a control character (a line break inside it?), which clickhouse-client refuses"
fi
[[ $START_TIMEOUT =~ ^[0-9]+$ ]] || die "CLICKHOUSE_START_TIMEOUT must be whole seconds"
[[ $STOP_TIMEOUT =~ ^[0-9]+$ ]] || die "CLICKHOUSE_STOP_TIMEOUT must be whole seconds"
[[ -n $DATA_DIR ]] || die "CLICKHOUSE_DATA_DIR is empty"
[[ $DATA_DIR == /* ]] || DATA_DIR="$PWD/$DATA_DIR"
DATA_DIR=${DATA_DIR%/}
[[ -n $DATA_DIR && $DATA_DIR != / ]] || die "refusing to use / as the data dir"

PID_FILE="$DATA_DIR/clickhouse-server.pid"
SECURITY_DIR="$DATA_DIR/security"
TLS_CONFIG="$DATA_DIR/config.d/tls.xml"
# The client's own config (user, password) for the script's checks: the
# password is never on a command line.
CLIENT_CONFIG="$DATA_DIR/client.xml"
CONFIG_FILE="$DATA_DIR/config.xml"
USERS_FILE="$DATA_DIR/users.xml"
LOG_DIR="$DATA_DIR/log"
ERR_LOG="$LOG_DIR/clickhouse-server.err.log"
OUT_LOG="$LOG_DIR/stdout.log"
SERVER_LOG="$LOG_DIR/clickhouse-server.log"

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# ---------------------------------------------------------------- binaries

SERVER_CMD=()
CLIENT_CMD=()

# Debian's package: /usr/sbin/clickhouse-server + /usr/bin/clickhouse-client
# (separate binaries on a shared libclickhouse.so). Upstream packages ship one
# /usr/bin/clickhouse multi-call binary ("clickhouse server"/"clickhouse client").
find_binaries() {
    SERVER_CMD=()
    CLIENT_CMD=()
    local p
    if p=$(command -v clickhouse-server 2>/dev/null); then
        SERVER_CMD=("$p")
    elif p=$(command -v clickhouse 2>/dev/null); then
        SERVER_CMD=("$p" server)
    fi
    if p=$(command -v clickhouse-client 2>/dev/null); then
        CLIENT_CMD=("$p")
    elif p=$(command -v clickhouse 2>/dev/null); then
        CLIENT_CMD=("$p" client)
    fi
    (( ${#SERVER_CMD[@]} > 0 && ${#CLIENT_CMD[@]} > 0 ))
}

ensure_installed() {
    find_binaries && return 0
    apt_install_locked clickhouse find_binaries "install ClickHouse (clickhouse-server, clickhouse-client) by hand" \
        clickhouse-server clickhouse-client
    find_binaries || die "clickhouse-server installed but no server/client binary found on PATH"
    # The package may try to start its own service (policy-rc.d usually blocks
    # it in containers, systemd starts it elsewhere). We never use it.
    stop_system_instance
}

# ---------------------------------------------------------------- processes

# The package's own instance: a clickhouse server reading /etc/clickhouse-server.
system_instance_pids() {
    local d pid cmd
    for d in /proc/[0-9]*; do
        pid=${d#/proc/}
        cmd=$(cmdline_of "$pid")
        [[ $cmd == *clickhouse* && $cmd == */etc/clickhouse-server/* ]] || continue
        [[ $cmd == *"$CONFIG_FILE"* ]] && continue
        echo "$pid"
    done
}

stop_system_instance() {
    local pids=()
    mapfile -t pids < <(system_instance_pids)
    (( ${#pids[@]} > 0 )) || return 0
    log "stopping the system clickhouse-server instance started by the package (pid ${pids[*]}) ..."
    if [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null 2>&1; then
        systemctl stop clickhouse-server >/dev/null 2>&1 || true
    fi
    kill -TERM "${pids[@]}" 2>/dev/null || true
    if ! wait_gone "$STOP_TIMEOUT" "${pids[@]}"; then
        kill -KILL "${pids[@]}" 2>/dev/null || true
        wait_gone 5 "${pids[@]}" || die "could not stop the system clickhouse-server (pid ${pids[*]})"
    fi
}

# A live server process started with our config file (pid file aside).
scan_pid() {
    local d pid
    for d in /proc/[0-9]*; do
        pid=${d#/proc/}
        [[ $(cmdline_of "$pid") == *"--config-file=$CONFIG_FILE"* ]] || continue
        echo "$pid"
        return 0
    done
    return 1
}

# Our server's pid if it is running (pid file + live process started with our config).
running_pid() { pid_of_file "$PID_FILE" "$CONFIG_FILE"; }

# ---------------------------------------------------------------- probes

HAVE_CURL=0
command -v curl >/dev/null 2>&1 && HAVE_CURL=1

# GET /ping on the HTTP port answers "Ok." when the server is up.
http_ping() {
    local body=
    if (( HAVE_CURL )); then
        body=$(curl -fsS --max-time 2 "http://$LISTEN_HOST:$HTTP_PORT/ping" 2>/dev/null) || return 1
    else
        body=$(
            exec 2>/dev/null
            exec 3<>"/dev/tcp/$LISTEN_HOST/$HTTP_PORT" || exit 1
            printf 'GET /ping HTTP/1.0\r\nHost: %s\r\n\r\n' "$LISTEN_HOST" >&3
            timeout 2 cat <&3 || cat <&3
        ) || return 1
    fi
    [[ $body == *Ok.* ]]
}

port_open() { # port -> 0 if something listens on LISTEN_HOST:port
    if command -v timeout >/dev/null 2>&1; then
        timeout 2 bash -c "exec 3<>/dev/tcp/$LISTEN_HOST/$1" 2>/dev/null
    else
        (exec 3<>"/dev/tcp/$LISTEN_HOST/$1") 2>/dev/null
    fi
}

client() {
    local t=()
    command -v timeout >/dev/null 2>&1 && t=(timeout 15)
    "${t[@]}" "${CLIENT_CMD[@]}" --config-file "$CLIENT_CONFIG" --host "$LISTEN_HOST" --port "$TCP_PORT" "$@" </dev/null
}

show_error_log() {
    local f shown=0
    for f in "$ERR_LOG" "$OUT_LOG"; do
        if [[ -s $f ]]; then
            log "--- tail of $f ---"
            tail -n 25 "$f" >&2 || true
            shown=1
        fi
    done
    (( shown )) || log "(no server log output in $LOG_DIR)"
}

# report_gone says that the server this script started (its pid file is
# still there) ended without a stop: a crash (18.16 aborts on some internal
# errors, "pure virtual method called"), the OOM killer or a kill from
# outside, with what its logs say of it. Every client of it failed from
# then on; this names why.
report_gone() {
    log "the server started here (pid $(head -c 20 "$PID_FILE")) is gone without a stop: crashed or killed"
    local fatal=
    [[ -s $ERR_LOG ]] && fatal=$(grep -E '<(Fatal|Error)> BaseDaemon|Received signal|Terminate called' "$ERR_LOG" | tail -n 8)
    if [[ -n $fatal ]]; then
        log "--- what $ERR_LOG says of its end ---"
        printf '%s\n' "$fatal" >&2
        [[ -s $OUT_LOG ]] && tail -n 2 "$OUT_LOG" >&2
    else
        log "its logs name no crash (SIGKILL, the OOM killer: see dmesg)"
        show_error_log
    fi
}

# ---------------------------------------------------------------- data dir

lock_data_dir() {
    command -v flock >/dev/null 2>&1 || return 0
    exec 9>"$DATA_DIR/.lock"
    flock -w 60 9 || die "another clickhouse.sh is busy with $DATA_DIR"
}

prepare_data_dir() {
    if [[ -d $DATA_DIR && ! -e $DATA_DIR/$MARKER ]] && [[ -n $(ls -A "$DATA_DIR") ]]; then
        die "$DATA_DIR exists, is not empty and was not made by this script; set CLICKHOUSE_DATA_DIR elsewhere"
    fi
    mkdir -p "$DATA_DIR" "$LOG_DIR" "$DATA_DIR/data" "$DATA_DIR/tmp" \
        "$DATA_DIR/user_files" "$DATA_DIR/format_schemas"
    : >"$DATA_DIR/$MARKER"
}

sed_escape() { printf '%s' "$1" | sed -e 's/[\\|&]/\\&/g'; }

render() { # template -> dest
    [[ -f $1 ]] || die "missing config template $1"
    local dir tmp pw_element='<password></password>'
    dir=$(sed_escape "$DATA_DIR")
    tmp="$2.tmp.$$"
    if [[ -n $PASSWORD_FILE ]]; then
        pw_element="<password_sha256_hex>$(password_sha256)</password_sha256_hex>"
    fi
    sed -e "s|@@DATA_DIR@@|$dir|g" \
        -e "s|@@TCP_PORT@@|$TCP_PORT|g" \
        -e "s|@@HTTP_PORT@@|$HTTP_PORT|g" \
        -e "s|@@PASSWORD_ELEMENT@@|$pw_element|g" \
        -e "s|@@LISTEN_HOST@@|$LISTEN_HOST|g" "$1" >"$tmp"
    mv -f "$tmp" "$2"
}

# The SHA-256 of the password in PASSWORD_FILE.
password_sha256() {
    printf '%s' "$PASSWORD" | sha256sum | cut -d' ' -f1
}

# The client config of the script's own checks: user default and, with
# CLICKHOUSE_PASSWORD_FILE, its password (mode 0600).
write_client_config() {
    local pw=$PASSWORD
    pw=${pw//&/&amp;}
    pw=${pw//</&lt;}
    (umask 077 && printf '<config>\n    <user>default</user>\n    <password>%s</password>\n</config>\n' "$pw" >"$CLIENT_CONFIG")
}

# With CLICKHOUSE_TLS_PORT or CLICKHOUSE_HTTPS_PORT: certificates (lib.sh
# make_certs) and config.d/tls.xml, merged into config.xml by the server:
# native protocol and/or HTTP over TLS, a client certificate signed by the
# local CA required. Without: no tls.xml.
write_tls_config() {
    rm -f "$TLS_CONFIG"
    [[ -n $TLS_PORT || -n $HTTPS_PORT ]] || return 0
    make_certs "$SECURITY_DIR"
    mkdir -p "$(dirname "$TLS_CONFIG")"
    local ports=
    [[ -z $TLS_PORT ]] || ports+="    <tcp_port_secure>$TLS_PORT</tcp_port_secure>"$'\n'
    [[ -z $HTTPS_PORT ]] || ports+="    <https_port>$HTTPS_PORT</https_port>"$'\n'
    cat >"$TLS_CONFIG" <<XML
<?xml version="1.0"?>
<!-- Written by deploy/local/clickhouse.sh (CLICKHOUSE_TLS_PORT, CLICKHOUSE_HTTPS_PORT) on every start. -->
<yandex>
${ports}    <openSSL>
        <server>
            <certificateFile>$SECURITY_DIR/server.pem</certificateFile>
            <privateKeyFile>$SECURITY_DIR/server-key.pem</privateKeyFile>
            <caConfig>$SECURITY_DIR/ca.pem</caConfig>
            <verificationMode>strict</verificationMode>
            <loadDefaultCAFile>false</loadDefaultCAFile>
            <cacheSessions>true</cacheSessions>
            <disableProtocols>sslv2,sslv3,tlsv1,tlsv1_1</disableProtocols>
            <preferServerCiphers>true</preferServerCiphers>
        </server>
    </openSSL>
</yandex>
XML
}

# With CLICKHOUSE_HTTPS_PORT: /ping answers over HTTPS to a client with the
# local CA and the client certificate, and the server refuses a client
# without a certificate (verificationMode strict). Without curl: the port
# accepts connections.
check_https() {
    local url="https://$LISTEN_HOST:$HTTPS_PORT/ping" body
    if (( ! HAVE_CURL )); then
        port_open "$HTTPS_PORT" || { log "HTTPS port $LISTEN_HOST:$HTTPS_PORT does not accept connections"; return 1; }
        return 0
    fi
    body=$(curl -fsS --max-time 5 --cacert "$SECURITY_DIR/ca.pem" --cert "$SECURITY_DIR/client.pem" \
        --key "$SECURITY_DIR/client-key.pem" "$url" 2>&1) || { log "HTTPS check $url failed: $body"; return 1; }
    [[ $body == *Ok.* ]] || { log "HTTPS check $url answered '$body', not Ok."; return 1; }
    if curl -fsS --max-time 5 --cacert "$SECURITY_DIR/ca.pem" "$url" >/dev/null 2>&1; then
        log "HTTPS check: $url answered a client without a certificate"
        return 1
    fi
}

# ---------------------------------------------------------------- commands

cmd_status() {
    local pid
    if pid=$(running_pid); then
        local health="answering /ping"
        http_ping || health="NOT answering /ping"
        echo "clickhouse: running (pid $pid, native $LISTEN_HOST:$TCP_PORT, http $LISTEN_HOST:$HTTP_PORT, $health, data $DATA_DIR)"
        return 0
    fi
    echo "clickhouse: stopped (native $LISTEN_HOST:$TCP_PORT, data $DATA_DIR)"
    return 3
}

SERVER_PID=

# report_loading names a server that is still loading its tables (it
# answers nothing before that ends): a data dir that earlier runs filled.
report_loading() {
    local last
    [[ -s $SERVER_LOG ]] || return 0
    last=$(tail -n 1 "$SERVER_LOG")
    [[ $last == *'Loading metadata'* || $last == *'Starting up tables'* || $last == *'%'* ]] || return 0
    log "it is still loading the tables of $DATA_DIR ($(du -sh "$DATA_DIR/data" 2>/dev/null | cut -f1) under data/): raise CLICKHOUSE_START_TIMEOUT, or use start-fresh (or clean) if nothing in it is needed"
    log "its log's last line: $last"
}

wait_ready() { # t0 -> 0 when /ping answers; follows SERVER_PID
    local deadline found
    deadline=$(awk -v t="$1" -v s="$START_TIMEOUT" 'BEGIN { printf "%d", t + s + 1 }')
    while :; do
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            # setsid may have forked: the server then lives under another pid.
            if found=$(scan_pid); then
                SERVER_PID=$found
                echo "$SERVER_PID" >"$PID_FILE"
                continue
            fi
            log "server process $SERVER_PID exited during startup"
            return 1
        fi
        http_ping && return 0
        if (( $(date +%s) >= deadline )); then
            log "server did not answer http://$LISTEN_HOST:$HTTP_PORT/ping within ${START_TIMEOUT}s"
            report_loading
            return 1
        fi
        sleep 0.1
    done
}

native_version() { # retries briefly: the native listener may lag /ping a little
    local v
    for _ in 1 2 3 4 5; do
        if v=$(client -q 'SELECT version()' 2>&1); then
            echo "$v"
            return 0
        fi
        sleep 0.3
    done
    log "native port check failed: $v"
    return 1
}

# abort_start MESSAGE — shows the server's log, kills the server being
# started (SERVER_PID) and dies with MESSAGE.
abort_start() {
    show_error_log
    if kill -0 "$SERVER_PID" 2>/dev/null; then
        kill -KILL "$SERVER_PID" 2>/dev/null || true
        wait_gone 5 "$SERVER_PID" || true
    fi
    rm -f "$PID_FILE"
    die "$1 (server stopped; logs in $LOG_DIR)"
}

cmd_start() {
    ensure_installed
    prepare_data_dir
    lock_data_dir

    local t0 version
    if SERVER_PID=$(running_pid); then
        t0=$(now)
        if wait_ready "$t0" && version=$(native_version); then
            log "already running: $version on $LISTEN_HOST:$TCP_PORT (http $HTTP_PORT, pid $SERVER_PID, data $DATA_DIR)"
            return 0
        fi
        show_error_log
        die "pid $SERVER_PID is running but not healthy; run '$0 stop' and start again"
    fi
    rm -f "$PID_FILE"

    # Something else on our ports? A package-started system instance is ours to stop.
    if port_open "$TCP_PORT" || port_open "$HTTP_PORT"; then
        stop_system_instance
        port_open "$TCP_PORT" && die "port $LISTEN_HOST:$TCP_PORT is already in use by another process (set CLICKHOUSE_PORT)"
        port_open "$HTTP_PORT" && die "port $LISTEN_HOST:$HTTP_PORT is already in use by another process (set CLICKHOUSE_HTTP_PORT)"
    fi
    # The server would start without a TLS listener it cannot bind.
    [[ -n $TLS_PORT ]] && port_open "$TLS_PORT" &&
        die "port $LISTEN_HOST:$TLS_PORT is already in use by another process (set CLICKHOUSE_TLS_PORT)"
    [[ -n $HTTPS_PORT ]] && port_open "$HTTPS_PORT" &&
        die "port $LISTEN_HOST:$HTTPS_PORT is already in use by another process (set CLICKHOUSE_HTTPS_PORT)"

    render "$TEMPLATE_DIR/config.xml.tmpl" "$CONFIG_FILE"
    render "$TEMPLATE_DIR/users.xml.tmpl" "$USERS_FILE"
    write_client_config
    write_tls_config
    # Fresh error log per start, so a failure shows this start's errors only.
    [[ -f $ERR_LOG ]] && mv -f "$ERR_LOG" "$ERR_LOG.prev"
    : >"$OUT_LOG"

    log "starting ${SERVER_CMD[*]} (native $LISTEN_HOST:$TCP_PORT, http $HTTP_PORT, data $DATA_DIR) ..."
    t0=$(now)
    # setsid: own session, so a terminal's Ctrl-C or a caller's process group
    # kill does not take the server along. fd 8/9 (our locks) are closed for it.
    # The server runs in the data dir; as root it needs no user switch.
    (
        cd "$DATA_DIR"
        exec setsid nohup "${SERVER_CMD[@]}" --config-file="$CONFIG_FILE" \
            </dev/null >>"$OUT_LOG" 2>&1 8>&- 9>&-
    ) &
    SERVER_PID=$!
    disown "$SERVER_PID" 2>/dev/null || true # no "Aborted"/"Killed" job notices
    # $! is the server itself (the subshell execs setsid, which execs nohup,
    # which execs the server); wait_ready follows it if setsid had to fork.
    echo "$SERVER_PID" >"$PID_FILE"

    wait_ready "$t0" && version=$(native_version) || abort_start "start failed"
    log "$version ready on $LISTEN_HOST:$TCP_PORT in $(elapsed "$t0")s (http $HTTP_PORT, pid $SERVER_PID, data $DATA_DIR)"
    # A server whose TLS listener failed is stopped: a later start would
    # find it running and call it healthy.
    if [[ -n $TLS_PORT ]]; then
        port_open "$TLS_PORT" || abort_start "TLS port $LISTEN_HOST:$TLS_PORT does not accept connections"
        log "native TLS on $LISTEN_HOST:$TLS_PORT (client certificate required; CA and client certificate in $SECURITY_DIR)"
    fi
    if [[ -n $HTTPS_PORT ]]; then
        check_https || abort_start "HTTPS on $LISTEN_HOST:$HTTPS_PORT failed its check"
        log "HTTPS on $LISTEN_HOST:$HTTPS_PORT (client certificate required; CA and client certificate in $SECURITY_DIR)"
    fi
    [[ -n $PASSWORD_FILE ]] && log "user default needs the password in $PASSWORD_FILE"
    return 0
}

cmd_stop() {
    [[ -d $DATA_DIR ]] || { log "not running (no $DATA_DIR)"; return 0; }
    lock_data_dir
    local pid t0
    if ! pid=$(running_pid); then
        [[ -s $PID_FILE ]] && report_gone
        rm -f "$PID_FILE"
        log "not running ($LISTEN_HOST:$TCP_PORT, data $DATA_DIR)"
        return 0
    fi
    t0=$(now)
    log "stopping pid $pid ($LISTEN_HOST:$TCP_PORT) ..."
    kill -TERM "$pid" 2>/dev/null || true
    if ! wait_gone "$STOP_TIMEOUT" "$pid"; then
        log "still running after ${STOP_TIMEOUT}s; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        wait_gone 5 "$pid" || die "pid $pid did not exit after SIGKILL"
    fi
    rm -f "$PID_FILE"
    log "stopped in $(elapsed "$t0")s"
}

cmd_clean() {
    cmd_stop
    [[ -e $DATA_DIR ]] || { log "nothing to clean ($DATA_DIR does not exist)"; return 0; }
    [[ -e $DATA_DIR/$MARKER ]] ||
        die "$DATA_DIR was not made by this script (no $MARKER); not removing it"
    rm -rf -- "$DATA_DIR"
    log "removed $DATA_DIR"
}

# Without CLICKHOUSE_HTTP_PORT, a server running from this data dir keeps the
# HTTP port it was started with, which its config names: start, status and
# stop probe that port rather than 8123.
if [[ -z ${CLICKHOUSE_HTTP_PORT:-} ]] && running_pid >/dev/null 2>&1; then
    running_http=$(sed -n 's|.*<http_port>\([0-9][0-9]*\)</http_port>.*|\1|p' "$CONFIG_FILE" | head -n 1)
    [[ -n $running_http ]] && HTTP_PORT=$running_http
fi

case ${1:-} in
    start) cmd_start ;;
    start-fresh)
        cmd_status >/dev/null 2>&1 || { cmd_clean; exec 9>&- || true; }
        cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    clean) cmd_clean ;;
    -h | --help | help) usage ;;
    *) usage ;;
esac
