#!/usr/bin/env bash
# Compares the throughput of two meterline binaries in `bench dedup` or
# `bench aggregate`, in alternating rounds on the same input:
#
#   scripts/bench-ab.sh OLD_BIN NEW_BIN dedup|aggregate [ROUNDS] [-- BENCH FLAGS...]
#
#   go build -o /tmp/meterline-old ./cmd/meterline   # at the old commit
#   go build -o /tmp/meterline-new ./cmd/meterline   # at the new one
#   scripts/bench-ab.sh /tmp/meterline-old /tmp/meterline-new dedup 5 -- --brokers 127.0.0.1:9092
#
# A round runs `bench <what> --rounds 1` once with each binary, OLD first in
# odd rounds and NEW first in even ones, so that neither always runs on a
# warmer or a more loaded machine. Each run measures (a), (b) and the stage
# from the start of its own pre-filled input; the inputs are the same
# (internal/bench/inputs.go generates them from the flags alone, shifted
# in time; TestInputsAreTheSame pins them to b9acd11's), so pass both
# binaries the same flags. ROUNDS defaults to 5; the flags after -- go to
# every run (--brokers, --events, --latency-for...; not --rounds). The
# latency phase is not compared; --latency-for 2s shortens it.
#
# Prints each round's rates, then each binary's median, the ratio of the
# medians (NEW/OLD) and the median of the per-round ratios, the stage's
# rate and its rate as a share of baseline (b) of the same run (which
# factors out a machine that is slower in one run than in the next).
# Every run's full output is kept in AB_LOG_DIR (default: a new temporary
# directory, named at the end). Exits non-zero when a run fails.
set -euo pipefail

usage() {
  echo "usage: $0 OLD_BIN NEW_BIN dedup|aggregate [ROUNDS] [-- BENCH FLAGS...]" >&2
  exit 2
}
[ $# -ge 3 ] || usage
old=$1 new=$2 what=$3
shift 3
rounds=5
if [ $# -gt 0 ] && [ "$1" != "--" ]; then
  rounds=$1
  shift
fi
if [ $# -gt 0 ]; then
  [ "$1" = "--" ] || usage
  shift
fi
case $what in dedup | aggregate) ;; *) usage ;; esac
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "$0: ROUNDS must be a positive number, got '$rounds'" >&2; exit 2; }
for bin in "$old" "$new"; do
  [ -x "$bin" ] || { echo "$0: $bin is not an executable" >&2; exit 2; }
done
logs=${AB_LOG_DIR:-$(mktemp -d -t meterline-bench-ab.XXXXXX)}
mkdir -p "$logs"

# rate LINE_PREFIX FILE: the events/s of the table line that starts with
# LINE_PREFIX (the number before "events/s").
rate() {
  awk -v p="$1" 'index($0, p) == 1 { for (i = 2; i <= NF; i++) if ($i == "events/s") { print $(i - 1); exit } }' "$2"
}

# median: the median of the numbers on stdin (the mean of the middle two
# for an even count), as bench's Results.Median.
median() {
  sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) exit 1; if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# run SIDE BIN ROUND: one run; appends "ROUND stage-rate (b)-rate" to
# $logs/SIDE.rates.
run() {
  local side=$1 bin=$2 round=$3
  local out=$logs/$side-$round.out
  shift 3
  echo "round $round: $side ($bin)" >&2
  if ! "$bin" bench "$what" --rounds 1 "$@" >"$out" 2>"$logs/$side-$round.err"; then
    echo "$0: round $round, $side failed; its output is in $out and $logs/$side-$round.err" >&2
    tail -5 "$logs/$side-$round.err" >&2
    exit 1
  fi
  local s b
  s=$(rate "$what " "$out")
  b=$(rate "(b) " "$out")
  if [ -z "$s" ] || [ -z "$b" ]; then
    echo "$0: round $round, $side: no '$what' or '(b)' rate in $out" >&2
    exit 1
  fi
  echo "$round $s $b" >>"$logs/$side.rates"
}

rm -f "$logs/old.rates" "$logs/new.rates"
for ((r = 1; r <= rounds; r++)); do
  if ((r % 2)); then
    run old "$old" "$r" "$@"
    run new "$new" "$r" "$@"
  else
    run new "$new" "$r" "$@"
    run old "$old" "$r" "$@"
  fi
done

# The per-round table, then the medians.
# Both files list the rounds in order: round, stage rate, (b) rate.
awk '{ print $2, $3 }' "$logs/new.rates" | paste -d ' ' "$logs/old.rates" - >"$logs/rounds"
echo "bench $what, $rounds alternating rounds (OLD $old, NEW $new); events/s"
printf "%5s %9s %8s %9s %8s %8s %15s\n" round old "old (b)" new "new (b)" new/old "new/old of (b)"
awk -v w="$what" '{ printf "%5d %9.0f %8.0f %9.0f %8.0f %8.3f %15.3f\n", $1, $2, $3, $4, $5, $4 / $2, ($4 / $5) / ($2 / $3) }' "$logs/rounds"
mo=$(awk '{ print $2 }' "$logs/rounds" | median)
mn=$(awk '{ print $4 }' "$logs/rounds" | median)
mob=$(awk '{ print $2 / $3 }' "$logs/rounds" | median)
mnb=$(awk '{ print $4 / $5 }' "$logs/rounds" | median)
mr=$(awk '{ print $4 / $2 }' "$logs/rounds" | median)
mrb=$(awk '{ print ($4 / $5) / ($2 / $3) }' "$logs/rounds" | median)
awk -v mo="$mo" -v mn="$mn" -v mob="$mob" -v mnb="$mnb" -v mr="$mr" -v mrb="$mrb" -v w="$what" 'BEGIN {
  printf "median old: %.0f events/s (%.3f of (b))\n", mo, mob
  printf "median new: %.0f events/s (%.3f of (b))\n", mn, mnb
  printf "new/old, ratio of medians:         %.3f (of (b): %.3f)\n", mn / mo, mnb / mob
  printf "new/old, median of round ratios:   %.3f (of (b): %.3f)\n", mr, mrb
}'
echo "runs' output: $logs"
