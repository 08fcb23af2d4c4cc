#!/bin/bash
# --auto-fit end to end with the tiny SD pipeline and two `easel rpc-server`s on 127.0.0.1 as
# accelerators: a sweep over resolutions and --max-vram caps where no auto-fit run fails for
# memory, every run's measured peak per RPC device within 10% of the prediction (and within its
# cap), the image equal to the plain CPU run's (tiled as the plan tiles the VAE decode), the
# printed flags line reproducing the plan when
# passed back explicitly, and `easel plan --auto-fit` printing the plan without running.
# Usage: autofit.sh EASEL_BINARY TEST_DATA_DIR
set -u
easel="$1"
data="$2"
model="$data/reference/sd_tiny/sd_tiny.safetensors"
source "$(dirname "$0")/lib/rpc.bash"
source "$(dirname "$0")/lib/autofit.bash"  # uncapped_need
start_rpc_pair  # $tmp, two rpc-servers ($port0, $port1, $rpc), fails=0
cache="$tmp/cache"

# check_peaks LOG CAPS: every "RPCn predicted measured" row (MiB, printed to 0.1): measured within 10% of predicted,
# and not above the device's cap (MiB; "-" = none) by more than the printing's rounding
check_peaks() {
  local log="$1" cap0="$2" cap1="$3" name="$4"
  local rows
  rows=$(awk '$1 ~ /^RPC[01]/ && NF == 3 && $2 ~ /^[0-9.]+$/ && $3 ~ /^[0-9.]+$/ { print $1, $2, $3 }' "$log")
  if [ -z "$rows" ]; then
    echo "FAIL $name: no measured peak printed for an RPC device"
    return 1
  fi
  local bad
  bad=$(printf '%s\n' "$rows" | awk -v c0="$cap0" -v c1="$cap1" '{
      dev = substr($1, 1, 4); cap = dev == "RPC0" ? c0 : c1;
      if ($3 > $2 * 1.10 || $3 < $2 * 0.90) print "measured " $3 " MiB vs predicted " $2 " MiB on " dev;
      else if (cap != "-" && $3 > cap + 0.05) print "measured " $3 " MiB above the cap " cap " MiB on " dev }')
  if [ -n "$bad" ]; then
    echo "FAIL $name: $bad"
    return 1
  fi
  echo "ok   $name: $(printf '%s\n' "$rows" | awk '{ printf "%s %s/%s MiB  ", substr($1,1,4), $3, $2 }')"
}

