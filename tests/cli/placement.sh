#!/bin/bash
# Placement flags end to end with the tiny SD pipeline and two `easel rpc-server`s on 127.0.0.1
# as extra devices: a layer split, weights in RAM (staged, streamed under a --max-vram cap,
# --max-vram segments) and on disk each give the same PNG as the plain CPU run, the measured
# peak per device stays within its cap, `easel plan` prints the table, and bad flags stop with
# one line. Usage: placement.sh EASEL_BINARY TEST_DATA_DIR
set -u
easel="$1"
data="$2"
model="$data/reference/sd_tiny/sd_tiny.safetensors"
source "$(dirname "$0")/lib/rpc.bash"
start_rpc_pair  # $tmp, two rpc-servers ($port0, $port1, $rpc), fails=0
job=(-m "$model" -p "a cat" -W 64 -H 64 --steps 3 -s 1 -t 1 --no-cache)

"$easel" generate "${job[@]}" -o "$tmp/plain.png" >/dev/null 2>"$tmp/plain.log" || { echo "FAIL plain run: $(tail -1 "$tmp/plain.log")"; exit 1; }

# same_image NAME CAP_MIB(or -) FLAGS...: same PNG bytes as the plain run; RPC0's measured peak <= CAP
same_image() {
  local name="$1" cap="$2"
  shift 2
  if ! "$easel" generate "${job[@]}" $rpc "$@" -o "$tmp/out.png" >"$tmp/out.log" 2>&1; then
    echo "FAIL $name: $(grep error "$tmp/out.log" | head -1)"
    fails=$((fails + 1))
    return
  fi
  if ! cmp -s "$tmp/plain.png" "$tmp/out.png"; then
    echo "FAIL $name: image differs from the plain CPU run"
    fails=$((fails + 1))
    return
  fi
  local peak
  peak=$(awk '$1 == "RPC0" && NF == 3 { print $3 }' "$tmp/out.log" | tail -1)
  if [ -z "$peak" ]; then
    echo "FAIL $name: no measured peak printed for RPC0"
    fails=$((fails + 1))
    return
  fi
  if [ "$cap" != "-" ] && awk -v p="$peak" -v c="$cap" 'BEGIN { exit !(p > c) }'; then
    echo "FAIL $name: measured peak $peak MiB on RPC0 above the cap $cap MiB"
    fails=$((fails + 1))
    return
  fi
  echo "ok   $name (RPC0 peak $peak MiB)"
}

same_image "layer split diffusion=RPC0&RPC1" - --backend "diffusion=RPC0&RPC1"
same_image "layer split over three devices" - --backend "diffusion=RPC0&CPU&RPC1"
same_image "--params-backend cpu (staged)" - --backend diffusion=RPC0 --params-backend cpu
same_image "--params-backend disk" - --backend diffusion=RPC0 --params-backend disk

