#!/usr/bin/env bash
# Runs easel's libFuzzer targets (tests/fuzz/README.md), built by scripts/sanitize.sh in
# build-sanitize/fuzz/. For each target fuzz_<name>:
#  1. replays tests/fuzz/regressions/<name>/ (every input that ever crashed it): each must pass;
#  2. fuzzes from tests/fuzz/corpus/<name>/ (read-only; new inputs go to a work folder) for
#     --time seconds or --runs executions.
# A crash, leak, timeout or out-of-memory input is kept in <build>/fuzz-findings/<name>/ and the
# script fails; add the input to tests/fuzz/regressions/<name>/ once it is fixed.
#
# Usage: scripts/fuzz.sh [--ci] [--time S] [--runs N] [--jobs J] [--build DIR] [--keep-corpus DIR] [NAME...]
#   --ci          CI's run: 60 s per target, as many targets at once as there are cores
#   --time S      seconds of fuzzing per target (default 60)
#   --runs N      executions per target instead of a time (the long campaign: --runs 10000000)
#   --jobs J      targets run at once (default: 1, --ci: the number of cores)
#   --keep-corpus DIR  keep each target's grown corpus in DIR/<name> (default: a temporary folder)
#   NAME...       targets by name (safetensors, gguf, ...); default all built ones
# Prints one line per target: executions, executions per second, coverage (edges), corpus
# size, and the outcome.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$root/build-sanitize"
time_s=60
runs=""
jobs=1
keep=""
names=()
while [ $# -gt 0 ]; do
  case "$1" in
    --ci) jobs="$(nproc 2>/dev/null || echo 2)"; shift ;;
    --time) time_s="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --build) build="$(cd "$2" && pwd)"; shift 2 ;;
    --keep-corpus) keep="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) names+=("$1"); shift ;;
  esac
done
bin="$build/fuzz"
if [ ${#names[@]} -eq 0 ]; then
  for f in "$bin"/fuzz_*; do [ -x "$f" ] && names+=("$(basename "$f" | sed 's/^fuzz_//')"); done
fi
if [ ${#names[@]} -eq 0 ]; then
  echo "fuzz.sh: no fuzz targets in $bin (build them with scripts/sanitize.sh)"
  exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
findings="$build/fuzz-findings"

# one_target NAME: replay + fuzz; its summary line in $work/NAME.summary, status 1 on a finding
one_target() {
  local n="$1" exe="$bin/fuzz_$1" seeds="$root/tests/fuzz/corpus/$1" regs="$root/tests/fuzz/regressions/$1"
  local corpus="$work/corpus/$n" log="$work/$n.log" out="$findings/$n"
  [ -n "$keep" ] && corpus="$keep/$n"
  mkdir -p "$corpus" "$out"
  if [ ! -x "$exe" ]; then
    echo "fuzz_$n: FAIL (not built: $exe)" >"$work/$n.summary"
    return 1
  fi
  local note=""
  if [ ! -d "$seeds" ] || [ -z "$(ls -A "$seeds" 2>/dev/null)" ]; then
    note=" (warning: no seeds in tests/fuzz/corpus/$n: it starts from nothing)"
    seeds="$work/empty-$n"
    mkdir -p "$seeds"
  fi
  local reg=()
  if [ -d "$regs" ]; then
    while IFS= read -r -d '' f; do reg+=("$f"); done < <(find "$regs" -type f ! -name 'README*' -print0 | sort -z)
  fi
  if [ ${#reg[@]} -gt 0 ] && ! "$exe" -rss_limit_mb=2560 -timeout=25 "${reg[@]}" >"$work/$n.replay.log" 2>&1; then
    echo "fuzz_$n: FAIL (a regression input crashes it again: $(grep -m1 -E 'ERROR|Running' "$work/$n.replay.log" | tail -1))" >"$work/$n.summary"
    cp "$work/$n.replay.log" "$out/"
    return 1
  fi
  local limit=(-max_total_time="$time_s")
  [ -n "$runs" ] && limit=(-runs="$runs")
  "$exe" "${limit[@]}" -rss_limit_mb=2560 -timeout=25 -print_final_stats=1 -artifact_prefix="$out/" "$corpus" "$seeds" >"$log" 2>&1
  local rc=$?
  local execs eps cov units
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  eps=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | awk '{ print $2 }')
  units=$(grep -oE 'corp: [0-9]+' "$log" | tail -1 | awk '{ print $2 }')
  local what="ok"
  if [ "$rc" -ne 0 ]; then
    what="FAIL ($(grep -m1 -E '^==[0-9]+==ERROR|runtime error|fuzz check failed|ERROR: libFuzzer' "$log")); input kept in $out"
    cp "$log" "$out/"
  fi
  echo "fuzz_$n: ${execs:-?} execs, ${eps:-?} exec/s, cov ${cov:-?}, corpus ${units:-?}, ${#reg[@]} regressions replayed: $what$note" >"$work/$n.summary"
  [ "$rc" -eq 0 ]
}

status=0
pids=()
for n in "${names[@]}"; do
  one_target "$n" &
  pids+=("$!")
  if [ ${#pids[@]} -ge "$jobs" ]; then
    wait "${pids[0]}" || status=1
    pids=("${pids[@]:1}")
  fi
done
for p in "${pids[@]}"; do wait "$p" || status=1; done
for n in "${names[@]}"; do cat "$work/$n.summary" 2>/dev/null || echo "fuzz_$n: FAIL (no summary)"; done
exit "$status"
