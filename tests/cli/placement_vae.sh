#!/bin/bash
# The VAE decoder under placement flags, end to end with the tiny SD pipeline and two
# `easel rpc-server`s on 127.0.0.1 as extra devices: a layer split (--backend "vae=RPC0&RPC1"),
# weights in RAM (--params-backend vae=cpu) and on disk (vae=disk), tiled decodes, and a
# --max-vram cap that cuts a tile's decode into segments uploaded per evaluation each give the
# PNG of the plain CPU run (with the same --vae-tiling), with each RPC device's measured peak
# within 10% of the prediction and within its cap; --auto-fit on a job whose decode only fits
# tiled plans the tiling up front (the tile size in the flags line), and the run then succeeds
# under the cap; a decode that cannot fit stops with one line suggesting --vae-tiling.
# Usage: placement_vae.sh EASEL_BINARY TEST_DATA_DIR
set -u
easel="$1"
data="$2"
model="$data/reference/sd_tiny/sd_tiny.safetensors"
source "$(dirname "$0")/lib/rpc.bash"
source "$(dirname "$0")/lib/placement.bash"  # require_different, generate_same_png, cap_at, check_peaks
start_rpc_pair  # $tmp, two rpc-servers ($port0, $port1, $rpc), fails=0
job=(-m "$model" -p "a cat" -W 128 -H 128 --steps 2 -s 1 -t 1 --no-cache)

"$easel" generate "${job[@]}" -o "$tmp/plain.png" >/dev/null 2>"$tmp/plain.log" || { echo "FAIL plain run: $(tail -1 "$tmp/plain.log")"; exit 1; }
for t in 4 8; do
  "$easel" generate "${job[@]}" --vae-tiling --vae-tile-size ${t}x$t -o "$tmp/plain-t$t.png" >/dev/null 2>&1 ||
    { echo "FAIL plain tiled run ($t)"; exit 1; }
done
require_different "$tmp/plain.png" "$tmp/plain-t8.png" "the tiled decode gives the untiled image: the tiled cases would prove nothing"

# same_image NAME REFERENCE CAP FLAGS...: the PNG equals REFERENCE, every RPC device's peak after
# the decode within 10% of the prediction and not above CAP (MiB or -)
same_image() {
  local name="$1" ref="$2" cap="$3"
  shift 3
  generate_same_png "$name" "$ref" "$@" || return
  check_peaks "$tmp/out.log" decode '^RPC[01]' "$cap" "$name" || fails=$((fails + 1))
}

# vae_need FLAGS...: the vae row's predicted total (MiB) of `easel plan`
vae_need() { "$easel" plan "${job[@]}" $rpc "$@" 2>/dev/null | awk '$1 == "vae" { print $(NF - 2); exit }'; }

same_image "layer split vae=RPC0&RPC1" "$tmp/plain.png" - --backend "vae=RPC0&RPC1"
same_image "--params-backend vae=cpu (staged)" "$tmp/plain.png" - --backend vae=RPC0 --params-backend vae=cpu
same_image "--params-backend vae=disk" "$tmp/plain.png" - --backend vae=RPC1 --params-backend vae=disk
same_image "tiled 8x8, layer split vae=RPC1&RPC0" "$tmp/plain-t8.png" - --backend "vae=RPC1&RPC0" --vae-tiling --vae-tile-size 8x8

# a cap below a 4x4 tile's need with the weights in RAM: --max-vram segments uploaded per tile
need=$(vae_need --backend vae=RPC0 --params-backend vae=cpu --vae-tiling --vae-tile-size 4x4)
if [ -z "$need" ]; then
  echo "FAIL easel plan printed no vae row"
  fails=$((fails + 1))
else
  cap_at "$need" 0.9  # $cap MiB, $capg GiB
  segs=$("$easel" plan "${job[@]}" $rpc --backend vae=RPC0 --params-backend vae=cpu --vae-tiling --vae-tile-size 4x4 --max-vram "RPC0=$capg" 2>&1 |
    grep -o "VAE decoder .*: [0-9]* segment(s)" | grep -o "[0-9]* segment(s)")
  if [ -n "$segs" ] && [ "${segs%% *}" -ge 2 ]; then
    echo "ok   easel plan under RPC0=$cap MiB (a 4x4 tile needs $need MiB uncapped): vae in $segs"
  else
    echo "FAIL easel plan under a cap: vae row '$segs', expected several segments"
    fails=$((fails + 1))
  fi
  same_image "tiled 4x4, weights in RAM, --max-vram RPC0=$cap MiB (segments)" "$tmp/plain-t4.png" "$cap" \
    --backend vae=RPC0 --params-backend vae=cpu --vae-tiling --vae-tile-size 4x4 --max-vram "RPC0=$capg"
