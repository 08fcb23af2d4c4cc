#!/bin/bash
# The VAE encoder (img2img's encode stage) under placement flags, end to end with the tiny SD
# pipeline and two `easel rpc-server`s on 127.0.0.1: a layer split
# (--backend "vae=RPC0&RPC1"), weights in RAM (--params-backend vae=cpu) and on disk (vae=disk),
# and a --max-vram cap below a tiled encode's need with the weights in RAM (--max-vram segments
# uploaded per tile) each give the PNG of the plain CPU img2img run (-i, the same --vae-tiling);
# the peaks printed after the image encode are within 10% of the prediction (and under the cap)
# on each RPC device; `easel plan -i` shows the encode stage (vae-encode rows and stage column);
# `easel encode-image` under a layer split writes the CPU run's latent file; Z-Image img2img under
# --backend "vae=RPC0&RPC1" gives the CPU run's PNG, encode and decode peaks within 10%.
# Usage: placement_vae_encode.sh EASEL_BINARY TEST_DATA_DIR
set -u
easel="$1"
data="$2"
model="$data/reference/sd_tiny/sd_tiny.safetensors"
source "$(dirname "$0")/lib/rpc.bash"
source "$(dirname "$0")/lib/placement.bash"  # require_different, generate_same_png, cap_at, peak_rows, check_peaks
plain_run="the plain CPU img2img run"  # generate_same_png's name for the reference
# two rpc-servers (lib/rpc.bash); $tmp, $rpc, fails=0
start_rpc_pair
base=(-m "$model" -p "a cat" --steps 2 -s 1 -t 1 --no-cache)

# an init image: the plain text-to-image run's output (128x128)
"$easel" generate "${base[@]}" -W 128 -H 128 -o "$tmp/init.png" >/dev/null 2>"$tmp/init.log" || { echo "FAIL init image: $(tail -1 "$tmp/init.log")"; exit 1; }
job=("${base[@]}" -i "$tmp/init.png" --strength 0.6)
"$easel" generate "${job[@]}" -o "$tmp/plain.png" >/dev/null 2>"$tmp/plain.log" || { echo "FAIL plain img2img: $(tail -1 "$tmp/plain.log")"; exit 1; }
"$easel" generate "${job[@]}" --vae-tiling --vae-tile-size 4x4 -o "$tmp/plain-t4.png" >/dev/null 2>&1 || { echo "FAIL plain tiled img2img"; exit 1; }
require_different "$tmp/plain.png" "$tmp/plain-t4.png" "the tiled run gives the untiled image: the tiled case would prove nothing"

# same_image NAME REFERENCE CAP FLAGS...: the img2img PNG equals REFERENCE, the encode-image stage
# line names the RPC devices, every RPC device's measured peak after the image encode within 10%
# of the prediction and not above CAP (MiB or -)
same_image() {
  local name="$1" ref="$2" cap="$3"
  shift 3
  generate_same_png "$name" "$ref" "$@" || return
  if ! grep -q "stage encode-image: .*vae encoder parameters .*(placed on RPC" "$tmp/out.log"; then
    echo "FAIL $name: the encode-image stage line does not name the RPC devices: $(grep 'stage encode-image' "$tmp/out.log")"
    fails=$((fails + 1))
    return
  fi
  check_peaks "$tmp/out.log" "image encode" '^RPC[01]' "$cap" "$name" measured || fails=$((fails + 1))
}

# (te and diffusion on the CPU; only the vae entry moves)
same_image "img2img, layer split vae=RPC0&RPC1" "$tmp/plain.png" - --backend "te=CPU,diffusion=CPU,vae=RPC0&RPC1"
same_image "img2img, --params-backend vae=cpu (staged)" "$tmp/plain.png" - --backend "te=CPU,diffusion=CPU,vae=RPC0" --params-backend vae=cpu
same_image "img2img, --params-backend vae=disk" "$tmp/plain.png" - --backend "te=CPU,diffusion=CPU,vae=RPC1" --params-backend vae=disk

# a cap at 0.9 of the tiled encode's need with the weights in RAM: --max-vram segments per tile
# (vae-encode row's total of `easel plan`)
enc_need() { "$easel" plan "${job[@]}" $rpc "$@" 2>/dev/null | awk '$1 == "vae-encode" { print $(NF - 2); exit }'; }
need=$(enc_need --backend "te=CPU,diffusion=CPU,vae=RPC0" --params-backend vae=cpu --vae-tiling --vae-tile-size 4x4)
if [ -z "$need" ]; then
  echo "FAIL easel plan -i printed no vae-encode row"
  fails=$((fails + 1))
