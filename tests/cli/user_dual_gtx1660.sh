#!/bin/bash
# The dual-GTX-1660 reference user's command line (issue 20; DEVELOPERS.md "Who it is for"),
# replayed unchanged except for the files and devices: their server launch line, run as a
# generate job (sd-server takes sd-cli's flags):
#   --diffusion-model z-image-turbo-art-Q8_0.gguf --llm Qwen3-4B-Q8_0.gguf --taesd taef1_decoder.safetensors
#   --lora-model-dir lora --lora-apply-mode at_runtime --backend "diffusion=CUDA1&CUDA0,te=CPU,vae=CUDA1"
#   --params-backend "diffusion=CUDA1,te=CPU,vae=CUDA1" --split-mode row --fa --color --threads 4 --mmap
#   --steps 8 --cfg-scale 1 --sampling-method euler --scheduler sgm_uniform --width 768 --height 768 --vae-conv-direct
# Mapping: CUDA0/CUDA1 -> two `easel rpc-server`s (RPC0, RPC1); the Z-Image model and its Qwen3
# encoder -> the tiny Z-Image of tests/data/reference/zimage_tiny (single files, no --vae: as the
# user runs it); taef1_decoder -> the TAEF1 stand-in (taef1_standin_decoder.safetensors); 768x768
# -> 256x256 (the same flags; CI time). Each flag's effect is checked where it can be: the plan
# rows (row split of diffusion over RPC1&RPC0, te on CPU, the TAESD decoder as the vae row on
# RPC1), the image's size and its parameters text (steps, CFG, sampler, schedule), --color's
# escape codes, --mmap's -v line, no warning for --vae-conv-direct (applied), the TAEF1 decode (the image
# differs from the AutoencoderKL's; `easel decode --taesd` of the saved latent gives the same PNG),
# img2img with only --taesd refused naming the encoder, and `easel server` accepting the line.
# The same line with --upscale-model (ESRGAN, the x4 of tests/data/esrgan) upscales the image 4x.
# Usage: user_dual_gtx1660.sh EASEL_BINARY TEST_DATA_DIR
set -u
easel="$1"
data="$2"
z="$data/reference/zimage_tiny"
taef1="$data/reference/taef1_standin_decoder.safetensors"
png() { python3 "$(dirname "$0")/lib/pngtool.py" "$@"; }
source "$(dirname "$0")/lib/rpc.bash"
start_rpc_pair  # $tmp, RPC0 and RPC1 ($rpc), fails=0
mkdir -p "$tmp/lora"

ok() { echo "ok   $1"; }
bad() {
  echo "FAIL $1"
  fails=$((fails + 1))
}

# the user's line, files and devices mapped
line=(--diffusion-model "$z/zimage_tiny_transformer.safetensors" --llm "$z/diffusers/text_encoder/model.safetensors"
  --taesd "$taef1" --lora-model-dir "$tmp/lora" --lora-apply-mode at_runtime
  --backend "diffusion=RPC1&RPC0,te=CPU,vae=RPC1" --params-backend "diffusion=RPC1,te=CPU,vae=RPC1" --split-mode row
  --fa --color --threads 4 --mmap --steps 8 --cfg-scale 1 --sampling-method euler --scheduler sgm_uniform
  --width 256 --height 256 --vae-conv-direct)
job=(-p "a red cat on a blue sofa" -s 7 --no-cache)

if ! "$easel" $rpc "${line[@]}" "${job[@]}" -v -o "$tmp/user.png" --save-latent "$tmp/user.latent.safetensors" >"$tmp/user.log" 2>&1; then
  echo "FAIL the user's line did not run: $(grep -m1 'error' "$tmp/user.log")"
  exit 1
fi
ok "the user's line runs (easel + sd-cli flags, no subcommand)"

# size and the parameters text: --width/--height, --steps, --cfg-scale, --sampling-method, --scheduler
[ "$(png size "$tmp/user.png")" = "256 256" ] && ok "--width/--height: 256x256" || bad "--width/--height: $(png size "$tmp/user.png")"
params=$(png text "$tmp/user.png" parameters)
for want in "Steps: 8" "CFG scale: 1" "Sampler: Euler" "Schedule type: SGM Uniform" "Size: 256x256" "Seed: 7"; do
  [[ "$params" == *"$want"* ]] && ok "parameters text has '$want'" || bad "parameters text lacks '$want': $params"
done

# placement: the plan rows (diffusion row split over RPC1&RPC0, te on CPU, the TAESD vae row on RPC1)
grep -Eq "^diffusion +RPC1" "$tmp/user.log" && grep -Eq "^diffusion +RPC0" "$tmp/user.log" &&
  ok "--backend diffusion=RPC1&RPC0: plan rows on both devices" || bad "--backend diffusion=RPC1&RPC0: $(grep -E '^diffusion' "$tmp/user.log" | head -2)"
# --split-mode row: a row split over the two devices, or (the placement issue's part) one warning
# saying why it falls back to a layer split; never a silent layer split
if grep -q "row split over 2 devices" "$tmp/user.log"; then
  ok "--split-mode row: the plan is a row split over 2 devices"
elif [ "$(grep -ciE "warning.*row" "$tmp/user.log")" -ge 1 ]; then
  ok "--split-mode row: falls back with a warning: $(grep -iE 'warning.*row' "$tmp/user.log" | head -1 | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-160)"
else
  bad "--split-mode row: neither a row split nor a warning: $(grep -iE 'split' "$tmp/user.log" | head -2)"
