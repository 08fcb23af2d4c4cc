#!/bin/bash
# TAESD (--taesd) under placement flags, end to end with the demo SD model and two
# `easel rpc-server`s on 127.0.0.1: with --backend vae=RPC0 the TAESD decoder
# is the plan's vae row (TAESD label, on RPC0), the decode's PNG equals the plain CPU run's, and
# the peak printed on RPC0 after the decode is within 10% of the prediction; with
# --backend "vae=RPC0&RPC1" one warning line says TAESD runs whole on RPC0, the PNG is the same,
# and `easel plan` shows a single vae row on RPC0; FLUX.2 Klein (tests/data/reference/klein_tiny)
# with the TAEF2 decoder under "vae=RPC0&RPC1": the same.
# Usage: placement_taesd.sh EASEL_BINARY TEST_DATA_DIR
set -u
easel="$1"
data="$2"
src="$(cd "$(dirname "$0")/../.." && pwd)"
model="$src/models/demo/easel-demo-shapes.safetensors"
taesd="$data/reference/autoencoder_tiny_taesd_tiny.safetensors"
source "$(dirname "$0")/lib/rpc.bash"
source "$(dirname "$0")/lib/placement.bash"  # require_different, generate_same_png, check_peaks
# two rpc-servers (lib/rpc.bash); $tmp, $rpc, fails=0
start_rpc_pair
job=(-m "$model" --taesd "$taesd" -p "a cat" --steps 2 -s 1 -t 1 --no-cache -W 128 -H 128)

"$easel" generate "${job[@]}" -o "$tmp/plain.png" >/dev/null 2>"$tmp/plain.log" || { echo "FAIL plain CPU run: $(tail -1 "$tmp/plain.log")"; exit 1; }
# the full VAE's image differs: a TAESD run that silently used the AutoencoderKL would fail
"$easel" generate "${job[@]:0:2}" "${job[@]:4}" -o "$tmp/kl.png" >/dev/null 2>&1 || { echo "FAIL plain AutoencoderKL run"; exit 1; }
require_different "$tmp/plain.png" "$tmp/kl.png" "the TAESD run gives the AutoencoderKL's image: the checks would prove nothing"

# taesd_run NAME WARN(yes|no) FLAGS...
taesd_run() {
  local name="$1" want_warn="$2"
  shift 2
  generate_same_png "$name" "$ref" "$@" || return
  if ! grep -Eq "^vae +RPC0 " "$tmp/out.log" || ! grep -q "TAESD decoder .*: 1 segment(s)" "$tmp/out.log"; then
    echo "FAIL $name: the plan table has no TAESD vae row on RPC0"
    fails=$((fails + 1))
    return
  fi
  if ! grep -q "stage decode: .*(placed on RPC0)" "$tmp/out.log"; then
    echo "FAIL $name: the decode stage line does not name RPC0: $(grep 'stage decode' "$tmp/out.log")"
    fails=$((fails + 1))
    return
  fi
  local nwarn
  nwarn=$(grep -c "TAESD runs whole on RPC0: it is too small to split" "$tmp/out.log")
  if { [ "$want_warn" = yes ] && [ "$nwarn" -ne 1 ]; } || { [ "$want_warn" = no ] && [ "$nwarn" -ne 0 ]; }; then
    echo "FAIL $name: $nwarn 'TAESD runs whole on RPC0' warning line(s), expected $([ "$want_warn" = yes ] && echo 1 || echo 0)"
    fails=$((fails + 1))
    return
  fi
  # RPC0's peak after the decode within 10% of the prediction
  check_peaks "$tmp/out.log" decode '^RPC0$' - "$name (same PNG)" measured || fails=$((fails + 1))
}

ref="$tmp/plain.png"
taesd_run "--taesd, --backend vae=RPC0" no --backend vae=RPC0
taesd_run "--taesd, --backend vae=RPC0&RPC1 (warned, runs whole on RPC0)" yes --backend "vae=RPC0&RPC1"

# easel plan: one vae row, on RPC0, labelled TAESD, and the warning
if "$easel" plan "${job[@]}" $rpc --backend "vae=RPC0&RPC1" >"$tmp/plan.log" 2>&1 &&
  [ "$(grep -Ec "^vae +RPC" "$tmp/plan.log")" -eq 1 ] && grep -Eq "^vae +RPC0 " "$tmp/plan.log" &&
  grep -q "TAESD decoder" "$tmp/plan.log" && grep -q "TAESD runs whole on RPC0: it is too small to split" "$tmp/plan.log"; then
  echo "ok   easel plan --taesd: one TAESD vae row on RPC0 and the warning"
else
  echo "FAIL easel plan --taesd: $(grep -E "^vae|TAESD|error" "$tmp/plan.log" | head -3)"
  fails=$((fails + 1))
fi

# FLUX.2 Klein with the TAEF2 decoder (32-channel latent 2h x 2w): the same checks under a layer-split list
job=(-m "$data/reference/klein_tiny/diffusers" --taesd "$data/reference/autoencoder_tiny_taef2_decoder.safetensors"
  -p "a red cat" -W 64 -H 48 --steps 2 -s 1 -t 1 --no-cache)
if "$easel" generate "${job[@]}" -o "$tmp/klein.png" >/dev/null 2>"$tmp/klein.log"; then
  ref="$tmp/klein.png"
  taesd_run "FLUX.2 Klein --taesd TAEF2, --backend vae=RPC0&RPC1 (warned, runs whole on RPC0)" yes --backend "vae=RPC0&RPC1"
else
  echo "FAIL plain FLUX.2 Klein TAEF2 run: $(tail -1 "$tmp/klein.log")"
  fails=$((fails + 1))
fi

[ "$fails" -eq 0 ] && echo "all TAESD placement checks passed" || echo "$fails TAESD placement checks failed"
[ "$fails" -eq 0 ]
