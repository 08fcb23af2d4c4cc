#!/bin/bash
# issue 9: "No run planned by auto-fit fails for memory: a sweep over resolutions and budgets on
# RPC devices with caps in CI", beyond the 64-256 px sides of autofit.sh: `easel generate
# --auto-fit` with the tiny Z-Image pipeline (the cheapest tiny pipeline whose VAE decoder runs
# under a plan and can be tiled: a 2-layer DiT) and two `easel rpc-server`s capped at a fraction
# of the job's uncapped need, so that the plan tiles the VAE decode and cuts modules into
# segments. Each run must complete, and every RPC device's measured peak must be within 10% of
# the prediction and under its cap. Sizes up to AUTOFIT_SWEEP_COMPARE_MAX (default 256: none of
# the default sizes; a 512 px CPU reference costs 2-3 times the run) are also compared with the
# plain CPU run tiled the same way (the RPC servers run the CPU backend: the same bytes;
# autofit.sh compares the tiled runs up to 256 px).
# The sizes are chosen by their cost on the 2-core CI machine (one step; docs/placement.md
# "Tests" gives the measured times: the tiled VAE decode on a one-thread rpc-server is most of
# it); set AUTOFIT_SWEEP_SIZES to run others (e.g. "512 1024 2048" by hand).
# Usage: autofit_sweep.sh EASEL_BINARY TEST_DATA_DIR
set -u
easel="$1"
data="$2"
model="$data/reference/zimage_tiny/diffusers"
source "$(dirname "$0")/lib/rpc.bash"
start_rpc_pair 62000  # $tmp, two rpc-servers ($port0, $port1, $rpc), fails=0
cache="$tmp/cache"
sizes="${AUTOFIT_SWEEP_SIZES:-512}"
# the fraction of the uncapped need each RPC device gets
fraction="${AUTOFIT_SWEEP_FRACTION:-0.3}"
compare_max="${AUTOFIT_SWEEP_COMPARE_MAX:-256}"

# check_peaks LOG CAP NAME: every "RPCn predicted measured" row (MiB, printed to 0.1) within 10%
# of the prediction and not above CAP (MiB) by more than the printing's rounding
check_peaks() {
  local log="$1" cap="$2" name="$3" rows bad
  rows=$(awk '$1 ~ /^RPC[01]/ && NF == 3 && $2 ~ /^[0-9.]+$/ && $3 ~ /^[0-9.]+$/ { print $1, $2, $3 }' "$log")
  if [ -z "$rows" ]; then
    echo "FAIL $name: no measured peak printed for an RPC device"
    return 1
  fi
  bad=$(printf '%s\n' "$rows" | awk -v cap="$cap" '{
      if ($3 > $2 * 1.10 || $3 < $2 * 0.90) print "measured " $3 " MiB vs predicted " $2 " MiB on " substr($1, 1, 4);
      else if ($3 > cap + 0.05) print "measured " $3 " MiB above the cap " cap " MiB on " substr($1, 1, 4) }')
  if [ -n "$bad" ]; then
    echo "FAIL $name: $bad"
    return 1
  fi
  echo "ok   $name: $(printf '%s\n' "$rows" | awk '{ printf "%s %s/%s MiB  ", substr($1,1,4), $3, $2 }')"
}

for size in $sizes; do
  job=(-m "$model" -p "a cat" -W "$size" -H "$size" --steps 1 -s 1 -t 2 --cache-dir "$cache")
  "$easel" plan "${job[@]}" $rpc --auto-fit >"$tmp/need.log" 2>&1
  need=$(awk '$1 ~ /^RPC[01]/ && NF == 2 && $2 > n { n = $2 } END { if (n) print n }' "$tmp/need.log")
  if [ -z "$need" ]; then
    echo "FAIL uncapped plan at $size: $(tail -1 "$tmp/need.log")"
    fails=$((fails + 1))
    continue
  fi
  cap=$(awk -v n="$need" -v f="$fraction" 'BEGIN { printf "%.2f", n * f }')
  mv="RPC0=$(awk -v m="$cap" 'BEGIN { printf "%.6f", m / 1024 }'),RPC1=$(awk -v m="$cap" 'BEGIN { printf "%.6f", m / 1024 }')"
  name="auto-fit ${size}x${size}, RPC caps $cap MiB ($fraction of $need)"
  t0=$(date +%s.%N)
  if ! "$easel" generate "${job[@]}" $rpc --auto-fit --max-vram "$mv" -o "$tmp/out.png" >"$tmp/out.log" 2>&1; then
    echo "FAIL $name: $(grep -i error "$tmp/out.log" | head -1)"
    fails=$((fails + 1))
    continue
  fi
  secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  flags=$(grep -m1 "^  --backend" "$tmp/out.log")
  check_peaks "$tmp/out.log" "$cap" "$name, ${secs} s [$flags]" || fails=$((fails + 1))
  if [ "$size" -le "$compare_max" ]; then
    # the plain CPU run, its VAE tiled as the plan tiles it
    tiling=$(grep -o -- "--vae-tiling --vae-tile-size [0-9]*x[0-9]*" <<<"$flags")
    if "$easel" generate "${job[@]}" --backend cpu $tiling -o "$tmp/plain.png" >/dev/null 2>&1 && cmp -s "$tmp/plain.png" "$tmp/out.png"; then
      echo "ok   $name: the image equals the plain CPU run's${tiling:+ ($tiling)}"
    else
      echo "FAIL $name: the image differs from the plain CPU run${tiling:+ ($tiling)}"
      fails=$((fails + 1))
    fi
  fi
done

[ "$fails" -eq 0 ] && echo "all auto-fit sweep checks passed" || echo "$fails auto-fit sweep checks failed"
[ "$fails" -eq 0 ]
