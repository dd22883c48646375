#!/usr/bin/env bash
# test-failures.sh LOG — what each failed test said, from the output of
# `go test -v` in LOG: for every `--- FAIL: Name`, the lines the test logged
# from its own test files (`x_test.go:NN: ...` and their continuation lines;
# not the loggers' lines) while it ran, the last $MAX_LINES of them (default
# 60), and every panic with the 30 lines that follow it. make test prints this
# last, so that a failure's reason is in the tail of a long run's output.
set -euo pipefail
[[ $# -eq 1 && -r $1 ]] || { echo "usage: $0 GO-TEST-V-LOG" >&2; exit 2; }
awk -v max="${MAX_LINES:-60}" '
function keep(line) {
  n = ++cnt[cur]
  buf[cur, n] = line
  if (n > max) delete buf[cur, n - max]
}
/^=== (RUN|CONT|PAUSE|NAME) / { cur = $3; inlog = 0; next }
/^panic: / { panics = panics "\n" $0; left = 30; next }
left > 0 { panics = panics "\n" $0; left--; next }
/^[ \t]*--- FAIL: / {
  name = $3
  inlog = 0
  if (cnt[name] == 0) next
  printf "--- %s said:\n", name
  from = cnt[name] > max ? cnt[name] - max + 1 : 1
  if (from > 1) printf "    (the last %d of its %d lines)\n", max, cnt[name]
  for (i = from; i <= cnt[name]; i++) print buf[name, i]
  next
}
/^[ \t]+[^ \t]+_test\.go:[0-9]+: / { inlog = 1; keep($0); next }
inlog && /^        / { keep($0); next }
{ inlog = 0 }
END { if (panics != "") printf "--- panics:%s\n", panics }
' "$1"
