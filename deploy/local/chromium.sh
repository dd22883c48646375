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

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=deploy/local/lib.sh
. "$SCRIPT_DIR/lib.sh"

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

ensure_installed() {
    find_binary && return 0
    apt_install_locked chromium find_binary "install Chromium by hand or set CHROMIUM=/path/to/chromium" \
        --no-install-recommends chromium fonts-dejavu-core
    find_binary || die "chromium installed but no chromium binary found on PATH"
}

ensure_installed