else
  cap_at "$need" 0.9  # $cap MiB, $capg GiB
  capped=(--backend "te=CPU,diffusion=CPU,vae=RPC0" --params-backend vae=cpu --vae-tiling --vae-tile-size 4x4 --max-vram "RPC0=$capg")
  segs=$("$easel" plan "${job[@]}" $rpc "${capped[@]}" 2>&1 | grep -o "VAE encoder .*: [0-9]* segment(s)" | grep -o "[0-9]* segment(s)")
  if [ -n "$segs" ] && [ "${segs%% *}" -ge 2 ]; then
    echo "ok   easel plan -i under RPC0=$cap MiB (the tiled encode needs $need MiB uncapped): vae-encode in $segs"
  else
    echo "FAIL easel plan -i under a cap: vae-encode '$segs', expected several segments"
    fails=$((fails + 1))
  fi
  same_image "img2img tiled 4x4, weights in RAM, --max-vram RPC0=$cap MiB (segments)" "$tmp/plain-t4.png" "$cap" "${capped[@]}"
fi

# easel plan -i: the vae-encode rows and its stage column
if "$easel" plan "${job[@]}" $rpc --backend "vae=RPC0&RPC1" >"$tmp/plan.log" 2>&1 &&
  [ "$(grep -c "^vae-encode  *RPC[01] " "$tmp/plan.log")" -eq 2 ] && grep -q "VAE encoder .*: 2 segment(s)" "$tmp/plan.log" &&
  grep -Eq "^device +te +diffusion +vae +vae-encode +peak" "$tmp/plan.log"; then
  echo "ok   easel plan -i: vae-encode rows and stage column"
else
  echo "FAIL easel plan -i: $(tail -4 "$tmp/plan.log")"
  fails=$((fails + 1))
fi

# easel encode-image under a layer split: the latent file of the CPU run
"$easel" encode-image -m "$model" -i "$tmp/init.png" -t 1 --save-latent "$tmp/cpu.latent.safetensors" >/dev/null 2>&1
if "$easel" encode-image -m "$model" -i "$tmp/init.png" -t 1 $rpc --backend "vae=RPC1&RPC0" \
  --save-latent "$tmp/rpc.latent.safetensors" >"$tmp/enc.log" 2>&1 && cmp -s "$tmp/cpu.latent.safetensors" "$tmp/rpc.latent.safetensors"; then
  check_peaks "$tmp/enc.log" "image encode" '^RPC[01]' - "easel encode-image, layer split vae=RPC1&RPC0 (same latent file)" measured || fails=$((fails + 1))
else
  echo "FAIL easel encode-image under a layer split: $(grep -i error "$tmp/enc.log" | head -1) (or the latent differs)"
  fails=$((fails + 1))
fi

# Z-Image (tests/data/reference/zimage_tiny, 16-channel FLUX-style VAE): img2img under a layer
# split of the vae entry gives the CPU run's PNG; the peaks after the image encode and after the
# decode are within 10% of the prediction on both RPC devices
job=(-m "$data/reference/zimage_tiny/diffusers" -p "a red cat" -W 64 -H 64 --steps 2 -s 1 -t 1 --no-cache
  -i "$data/reference/zimage_tiny/img2img_init.png" --strength 0.6)
if "$easel" generate "${job[@]}" -o "$tmp/zplain.png" >/dev/null 2>"$tmp/zplain.log"; then
  same_image "Z-Image img2img, layer split vae=RPC0&RPC1" "$tmp/zplain.png" - --backend "vae=RPC0&RPC1"
  rows=$(peak_rows "$tmp/out.log" decode '^RPC[01]' measured)
  if [ "$(printf '%s\n' "$rows" | grep -c "^RPC")" -ne 2 ]; then
    echo "FAIL Z-Image img2img decode peaks: expected RPC0 and RPC1 rows after the decode, got '$rows'"
    fails=$((fails + 1))
  else
    check_peaks "$tmp/out.log" decode '^RPC[01]' - "Z-Image img2img decode peaks" measured || fails=$((fails + 1))
  fi
else
  echo "FAIL plain Z-Image img2img run: $(tail -1 "$tmp/zplain.log")"
  fails=$((fails + 1))
fi

[ "$fails" -eq 0 ] && echo "all VAE encoder placement checks passed" || echo "$fails VAE encoder placement checks failed"
[ "$fails" -eq 0 ]
