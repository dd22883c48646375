#!/usr/bin/env bash
# scripts/client-venv.sh — a Python virtualenv with the third-party clients
# the tests drive against Meterline: OpenMeter's Python SDK (its HTTP ingest
# client), the CloudEvents SDK, and confluent-kafka with fastavro for the
# Python producer of docs/producing.md.
#
# Prints the path of the virtualenv's python on stdout. The virtualenv is
# reused when it imports the pinned versions; anything else at its path (an
# install that was interrupted, other versions) is removed and rebuilt.
# Progress goes to stderr.
#
# Environment:
#   METERLINE_CLIENT_VENV  where the virtualenv lives
#                          (default ~/.cache/meterline/venv-clients-<stamp>)
#   PYTHON                 the interpreter that creates it (default python3)
set -euo pipefail

OPENMETER_VERSION=1.0.0b236   # PyPI openmeter: prereleases only, so pinned
CLOUDEVENTS_VERSION=1.13.0    # PyPI cloudevents
CONFLUENT_KAFKA_VERSION=2.16.1
FASTAVRO_VERSION=1.13.1
STAMP=om$OPENMETER_VERSION-ce$CLOUDEVENTS_VERSION-ck$CONFLUENT_KAFKA_VERSION-fa$FASTAVRO_VERSION
VENV=${METERLINE_CLIENT_VENV:-$HOME/.cache/meterline/venv-clients-$STAMP}
PYTHON=${PYTHON:-python3}

log() { printf 'client-venv: %s\n' "$*" >&2; }

ready() {
    [ -x "$VENV/bin/python" ] && "$VENV/bin/python" - "$OPENMETER_VERSION" "$CLOUDEVENTS_VERSION" "$CONFLUENT_KAFKA_VERSION" "$FASTAVRO_VERSION" <<'PY' >/dev/null 2>&1
import sys
from importlib.metadata import version
want = dict(zip(["openmeter", "cloudevents", "confluent-kafka", "fastavro"], sys.argv[1:]))
import openmeter, cloudevents, confluent_kafka, fastavro  # noqa: F401  (they import)
sys.exit(0 if all(version(k) == v for k, v in want.items()) else 1)
PY
}

# Test packages run in parallel and may ask for the virtualenv at once:
# one makes it, the others wait for it.
mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock 9

if ready; then
    echo "$VENV/bin/python"
    exit 0
fi

command -v "$PYTHON" >/dev/null || { log "$PYTHON not found (Python 3.9 or later is needed)"; exit 1; }
[[ -n $VENV && $VENV != / ]] || { log "refusing to use '$VENV'"; exit 1; }
start=$(date +%s)
log "installing openmeter $OPENMETER_VERSION, cloudevents, confluent-kafka and fastavro into $VENV"
rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install --quiet --disable-pip-version-check \
    "openmeter==$OPENMETER_VERSION" "cloudevents==$CLOUDEVENTS_VERSION" \
    "confluent-kafka==$CONFLUENT_KAFKA_VERSION" "fastavro==$FASTAVRO_VERSION" >&2
ready || { log "the clients do not import after the install"; exit 1; }
log "installed in $(( $(date +%s) - start ))s"
echo "$VENV/bin/python"
