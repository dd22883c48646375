#!/usr/bin/env bash
# scripts/java-clients.sh — the jars of the Java producer of
# docs/producing.md (kafka-clients and Apache Avro, from Maven Central),
# fetched once with mvn from docs/examples/java/pom.xml and cached.
#
# Prints the classpath (the cached jars, ':'-separated) on stdout; progress
# goes to stderr. A cache that is incomplete or of another pom is rebuilt.
#
# Environment:
#   METERLINE_CACHE_DIR  cache root (default ~/.cache/meterline)
set -euo pipefail
cd "$(dirname "$0")/.."

POM=docs/examples/java/pom.xml
stamp=$(sha256sum "$POM" | cut -c1-12)
DIR=${METERLINE_CACHE_DIR:-$HOME/.cache/meterline}/java-clients-$stamp

log() { printf 'java-clients: %s\n' "$*" >&2; }

if [[ ! -f $DIR/complete ]]; then
    command -v mvn >/dev/null || { log "mvn not found (apt-get install -y maven)"; exit 1; }
    start=$(date +%s)
    log "fetching kafka-clients and avro from Maven Central into $DIR"
    rm -rf "$DIR"
    mkdir -p "$DIR/jars"
    if ! mvn -B -q -ntp -f "$POM" dependency:copy-dependencies -DincludeScope=runtime \
        -DoutputDirectory="$DIR/jars" </dev/null >"$DIR/mvn.log" 2>&1; then
        tail -n 40 "$DIR/mvn.log" >&2
        log "mvn failed (full output: $DIR/mvn.log)"
        exit 1
    fi
    touch "$DIR/complete"
    log "fetched in $(( $(date +%s) - start ))s"
fi
ls "$DIR"/jars/*.jar | paste -sd: -
