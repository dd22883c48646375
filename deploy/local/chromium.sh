#!/usr/bin/env bash
# deploy/local/chromium.sh — headless Chromium for Meterline's browser test.
#
#   deploy/local/chromium.sh [path]
#
# Prints the path of a Chromium binary on stdout, installing Debian's
# `chromium` package with apt-get first when none is on PATH (needs root).
# Idempotent: a second run only prints the path. scripts/test.sh exports the
# path as METERLINE_TEST_CHROMIUM; the status page test (TestRealStatusPage*)
# loads the page with it (--headless --dump-dom, --screenshot).
#
# Environment:
#   CHROMIUM   use this binary instead of looking on PATH
#
# Exit codes: 0 ok (path printed); 1 failure; 2 usage.
# Progress goes to stderr.
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive

log() { printf 'chromium: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

case ${1:-path} in
    path) ;;
    -h | --help | help) echo "usage: $0 [path]" >&2; exit 2 ;;
    *) echo "usage: $0 [path]" >&2; exit 2 ;;
esac

find_binary() {
    local p
    if [[ -n ${CHROMIUM:-} ]]; then
        [[ -x $CHROMIUM ]] || die "CHROMIUM=$CHROMIUM is not an executable"
        echo "$CHROMIUM"
        return 0
    fi
    # Debian's package installs /usr/bin/chromium (a wrapper script that sets
    # the flags Debian wants); other distributions name it differently.
    for p in chromium chromium-browser google-chrome-stable google-chrome; do
        if command -v "$p" >/dev/null 2>&1; then
            command -v "$p"
            return 0
        fi
    done
    return 1
}

apt_install() { # $1 = log file
    apt-get install -y -q --no-install-recommends -o Dpkg::Use-Pty=0 -o DPkg::Lock::Timeout=300 \
        chromium fonts-dejavu-core </dev/null >>"$1" 2>&1
}

ensure_installed() {
    find_binary && return 0
    command -v apt-get >/dev/null 2>&1 ||
        die "chromium is not installed and apt-get is not available; install Chromium by hand or set CHROMIUM=/path/to/chromium"
    local lock=/tmp/meterline-chromium-apt.lock apt_log t0
    # Two runs at once must not race on apt/dpkg.
    if command -v flock >/dev/null 2>&1; then
        exec 8>"$lock"
        flock -w 600 8 || die "timed out waiting for another chromium install ($lock)"
        if find_binary; then exec 8>&-; return 0; fi
    fi
    apt_log=$(mktemp /tmp/meterline-chromium-apt.XXXXXX.log)
    log "installing chromium (apt) ..."
    t0=$(date +%s)
    if ! apt_install "$apt_log"; then
        log "package not found or install failed; running apt-get update ..."
        if ! { apt-get update -q </dev/null >>"$apt_log" 2>&1 && apt_install "$apt_log"; }; then
            tail -n 20 "$apt_log" >&2 || true
            die "apt-get install chromium failed (log: $apt_log)"
        fi
    fi
    exec 8>&-
    rm -f "$apt_log"
    log "installed $(dpkg-query -W -f '${Version}' chromium 2>/dev/null || echo chromium) in $(( $(date +%s) - t0 ))s"
    find_binary || die "chromium installed but no chromium binary found on PATH"
}

ensure_installed