fi

# easel plan: the vae row and its stage column
if "$easel" plan "${job[@]}" $rpc --backend "vae=RPC0&RPC1" >"$tmp/plan.log" 2>&1 &&
  [ "$(grep -c "^vae  *RPC[01] " "$tmp/plan.log")" -eq 2 ] && grep -q "VAE decoder .*: 2 segment(s)" "$tmp/plan.log" &&
  grep -Eq "^device +te +diffusion +vae +peak" "$tmp/plan.log"; then
  echo "ok   easel plan: vae rows and the vae stage column"
else
  echo "FAIL easel plan: $(tail -3 "$tmp/plan.log")"
  fails=$((fails + 1))
fi

# a decode that cannot fit stops before running, suggesting --vae-tiling
out=$("$easel" generate "${job[@]}" $rpc --backend vae=RPC0 --max-vram RPC0=0.004 -o "$tmp/no.png" 2>&1 >/dev/null | grep -v -i connection)
if [ "$(printf '%s\n' "$out" | grep -c .)" -eq 1 ] && [[ "$out" == *"vae needs"* ]] && [[ "$out" == *"--vae-tiling"* ]] && [ ! -e "$tmp/no.png" ]; then
  echo "ok   does not fit: $out"
else
  echo "FAIL does not fit: $out"
  fails=$((fails + 1))
fi

# --auto-fit: te and diffusion pinned to the CPU, both RPC devices capped a little above a 16x16
# tile's decode at 256x256 (32x32 latent cells): the whole decode does not fit, tiles of 16 do
big=(-m "$model" -p "a cat" -W 256 -H 256 --steps 2 -s 1 -t 1 --no-cache)
need16=$("$easel" plan "${big[@]}" $rpc --backend vae=RPC0 --vae-tiling --vae-tile-size 16x16 2>/dev/null | awk '$1 == "vae" { print $(NF - 2); exit }')
needall=$("$easel" plan "${big[@]}" $rpc --backend vae=RPC0 2>/dev/null | awk '$1 == "vae" { print $(NF - 2); exit }')
cap_at "$need16" 1.05  # $cap MiB, $capg GiB
af=(--backend "te=CPU,diffusion=CPU" --auto-fit --max-vram "RPC0=$capg,RPC1=$capg")
if "$easel" plan "${big[@]}" $rpc "${af[@]}" >"$tmp/af-plan.log" 2>&1; then
  line=$(grep -m1 "^  --backend" "$tmp/af-plan.log")
  if [[ "$line" == *"--vae-tiling --vae-tile-size 16x16"* ]] && [[ "$line" == *"vae=RPC"* ]]; then
    echo "ok   easel plan --auto-fit (whole decode $needall MiB, a 16x16 tile $need16 MiB, caps $cap MiB): $line"
  else
    echo "FAIL easel plan --auto-fit: flags line '$line' does not tile the VAE on an RPC device"
    fails=$((fails + 1))
  fi
else
  echo "FAIL easel plan --auto-fit: $(tail -2 "$tmp/af-plan.log")"
  fails=$((fails + 1))
fi
"$easel" generate "${big[@]}" --vae-tiling --vae-tile-size 16x16 -o "$tmp/plain-big-t16.png" >/dev/null 2>&1
if "$easel" generate "${big[@]}" $rpc "${af[@]}" -o "$tmp/af.png" >"$tmp/af.log" 2>&1; then
  if cmp -s "$tmp/plain-big-t16.png" "$tmp/af.png"; then
    check_peaks "$tmp/af.log" decode '^RPC[01]' "$cap" "generate --auto-fit, VAE tiled under RPC caps of $cap MiB" || fails=$((fails + 1))
  else
    echo "FAIL generate --auto-fit: the image differs from the plain CPU run tiled 16x16"
    fails=$((fails + 1))
  fi
else
  echo "FAIL generate --auto-fit: $(grep -i error "$tmp/af.log" | head -1)"
  fails=$((fails + 1))
fi

[ "$fails" -eq 0 ] && echo "all VAE placement checks passed" || echo "$fails VAE placement checks failed"
[ "$fails" -eq 0 ]