fi
grep -Eq "^te +CPU" "$tmp/user.log" && ok "--backend te=CPU: te row on CPU" || bad "--backend te=CPU: $(grep -E '^te' "$tmp/user.log" | head -1)"
grep -Eq "^vae +RPC1" "$tmp/user.log" && grep -q "TAESD decoder" "$tmp/user.log" && ok "--taesd + vae=RPC1: the TAESD decoder is the vae row on RPC1" ||
  bad "--taesd/vae=RPC1: $(grep -E '^vae|TAESD' "$tmp/user.log" | head -2)"
grep -q "TAEF1 decoder" "$tmp/user.log" && ok "--taesd: the model line names the TAEF1 decoder" || bad "--taesd: no 'TAEF1 decoder' in the log"

# --color: warnings coloured; --vae-conv-direct: applied, no warning; --mmap: the -v line
grep -q $'\x1b\[' "$tmp/user.log" && ok "--color: escape codes in the log" || bad "--color: no escape codes in the log"
n=$(grep -c "conv-direct" "$tmp/user.log")
[ "$n" -eq 0 ] && ok "--vae-conv-direct: applied to the TAEF1 decoder, no warning (flags_honest.sh checks its effect)" || bad "--vae-conv-direct: $n lines name it"
grep -q "mmap: easel memory-maps every model file" "$tmp/user.log" && ok "--mmap: -v says easel maps already" || bad "--mmap: no -v line"
nwarn=$(grep -c "warning" "$tmp/user.log")
echo "     (warnings in the log: $nwarn: $(grep "warning" "$tmp/user.log" | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-100 | tr '\n' '|'))"

# --taesd: the image is TAEF1's: `easel decode --taesd` of the saved latent gives the same PNG, and
# the AutoencoderKL (the tiny FLUX.1-style VAE) gives another one
if "$easel" decode --diffusion-model "$z/zimage_tiny_transformer.safetensors" --llm "$z/diffusers/text_encoder/model.safetensors" \
  --taesd "$taef1" --load-latent "$tmp/user.latent.safetensors" -o "$tmp/dec.png" >"$tmp/dec.log" 2>&1; then
  cmp -s "$tmp/dec.png" "$tmp/user.png" && ok "--taesd: decode of the saved latent gives the same PNG" || bad "--taesd: decode of the saved latent differs"
else
  bad "--taesd: easel decode --taesd failed: $(grep -m1 error "$tmp/dec.log")"
fi
if "$easel" decode --diffusion-model "$z/zimage_tiny_transformer.safetensors" --llm "$z/diffusers/text_encoder/model.safetensors" \
  --vae "$z/zimage_tiny_vae.safetensors" --load-latent "$tmp/user.latent.safetensors" -o "$tmp/kl.png" >"$tmp/kl.log" 2>&1; then
  cmp -s "$tmp/kl.png" "$tmp/user.png" && bad "--taesd: the AutoencoderKL gives the same PNG (TAESD not used?)" || ok "--taesd: the AutoencoderKL's image differs"
else
  bad "AutoencoderKL decode failed: $(grep -m1 error "$tmp/kl.log")"
fi

# img2img with only --taesd: one line saying the VAE encoder is needed
png make "$tmp/init.png" 256 256 gradient
err=$("$easel" $rpc "${line[@]}" "${job[@]}" -i "$tmp/init.png" -o "$tmp/i2i.png" 2>&1 >/dev/null)
rc=$?
if [ "$rc" -eq 1 ] && [[ "$(printf '%s\n' "$err" | grep 'error')" == *"VAE encoder"*"--vae"* ]] && [ ! -e "$tmp/i2i.png" ]; then
  ok "img2img with only --taesd: refused naming the encoder"
else
  bad "img2img with only --taesd: exit $rc: $(printf '%s\n' "$err" | grep error)"
fi

# the same line with --upscale-model (sd-cli: each image upscaled before it is written)
esrgan="$data/esrgan/rrdb_x4_tiny.safetensors"  # RRDBNet x4 (tests/data/esrgan/SOURCE.md)
if "$easel" $rpc "${line[@]}" "${job[@]}" --width 64 --height 64 --upscale-model "$esrgan" -o "$tmp/up.png" >"$tmp/up.log" 2>&1; then
  s=$(png size "$tmp/up.png")
  [ "$s" = "256 256" ] && ok "--upscale-model $(basename "$esrgan"): 64x64 -> $s" || bad "--upscale-model: 64x64 -> $s, expected 256 256"
else
  bad "--upscale-model: $(grep -m1 error "$tmp/up.log")"
fi

# the server launch line itself: `easel server` accepts every flag and listens (then stopped);
# port 41400 + PID % 200 (tests/cli/lib/server.bash's ranges), another one when taken
for attempt in 0 1 2 3; do
  port=$((41400 + ($$ + attempt * 37) % 200))
  "$easel" server $rpc "${line[@]}" --listen-port "$port" --state-dir "$tmp/state" --cache-dir "$tmp/cache" >"$tmp/server.log" 2>&1 &
  spid=$!
  for i in $(seq 600); do
    kill -0 "$spid" 2>/dev/null || break
    grep -q "easel server: http://" "$tmp/server.log" && break
    sleep 0.1
  done
  if kill -0 "$spid" 2>/dev/null; then
    kill "$spid"
    wait "$spid" 2>/dev/null
    grep -q "easel server: http://" "$tmp/server.log" && ok "easel server accepts the line and listens" || bad "easel server with the line did not listen within 60 s"
    break
  fi
  wait "$spid" 2>/dev/null
  grep -q "cannot listen" "$tmp/server.log" && continue
  bad "easel server with the line: $(grep -m1 error "$tmp/server.log")"
  break
done

[ "$fails" -eq 0 ] && echo "all dual-GTX-1660 user checks passed" || echo "$fails dual-GTX-1660 user checks failed"
[ "$fails" -eq 0 ]
