#!/bin/bash
# Placement of the FLUX families end to end: `easel generate` with the tiny FluxPipeline
# (FLUX.1 dev: T5 + CLIP-L text encoders, FLUX.1 DiT) and the tiny Flux2KleinPipeline (Qwen3
# text encoder, FLUX.2 DiT) from tests/data/reference/{flux1_tiny,klein_tiny}, with two
# `easel rpc-server`s on 127.0.0.1 as extra devices: a layer split of the DiT (its double- and
# single-stream blocks form one sequence) and of the text encoders, the VAE decoder on an RPC
# device, weights in RAM (staged;
# streamed and as --max-vram segments under a cap) and on disk each give
# the same PNG bytes as the plain CPU run; every device's measured peak stays within its cap and
# within 10% of the plan's prediction; `easel plan` prints the te and diffusion rows.
# (--split-mode row is checked numerically in tests/unit/placement_flux_test.cpp: its partial
# sums are added in another order, so the bytes of an F16 image may differ.)
# Usage: placement_flux.sh EASEL_BINARY TEST_DATA_DIR
set -u
easel="$1"
data="$2"
source "$(dirname "$0")/lib/rpc.bash"
start_rpc_pair  # $tmp, two rpc-servers ($port0, $port1, $rpc), fails=0

# same_image NAME DEVICE CAP_MIB(or -) FLAGS...: same PNG bytes as the family's plain run; for
# every device in the measured-peak table: predicted * 0.9 <= measured <= predicted * 1.1;
# DEVICE's measured peak <= CAP
same_image() {
  local name="$1" dev="$2" cap="$3"
  shift 3
  if ! "$easel" generate "${job[@]}" $rpc "$@" -o "$tmp/out.png" >"$tmp/out.log" 2>&1; then
    echo "FAIL $fam $name: $(grep -i error "$tmp/out.log" | head -1)"
    fails=$((fails + 1))
    return
  fi
  if ! cmp -s "$tmp/plain.png" "$tmp/out.png"; then
    echo "FAIL $fam $name: image differs from the plain CPU run"
    fails=$((fails + 1))
    return
  fi
  local table peak off
  table=$(awk '/measured beside the plan/ { on = 1; next } on && $1 == "device" { next } on && NF == 3 { print; next } { on = 0 }' "$tmp/out.log")
  peak=$(printf '%s\n' "$table" | awk -v d="$dev" '$1 == d { print $3 }' | tail -1)
  if [ -z "$peak" ]; then
    echo "FAIL $fam $name: no measured peak printed for $dev"
    fails=$((fails + 1))
    return
  fi
  if [ "$cap" != "-" ] && awk -v p="$peak" -v c="$cap" 'BEGIN { exit !(p > c) }'; then
    echo "FAIL $fam $name: measured peak $peak MiB on $dev above the cap $cap MiB"
    fails=$((fails + 1))
    return
  fi
  off=$(printf '%s\n' "$table" | awk '$2 > 0 && ($3 > $2 * 1.1 || $3 < $2 * 0.9) { printf "%s predicted %s measured %s; ", $1, $2, $3 }')
  if [ -n "$off" ]; then
    echo "FAIL $fam $name: measured peak not within 10% of the prediction: $off"
    fails=$((fails + 1))
    return
  fi
  echo "ok   $fam $name ($(printf '%s\n' "$table" | awk '{ printf "%s %s/%s MiB  ", $1, $3, $2 }'))"
}

for fam in flux1 klein; do
  if [ "$fam" = flux1 ]; then
    job=(-m "$data/reference/flux1_tiny/diffusers" -p "a red cat" -W 64 -H 48 --steps 2 -s 1 -t 1 --no-cache)
  else
    job=(-m "$data/reference/klein_tiny/diffusers" -p "a red cat" -W 64 -H 48 --steps 2 -s 1 -t 1 --no-cache)
  fi
  if ! "$easel" generate "${job[@]}" -o "$tmp/plain.png" >/dev/null 2>"$tmp/plain.log"; then
    echo "FAIL $fam plain run: $(tail -1 "$tmp/plain.log")"
    fails=$((fails + 1))
    continue
  fi
  same_image "diffusion=RPC0&RPC1 (layer split), vae=RPC1" RPC0 - --backend "diffusion=RPC0&RPC1,vae=RPC1"
  same_image "te=RPC0&RPC1 (text encoder layer split)" RPC1 - --backend "te=RPC0&RPC1"
  same_image "--params-backend cpu (staged)" RPC0 - --backend RPC0 --params-backend cpu
  same_image "--params-backend disk" RPC1 - --backend RPC1 --params-backend disk
  # weights in RAM on RPC0, streamed and as segments, under a --max-vram cap: the plan's
  # prediction for the mode (what `easel plan` prints). The tiny DiTs' weights (0.2 MiB) are
  # small beside the compute buffer of the 512-token context (2.6 MiB, as large for one block as
  # for all), so no cap below the whole model holds two streaming slots beside it
  # (per-evaluation uploads are covered by tests/cli/placement.sh with the SD UNet)
  for mode in "--stream-layers" ""; do
    need=$("$easel" plan "${job[@]}" $rpc --backend diffusion=RPC0 --params-backend diffusion=cpu $mode 2>/dev/null |
      awk '$1 == "diffusion" && $2 == "RPC0" { print $8 }')
    if [ -z "$need" ]; then
      echo "FAIL $fam plan for ${mode:-segments}: no diffusion row for RPC0"
      fails=$((fails + 1))
      continue
    fi
    cap=$(awk -v m="$need" 'BEGIN { printf "%.2f", m + 0.1 }')  # the table rounds to 0.1 MiB
    same_image "weights in RAM ${mode:---max-vram segments} under --max-vram RPC0=$cap MiB" RPC0 "$cap" --backend diffusion=RPC0 \
      --params-backend diffusion=cpu $mode --max-vram RPC0=$(awk -v m="$cap" 'BEGIN { printf "%.6f", m / 1024 }')
  done
  if "$easel" plan "${job[@]}" $rpc --backend "te=RPC1,diffusion=RPC0&RPC1" >"$tmp/plan.log" 2>&1 &&
    grep -q "^te         RPC1" "$tmp/plan.log" && grep -q "^diffusion  RPC0" "$tmp/plan.log" && grep -q "^diffusion  RPC1" "$tmp/plan.log"; then
    echo "ok   $fam easel plan prints te and diffusion rows"
  else
    echo "FAIL $fam easel plan: $(tail -3 "$tmp/plan.log")"
    fails=$((fails + 1))
  fi
done

[ "$fails" -eq 0 ] && echo "all FLUX placement checks passed" || echo "$fails FLUX placement checks failed"
[ "$fails" -eq 0 ]
