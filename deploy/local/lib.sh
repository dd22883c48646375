# shellcheck shell=bash
# deploy/local/lib.sh — functions the deploy/local scripts share. They source
# it from their own directory (. "$SCRIPT_DIR/lib.sh"); it is not run on its
# own. The sourcing script defines log and die.

export DEBIAN_FRONTEND=noninteractive

# cmdline_of PID — the process's command line, NULs turned into spaces.
cmdline_of() {
    tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline" || true
}

# pid_of_file PID_FILE NEEDLE — prints the pid in PID_FILE if that process
# runs and its command line holds NEEDLE (a stale pid file's pid may have
# been reused by another process); 1 otherwise.
pid_of_file() {
    local pid
    [[ -f $1 ]] || return 1
    pid=$(<"$1")
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    kill -0 "$pid" 2>/dev/null || return 1
    [[ $(cmdline_of "$pid") == *"$2"* ]] || return 1
    echo "$pid"
}

# wait_gone TIMEOUT_S PID... — waits until every PID has exited; 1 when
# some still runs after TIMEOUT_S seconds.
wait_gone() {
    local deadline=$(( $(date +%s) + $1 )) pid alive
    shift
    while :; do
        alive=0
        for pid in "$@"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        (( alive )) || return 0
        (( $(date +%s) < deadline )) || return 1
        sleep 0.1
    done
}

# apt_install_locked NAME FIND HINT APT_ARG... — installs with
# `apt-get install -y APT_ARG...` (flags and packages), running apt-get
# update and trying again when the first try fails (a stale package list).
# FIND is the caller's function that succeeds once the software is
# installed. Two runs at once must not race on apt/dpkg, so it holds
# /tmp/meterline-NAME-apt.lock (fd 8) meanwhile, and installs nothing when
# FIND succeeds once it has the lock (the other run installed it). Dies,
# saying HINT, where there is no apt-get. The caller runs FIND again after.
apt_install_locked() {
    local name=$1 find=$2 hint=$3 lock apt_log t0 arg versions pkgs=()
    shift 3
    for arg in "$@"; do [[ $arg == -* ]] || pkgs+=("$arg"); done
    command -v apt-get >/dev/null 2>&1 ||
        die "$name is not installed and apt-get is not available; $hint"
    lock=/tmp/meterline-$name-apt.lock
    if command -v flock >/dev/null 2>&1; then
        exec 8>"$lock"
        flock -w 600 8 || die "timed out waiting for another $name install ($lock)"
        if "$find" >/dev/null; then exec 8>&-; return 0; fi
    fi
    apt_log=$(mktemp "/tmp/meterline-$name-apt.XXXXXX.log")
    log "installing ${pkgs[*]} (apt) ..."
    t0=$(date +%s)
    if ! apt_get_install "$apt_log" "$@"; then
        log "package not found or install failed; running apt-get update ..."
        if ! { apt-get update -q </dev/null >>"$apt_log" 2>&1 && apt_get_install "$apt_log" "$@"; }; then
            tail -n 20 "$apt_log" >&2 || true
            die "apt-get install ${pkgs[*]} failed (log: $apt_log)"
        fi
    fi
    exec 8>&-
    rm -f "$apt_log"
    versions=$(dpkg-query -W -f '${Package} ${Version}\n' "${pkgs[@]}" 2>/dev/null | paste -sd, - | sed 's/,/, /g') ||
        versions=${pkgs[*]}
    log "installed $versions in $(( $(date +%s) - t0 ))s"
}

apt_get_install() { # log_file apt_arg...
    local apt_log=$1
    shift
    apt-get install -y -q -o Dpkg::Use-Pty=0 -o DPkg::Lock::Timeout=300 \
        "$@" </dev/null >>"$apt_log" 2>&1
}

# make_certs DIR — a throwaway certificate authority for a local service's
# TLS, made with openssl once and kept: DIR/ca.pem (the CA certificate;
# clients trust it), DIR/server.pem + server-key.pem (for 127.0.0.1 and
# localhost) and DIR/client.pem + client-key.pem (a client certificate).
# Keys are unencrypted PKCS#8 PEM, mode 0600. The CA's key stays in DIR
# too (ca-key.pem): these certificates are for tests on this machine,
# never for anything else.
make_certs() {
    local dir=$1 days=825 ext
    [[ -f $dir/ca.pem && -f $dir/server.pem && -f $dir/client.pem ]] && return 0
    command -v openssl >/dev/null 2>&1 || die "openssl not found (needed to make TLS certificates): apt-get install -y openssl"
    mkdir -p "$dir"
    chmod 700 "$dir"
    ext="$dir/leaf.ext"
    printf '%s\n' 'basicConstraints=CA:FALSE' 'keyUsage=digitalSignature,keyEncipherment' \
        'extendedKeyUsage=serverAuth,clientAuth' 'subjectAltName=DNS:localhost,IP:127.0.0.1' >"$ext"
    (
        set -e
        umask 077
        cd "$dir"
        openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days "$days" \
            -keyout ca-key.pem -out ca.pem -subj "/CN=meterline local test CA $(date +%s)" 2>/dev/null
        local leaf
        for leaf in server client; do
            openssl req -newkey rsa:2048 -nodes -sha256 -keyout "$leaf-key.pem" -out "$leaf.csr" \
                -subj "/CN=meterline-$leaf" 2>/dev/null
            openssl x509 -req -sha256 -days "$days" -in "$leaf.csr" -CA ca.pem -CAkey ca-key.pem \
                -CAcreateserial -extfile leaf.ext -out "$leaf.pem" 2>/dev/null
            rm -f "$leaf.csr"
        done
        rm -f ca.srl leaf.ext
        chmod 644 ca.pem server.pem client.pem
    ) || die "making TLS certificates in $dir failed"
}

# read_secret FILE — sets SECRET to the content of FILE as Meterline reads a
# secret file (internal/secret FromFile): one trailing "\n" dropped, then one
# trailing "\r" (so "pw\r\n" is pw, and "pw\n\n" is pw and a newline);
# every other byte kept. Returns 1, with the reason in SECRET_ERROR (never
# the content), if FILE cannot be read, holds a NUL byte (a shell variable
# cannot) or holds nothing else.
read_secret() {
    SECRET=
    SECRET_ERROR=
    local v size
    if ! size=$(wc -c <"$1" 2>/dev/null); then
        SECRET_ERROR="cannot read it"
        return 1
    fi
    if (( $(tr -d '\000' <"$1" | wc -c) != size )); then
        SECRET_ERROR="it holds a NUL byte"
        return 1
    fi
    v=$(cat -- "$1" && printf x) || { SECRET_ERROR="cannot read it"; return 1; }
    v=${v%x}
    v=${v%$'\n'}
    v=${v%$'\r'}
    if [[ -z $v ]]; then
        SECRET_ERROR="it is empty (or holds a line break only)"
        return 1
    fi
    SECRET=$v
}

# random_password — 32 random hex digits.
random_password() { openssl rand -hex 16; }
