#!/usr/bin/env bash
# Runs every fuzz target of the module (each `func Fuzz…` of a _test.go
# file), one after the other, FUZZTIME each (default 60s), with the
# minimization of a new input bounded by FUZZMINIMIZETIME (default 5s; Go's
# own default, 60s, can take a short run's whole time). `make fuzz` calls it.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-60s}
FUZZMINIMIZETIME=${FUZZMINIMIZETIME:-5s}
targets=$(grep -rl --include='*_test.go' '^func Fuzz' . | sort | while read -r f; do
  for name in $(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' "$f"); do
    echo "./$(dirname "${f#./}") $name"
  done
done)
[ -n "$targets" ] || { echo "fuzz: no fuzz targets found" >&2; exit 1; }
while read -r pkg name; do
  echo "== $pkg $name ($FUZZTIME)"
  "$GO" test "$pkg" -run '^$' -fuzz "^$name\$" -fuzztime "$FUZZTIME" -fuzzminimizetime "$FUZZMINIMIZETIME"
done <<< "$targets"
