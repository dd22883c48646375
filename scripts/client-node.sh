#!/usr/bin/env bash
# scripts/client-node.sh — OpenMeter's Node/TypeScript SDK (@openmeter/sdk,
# its HTTP ingest client), installed with npm into a directory of its own,
# for the tests that drive it against Meterline's ingest.
#
# Prints the directory on stdout: run `node` there (an ES module on stdin,
# `node --input-type=module`, resolves '@openmeter/sdk' from its
# node_modules). The directory is reused when it holds the pinned version;
# anything else at its path (an install that was interrupted, another
# version) is removed and rebuilt. Progress goes to stderr.
#
# The SDK declares Node 22 or later (package.json "engines"); its event
# ingestion (fetch, node:crypto) runs on Node 20, which is what the tests
# run it on, so the install does not enforce the engines field. Its peer
# dependency react (for '@openmeter/sdk/react' only) is not installed.
#
# Environment:
#   METERLINE_CLIENT_NODE  where the SDK is installed
#                          (default ~/.cache/meterline/node-clients-<stamp>)
# node and npm are those on PATH (the tests run that node).
set -euo pipefail

OPENMETER_SDK_VERSION=1.0.0-beta.232   # npm @openmeter/sdk: prereleases only ("latest"), so pinned
STAMP=om$OPENMETER_SDK_VERSION
DIR=${METERLINE_CLIENT_NODE:-$HOME/.cache/meterline/node-clients-$STAMP}

log() { printf 'client-node: %s\n' "$*" >&2; }

ready() {
    [ -f "$DIR/node_modules/@openmeter/sdk/package.json" ] &&
        (cd "$DIR" && node --input-type=module - "$OPENMETER_SDK_VERSION" <<'JS' >/dev/null 2>&1)
import { readFileSync } from 'node:fs'
import { OpenMeter } from '@openmeter/sdk'
const want = process.argv[2]
const got = JSON.parse(readFileSync('node_modules/@openmeter/sdk/package.json', 'utf8')).version
if (typeof OpenMeter !== 'function' || got !== want) process.exit(1)
JS
}

command -v node >/dev/null || { log "node not found (Node 20 or later is needed)"; exit 1; }
major=$(node -p 'process.versions.node.split(".")[0]')
(( major >= 20 )) || { log "node is Node $major; Node 20 or later is needed"; exit 1; }

# Test packages run in parallel and may ask for the SDK at once: one
# installs it, the others wait for it.
mkdir -p "$(dirname "$DIR")"
exec 9>"$DIR.lock"
flock 9

if ready; then
    echo "$DIR"
    exit 0
fi

command -v npm >/dev/null || { log "npm not found"; exit 1; }
[[ -n $DIR && $DIR != / ]] || { log "refusing to use '$DIR'"; exit 1; }
start=$(date +%s)
log "installing @openmeter/sdk $OPENMETER_SDK_VERSION into $DIR"
rm -rf "$DIR"
mkdir -p "$DIR"
printf '{"private": true, "type": "module"}\n' >"$DIR/package.json"
npm install --prefix "$DIR" --no-audit --no-fund --no-update-notifier \
    --save-exact --legacy-peer-deps --engine-strict=false --loglevel=error \
    "@openmeter/sdk@$OPENMETER_SDK_VERSION" >&2
ready || { log "@openmeter/sdk does not import after the install"; exit 1; }
log "installed in $(( $(date +%s) - start ))s"
echo "$DIR"
