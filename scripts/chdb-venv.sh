#!/usr/bin/env bash
# scripts/chdb-venv.sh — a Python virtualenv holding chdb, which embeds a
# current ClickHouse (26.x) in-process, for the tests that run the
# ClickHouse migrations and the documented queries on a second version
# (sink/analyst_versions_test.go).
#
# Prints the path of the virtualenv's python on stdout. The virtualenv is
# reused when it imports the pinned chdb; anything else at its path (an
# install that was interrupted, another version) is removed and rebuilt.
# Progress and the install time go to stderr.
#
# Environment:
#   METERLINE_CHDB_VENV  where the virtualenv lives
#                        (default ~/.cache/meterline/venv-chdb-<version>)
#   PYTHON               the interpreter that creates it (default python3)
set -euo pipefail

CHDB_VERSION=4.4.0       # PyPI chdb
CHDB_CORE_VERSION=26.9.0 # PyPI chdb-core: ClickHouse 26.9
VENV=${METERLINE_CHDB_VENV:-$HOME/.cache/meterline/venv-chdb-$CHDB_VERSION}
PYTHON=${PYTHON:-python3}

log() { printf 'chdb-venv: %s\n' "$*" >&2; }

ready() {
    [ -x "$VENV/bin/python" ] && "$VENV/bin/python" - "$CHDB_VERSION" <<'PY' >/dev/null 2>&1
import sys, chdb
sys.exit(0 if chdb.__version__ == sys.argv[1] else 1)
PY
}

if ready; then
    echo "$VENV/bin/python"
    exit 0
fi

command -v "$PYTHON" >/dev/null || { log "$PYTHON not found (Python 3.9 or later is needed)"; exit 1; }
[[ -n $VENV && $VENV != / ]] || { log "refusing to use '$VENV'"; exit 1; }
start=$(date +%s)
log "installing chdb $CHDB_VERSION (ClickHouse $CHDB_CORE_VERSION) into $VENV; about 200 MB of wheels on a fresh machine"
rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
if ! "$PYTHON" -m venv "$VENV" >&2; then
    # Debian's python3 needs python3-venv for ensurepip.
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        log "installing python3-venv with apt-get"
        apt-get install -y -q python3-venv >&2 || { apt-get update -q >&2 && apt-get install -y -q python3-venv >&2; }
        rm -rf "$VENV"
        "$PYTHON" -m venv "$VENV" >&2
    else
        log "$PYTHON cannot create a virtualenv (on Debian: apt-get install python3-venv)"
        exit 1
    fi
fi
"$VENV/bin/pip" install --quiet --disable-pip-version-check "chdb==$CHDB_VERSION" "chdb-core==$CHDB_CORE_VERSION" >&2
ready || { log "chdb $CHDB_VERSION does not import after the install"; exit 1; }
log "installed in $(( $(date +%s) - start ))s"
echo "$VENV/bin/python"