# --split-mode row: the UNet's transformer blocks on ggml's meta device over RPC0 & RPC1. The
# partial sums are reordered, so the image is not bitwise the plain one: the final latents are
# compared instead, with F32 weights (--type f32; with sd_tiny's F16 weights ggml rounds every
# matmul input to F16 and a 1e-7 reordering can flip one rounding). The UNet output differs by
# ~6e-7 (tests/unit/row_split_test.cpp); three euler steps scale it by sigma (up to ~15):
# measured 1.0e-4 on the latent.
row_job=(-m "$model" -p "a cat" -W 64 -H 64 --steps 3 -s 1 -t 1 --no-cache --type f32)
if "$easel" generate "${row_job[@]}" -o "$tmp/plain32.png" --save-latent "$tmp/plain32.st" >/dev/null 2>&1 &&
  "$easel" generate "${row_job[@]}" $rpc --backend "diffusion=RPC0&RPC1" --split-mode row -o "$tmp/row.png" \
    --save-latent "$tmp/row.st" >"$tmp/row.log" 2>&1; then
  d=$(python3 - "$tmp/plain32.st" "$tmp/row.st" <<'PY'
import json, struct, sys
def load(p):
    b = open(p, 'rb').read()
    n = struct.unpack('<Q', b[:8])[0]
    h = json.loads(b[8:8 + n])
    out = {}
    for k, v in h.items():
        if k != '__metadata__' and v['dtype'] == 'F32':
            s, e = v['data_offsets']
            out[k] = struct.unpack('<%df' % ((e - s) // 4), b[8 + n + s:8 + n + e])
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
print(max(max(abs(x - y) for x, y in zip(a[k], b[k])) for k in a) if a and a.keys() == b.keys() else 'mismatch')
PY
)
  over=$(awk '$1 ~ /^RPC[01]$/ && NF == 3 && $3 > $2 + 0.1 { print $1 }' "$tmp/row.log")
  if ! grep -q "row split over 2 devices" "$tmp/row.log"; then
    echo "FAIL --split-mode row: the plan is not a row split: $(grep -i 'split' "$tmp/row.log" | head -1)"
    fails=$((fails + 1))
  elif [ "$d" = mismatch ] || awk -v d="$d" 'BEGIN { exit !(d > 1e-3) }'; then
    echo "FAIL --split-mode row: final latent differs from the plain run by $d"
    fails=$((fails + 1))
  elif [ -n "$over" ]; then
    echo "FAIL --split-mode row: measured peak above the prediction on $over"
    fails=$((fails + 1))
  else
    echo "ok   --split-mode row diffusion=RPC0&RPC1 (latent max abs diff $d)"
  fi
else
  echo "FAIL --split-mode row: $(grep error "$tmp/row.log" | head -1)"
  fails=$((fails + 1))
fi
# 1.74 / 1.84 MiB: below the 2.6 MiB the UNet needs whole (2.2 MiB of weights)
same_image "streamed under --max-vram RPC0=0.0017" 1.74 --backend diffusion=RPC0 --params-backend diffusion=cpu --stream-layers --max-vram RPC0=0.0017
same_image "--max-vram segments RPC0=0.0018" 1.84 --backend diffusion=RPC0 --params-backend diffusion=cpu --max-vram RPC0=0.0018

# easel plan: the table without running
if "$easel" plan "${job[@]}" $rpc --backend "diffusion=RPC0&RPC1" >"$tmp/plan.log" 2>&1 &&
  grep -q "^diffusion  RPC0" "$tmp/plan.log" && grep -q "^diffusion  RPC1" "$tmp/plan.log"; then
  echo "ok   easel plan prints a row per device"
else
  echo "FAIL easel plan: $(tail -2 "$tmp/plan.log")"
  fails=$((fails + 1))
fi

# expect_error NAME PATTERN FLAGS...: exit 1, one line "error: ...PATTERN..."
expect_error() {
  local name="$1" pattern="$2"
  shift 2
  err=$("$easel" generate "${job[@]}" $rpc -o "$tmp/bad.png" "$@" 2>&1 >/dev/null)
  rc=$?
  err=$(printf '%s\n' "$err" | grep -v -i "connection")
  lines=$(printf '%s\n' "$err" | grep -c .)
  if [ "$rc" -ne 1 ] || [ "$lines" -ne 1 ] || [[ "$err" != "error: "* ]] || [[ "$err" != *"$pattern"* ]] || [ -e "$tmp/bad.png" ]; then
    echo "FAIL $name: exit $rc, $lines lines: $err"
    fails=$((fails + 1))
  else
    echo "ok   $name: $err"
  fi
}
expect_error "unknown device" "unknown device 'cuda9'" --backend diffusion=cuda9
expect_error "disk as a compute device" "parameter location" --backend disk
expect_error "too small a cap" "diffusion needs" --backend diffusion=RPC0 --max-vram RPC0=0.001
expect_error "device list in --params-backend" "device list" --params-backend "diffusion=RPC0&RPC1"

[ "$fails" -eq 0 ] && echo "all placement checks passed" || echo "$fails placement checks failed"
[ "$fails" -eq 0 ]