# sweep: sizes x caps. The caps are fractions of the job's uncapped need on one device (the
# predicted peak of RPC0 when auto-fit puts everything there), so each size meets plans that
# split, stream or move modules to the CPU.
declare -A on_rpc=()
for size in 64 128 256; do
  job=(-m "$model" -p "a cat" -W "$size" -H "$size" --steps 2 -s 1 -t 1 --cache-dir "$cache")
  "$easel" generate "${job[@]}" --backend cpu -o "$tmp/plain.png" >/dev/null 2>"$tmp/plain.log" ||
    { echo "FAIL plain run at $size: $(tail -1 "$tmp/plain.log")"; fails=$((fails + 1)); continue; }
  uncapped_need "$size" || continue  # $need (MiB)
  for fr in "- -" "0.6 0.6" "0.35 0.35" "0.3 0.8"; do
    set -- $fr
    c0=- c1=- mv=""
    if [ "$1" != "-" ]; then
      c0=$(awk -v n="$need" -v f="$1" 'BEGIN { printf "%.2f", n * f }')
      c1=$(awk -v n="$need" -v f="$2" 'BEGIN { printf "%.2f", n * f }')
      mv="--max-vram RPC0=$(awk -v m="$c0" 'BEGIN { printf "%.6f", m / 1024 }'),RPC1=$(awk -v m="$c1" 'BEGIN { printf "%.6f", m / 1024 }')"
    fi
    name="auto-fit ${size}x${size} caps $c0/$c1 MiB"
    # (--no-cache below: a conditioning-cache hit would skip the text encoder and its peak)
    if ! "$easel" generate "${job[@]}" --no-cache $rpc --auto-fit $mv -o "$tmp/out.png" >"$tmp/out.log" 2>&1; then
      echo "FAIL $name: $(grep -i error "$tmp/out.log" | head -1)"
      fails=$((fails + 1))
      continue
    fi
    flags=$(grep -m1 "^  --backend" "$tmp/out.log")
    # a VAE decode planned tiled is compared with the plain CPU run tiled the same way
    ref="$tmp/plain.png"
    tiling=$(grep -o -- "--vae-tiling --vae-tile-size [0-9]*x[0-9]*" <<<"$flags")
    if [ -n "$tiling" ]; then
      ref="$tmp/plain-tiled.png"
      "$easel" generate "${job[@]}" --backend cpu $tiling -o "$ref" >/dev/null 2>&1 || { echo "FAIL plain run with $tiling"; fails=$((fails + 1)); continue; }
    fi
    if ! cmp -s "$ref" "$tmp/out.png"; then
      # the RPC servers run the CPU backend: the same ops, so the same bytes
      echo "FAIL $name: image differs from the plain CPU run ($flags)"
      fails=$((fails + 1))
      continue
    fi
    cp "$tmp/out.log" "$tmp/last-$size-$c0.log"
    if [ -z "$flags" ]; then
      echo "FAIL $name: no flags line printed"
      fails=$((fails + 1))
    elif [[ "$(sed -E 's/.*--backend "([^"]*)".*/\1/' <<<"$flags")" == *RPC* ]]; then
      on_rpc[$size]=$(( ${on_rpc[$size]:-0} + 1 ))
      check_peaks "$tmp/out.log" "$c0" "$c1" "$name [$flags]" || fails=$((fails + 1))
    else
      echo "ok   $name: everything on the CPU [$flags]"
    fi
  done
done

# a sweep that put every case on the CPU would check no placement: each size must have used the
# two RPC devices in at least one case
for size in 64 128 256; do
  if [ "${on_rpc[$size]:-0}" -eq 0 ]; then
    echo "FAIL auto-fit ${size}x${size}: no case of the sweep placed anything on the RPC devices"
    fails=$((fails + 1))
  else
    echo "ok   auto-fit ${size}x${size}: ${on_rpc[$size]} of 4 cases placed on the RPC devices"
  fi
done

# the printed flags line, passed back explicitly, gives the same plan table
job=(-m "$model" -p "a cat" -W 128 -H 128 --steps 2 -s 1 -t 1 --cache-dir "$cache")
if "$easel" plan "${job[@]}" $rpc --auto-fit --max-vram "RPC0=0.002,RPC1=0.002" >"$tmp/plan.log" 2>&1; then
  line=$(grep -m1 "^  --backend" "$tmp/plan.log")
  eval "args=($line)"
  if "$easel" plan "${job[@]}" $rpc "${args[@]}" >"$tmp/plan2.log" 2>&1 &&
    diff <(sed -n '/^job:/,$p' "$tmp/plan.log" | grep -E "^(te|diffusion|vae) ") <(sed -n '/^job:/,$p' "$tmp/plan2.log" | grep -E "^(te|diffusion|vae) ") >/dev/null &&
    grep -q "^diffusion " "$tmp/plan2.log"; then
    echo "ok   easel plan --auto-fit: the flags line ($line) reproduces the plan"
  else
    echo "FAIL easel plan: the flags line does not reproduce the plan: $(tail -2 "$tmp/plan2.log")"
    fails=$((fails + 1))
  fi
  # the second planning of the same job answers every measurement from the cache
  "$easel" plan "${job[@]}" $rpc --auto-fit --max-vram "RPC0=0.002,RPC1=0.002" >"$tmp/plan3.log" 2>&1
  if grep -q "compute buffers: 0 measured" "$tmp/plan3.log"; then
    echo "ok   measurement cache: $(grep -o 'compute buffers: [^(]*' "$tmp/plan3.log")"
  else
    echo "FAIL measurement cache: $(grep 'compute buffers' "$tmp/plan3.log")"
    fails=$((fails + 1))
  fi
else
  echo "FAIL easel plan --auto-fit: $(tail -2 "$tmp/plan.log")"
  fails=$((fails + 1))
fi

# the disk tier chosen by itself: the UNet pinned to RPC0 (te and vae to RPC1), RPC0 capped below
# the UNet whole (0.75 and 0.6 of its one-graph need) and the host RAM (--max-vram CPU=GiB, what
# auto-fit takes as the RAM budget instead of MemAvailable) below its weights (0.5, 0.35). Whole
# on RPC0 does not fit (tier 2), streaming holds every weight in RAM (tier 3), one device (no
# tier 4), so tier 5: --max-vram segments read from the file per evaluation through one host
# buffer of a segment, which must be within the RAM budget. The image equals the plain CPU run's;
# RPC0's measured peak is within 10% of the prediction and under the cap.
job=(-m "$model" -p "a cat" -W 64 -H 64 --steps 2 -s 1 -t 1 --cache-dir "$cache")
pin=(--backend "te=RPC1,diffusion=RPC0,vae=RPC1")
if "$easel" generate "${job[@]}" --backend cpu -o "$tmp/plain64.png" >/dev/null 2>&1 &&
  "$easel" plan "${job[@]}" $rpc "${pin[@]}" >"$tmp/unet.log" 2>&1; then
  # the UNet's row of the table: params = $4, total = $8 (MiB)
  read -r uparams utotal < <(awk '$1 == "diffusion" && $2 ~ /^RPC0/ { print $4, $8; exit }' "$tmp/unet.log")
  for fr in "0.75 0.5" "0.6 0.35"; do
    set -- $fr
    c0=$(awk -v n="$utotal" -v f="$1" 'BEGIN { printf "%.2f", n * f }')
    ramf=$2
    ram=$(awk -v n="$uparams" -v f="$ramf" 'BEGIN { printf "%.2f", n * f }')
    name="disk tier: UNet ${utotal} MiB whole, RPC0 cap $c0 MiB, host RAM $ram MiB"
    mv="RPC0=$(awk -v m="$c0" 'BEGIN { printf "%.6f", m / 1024 }'),CPU=$(awk -v m="$ram" 'BEGIN { printf "%.6f", m / 1024 }')"
    if ! "$easel" generate "${job[@]}" --no-cache $rpc --auto-fit "${pin[@]}" --max-vram "$mv" -o "$tmp/disk.png" >"$tmp/disk.log" 2>&1; then
      echo "FAIL $name: $(grep -i error "$tmp/disk.log" | head -1)"
      fails=$((fails + 1))
      continue
    fi
    flags=$(grep -m1 "^  --backend" "$tmp/disk.log")
    host=$(awk '$1 == "diffusion" && $2 ~ /^RPC0/ { print $NF; exit }' "$tmp/disk.log")
    if ! grep -q "diffusion: tier 5 (disk): on RPC0, weights read from disk per evaluation" "$tmp/disk.log" || [[ "$flags" != *diffusion=disk* ]]; then
      echo "FAIL $name: the disk tier was not chosen ($flags)"
      fails=$((fails + 1))
    elif awk -v h="$host" -v r="$ram" 'BEGIN { exit !(h > r) }'; then
      echo "FAIL $name: the plan holds a $host MiB host buffer over the RAM budget"
      fails=$((fails + 1))
    elif ! cmp -s "$tmp/plain64.png" "$tmp/disk.png"; then
      echo "FAIL $name: image differs from the plain CPU run ($flags)"
      fails=$((fails + 1))
    else
      check_peaks "$tmp/disk.log" "$c0" - "$name, host buffer $host MiB [$flags]" || fails=$((fails + 1))
    fi
  done
else
  echo "FAIL disk tier: the plain run or the pinned plan failed: $(tail -1 "$tmp/unet.log")"
  fails=$((fails + 1))
fi

# nothing fits: one error line naming the shortfall and a change
out=$("$easel" plan "${job[@]}" $rpc --auto-fit --backend "te=RPC0,diffusion=RPC0,vae=RPC0" --max-vram "RPC0=0.0005" 2>&1 >/dev/null | grep -v -i connection)
if [ "$(printf '%s\n' "$out" | grep -c .)" -eq 1 ] && [[ "$out" == *"nothing fits"* ]] && [[ "$out" == *"short"* ]] && [[ "$out" == *"cheapest change"* ]]; then
  echo "ok   nothing fits: $out"
else
  echo "FAIL nothing fits: $out"
  fails=$((fails + 1))
fi

# explicit entries are kept: --params-backend diffusion=cpu names the default device of this
# GPU-less machine (the spec clears it for the runtime), yet auto-fit may run the UNet on an RPC
# device, where it means weights in host RAM: the flags must keep it (before: dropped, the UNet
# whole on RPC0), uncapped and with caps; the run gives the plain CPU run's PNG
job=(-m "$model" -p "a cat" -W 64 -H 64 --steps 2 -s 1 -t 1 --cache-dir "$cache")
for mv in "" "--max-vram 0.002"; do
  name="--params-backend diffusion=cpu kept${mv:+ ($mv)}"
  if "$easel" generate "${job[@]}" --no-cache $rpc --auto-fit --params-backend diffusion=cpu $mv -o "$tmp/pin.png" >"$tmp/pin.log" 2>&1; then
    flags=$(grep -m1 "^  --backend" "$tmp/pin.log")
    if ! grep -q -- '--params-backend "[^"]*diffusion=CPU' <<<"$flags"; then
      echo "FAIL $name: the flags line drops it ($flags)"
      fails=$((fails + 1))
    elif ! cmp -s "$tmp/plain64.png" "$tmp/pin.png"; then
      echo "FAIL $name: image differs from the plain CPU run ($flags)"
      fails=$((fails + 1))
    else
      echo "ok   $name: $flags"
    fi
  else
    echo "FAIL $name: $(grep -i error "$tmp/pin.log" | head -1)"
    fails=$((fails + 1))
  fi
done

# a device list longer than the module's blocks (the tiny CLIP te has 2 layers): the error names
# the blocks, not a memory shortfall (before: "nothing fits te: no device can run it; try a
# quantised --type")
out=$("$easel" plan "${job[@]}" $rpc --auto-fit --backend "te=RPC0&RPC1&CPU" 2>&1 >/dev/null | grep -i error)
if [[ "$out" == *"block(s) to split"* ]] && [[ "$out" != *"nothing fits"* ]]; then
  echo "ok   too many devices for te: $out"
else
  echo "FAIL too many devices for te: $out"
  fails=$((fails + 1))
fi

# easel plan --auto-fit prints the plan table once (before: the auto-fit report's table and the
# plan's, the same rows twice)
"$easel" plan "${job[@]}" $rpc --auto-fit >"$tmp/once.log" 2>&1
n=$(grep -c "^module  *device  *blocks" "$tmp/once.log")
rows=$(grep -c "^diffusion  *RPC" "$tmp/once.log")
if [ "$n" = 1 ] && [ "$rows" -ge 1 ]; then
  echo "ok   easel plan --auto-fit prints the plan table once"
else
  echo "FAIL easel plan --auto-fit prints $n plan tables ($rows diffusion rows)"
  fails=$((fails + 1))
fi

# after a placed run each stage's line gives its own module's parameters, as its plan table (before:
# 0.0 MiB for every placed te / diffusion module, and the closing line named one device with the
# VAE's parameters), and the closing memory line the measured peak per device
"$easel" generate "${job[@]}" --no-cache $rpc --backend "te=RPC0,diffusion=RPC0&RPC1,vae=RPC1" -o "$tmp/sum.png" >"$tmp/sum.log" 2>&1
for m in te diffusion vae; do
  planned=$(awk -v m="$m" '/^placement plan for the / { on = ($5 == m); if (on) s = 0; next }
                           on && $1 == m && NF >= 10 { s += $4 } END { printf "%.1f", s }' "$tmp/sum.log")
  stated=$(grep -o "; $m parameters [0-9.]* MiB" "$tmp/sum.log" | tail -1 | awk '{ print $4 }')
  if [ -n "$stated" ] && awk -v a="$planned" -v b="$stated" 'BEGIN { exit !(b > 0 && a - b < 0.15 && b - a < 0.15) }'; then
    echo "ok   stage line of $m: parameters $stated MiB = its plan's $planned MiB"
  else
    echo "FAIL stage line of $m: parameters '${stated}' MiB, its plan's $planned MiB"
    fails=$((fails + 1))
  fi
done
if grep -q "measured peak per device: RPC0[^,]* [0-9.]* MiB, RPC1" "$tmp/sum.log"; then
  echo "ok   closing memory line: $(grep -o 'measured peak per device: [^;]*' "$tmp/sum.log")"
else
  echo "FAIL closing memory line: $(grep '^.*memory' "$tmp/sum.log" | tail -1)"
  fails=$((fails + 1))
fi

[ "$fails" -eq 0 ] && echo "all auto-fit checks passed" || echo "$fails auto-fit checks failed"
[ "$fails" -eq 0 ]
