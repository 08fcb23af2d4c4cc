#!/bin/bash
# `easel generate --hires` (docs/hires.md) on the tiny SD pipeline: the ESRGAN hires upscaler by
# name from --hires-upscalers-dir and a latent mode give the target size and A1111's infotext
# fields; bad input gets one line. (Bit-identity with the composition of easel's own steps:
# tests/e2e/hires_e2e_test.cpp.) About 20 s on 2 cores.
# Usage: hires.sh EASEL_BINARY TEST_DATA_DIR
set -u
easel="$1"
data="$2"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
model="$data/reference/sd_tiny/sd_tiny.safetensors"
gen=(generate -m "$model" -p "a red circle" -W 64 -H 64 --steps 2 -s 1 -t 1 --no-cache)

check() {  # check NAME STATUS DETAIL
  if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1: $3"; fails=$((fails + 1)); fi
}
png_size() {
  [ -f "$1" ] || { echo "missing"; return; }
  local w h
  w=$(od -An -tu1 -j16 -N4 "$1" | awk '{print $1*16777216+$2*65536+$3*256+$4}')
  h=$(od -An -tu1 -j20 -N4 "$1" | awk '{print $1*16777216+$2*65536+$3*256+$4}')
  echo "${w}x${h}"
}
expect_refused() {  # NAME PATTERN ARGS...: exit 1, one stderr line "error: ...PATTERN...", no out.png
  local name="$1" pattern="$2"
  shift 2
  rm -f "$tmp/out.png"
  err=$(timeout 120 "$easel" "$@" 2>&1 >/dev/null)
  rc=$?
  lines=$(printf '%s\n' "$err" | grep -c .)
  if [ "$rc" -ne 1 ] || [ "$lines" -ne 1 ] || [[ "$err" != "error: "* ]] || [[ "$err" != *"$pattern"* ]] || [ -e "$tmp/out.png" ]; then
    echo "FAIL $name: exit $rc: $err"
    fails=$((fails + 1))
  else
    echo "ok   $name: $err"
  fi
}

"$easel" "${gen[@]}" --hires --hires-upscalers-dir "$data/esrgan" --hires-upscaler srvgg_x4_tiny --hires-steps 2 \
  --hires-denoising-strength 0.5 -b 2 -o "$tmp/e.png" > "$tmp/log" 2>&1
check "--hires with an ESRGAN model by name, batch of 2" $? "$(cat "$tmp/log")"
[ "$(png_size "$tmp/e.png")" = "128x128" ] && [ "$(png_size "$tmp/e_2.png")" = "128x128" ]
check "64x64 -> 128x128 (x4 model, then Lanczos down to the target) ($(png_size "$tmp/e.png"))" $? ""
grep -aq "Size: 64x64, .*Denoising strength: 0.5, .*Hires upscale: 2, Hires steps: 2, Hires upscaler: srvgg_x4_tiny" "$tmp/e.png"
check "A1111's hires infotext fields" $? "$(grep -a "Steps:" "$tmp/e.png" | tr -d "\\0" | head -c 400)"

"$easel" "${gen[@]}" --hires --hires-upscaler "latent (bicubic)" --hires-width 96 -o "$tmp/l.png" > "$tmp/log" 2>&1
check "--hires Latent (bicubic) --hires-width 96" $? "$(cat "$tmp/log")"
[ "$(png_size "$tmp/l.png")" = "96x96" ]
check "--hires-width 96: the height from the aspect ratio ($(png_size "$tmp/l.png"))" $? ""
grep -aq "Hires resize: 96x0, Hires upscaler: Latent (bicubic)" "$tmp/l.png"
check "Hires resize field" $? ""

# both sides given: A1111's cover-then-centre-crop to exactly that size
"$easel" "${gen[@]}" --hires --hires-upscaler "latent (bicubic)" --hires-width 128 --hires-height 96 -o "$tmp/wh.png" > "$tmp/log" 2>&1
check "--hires-width 128 --hires-height 96" $? "$(cat "$tmp/log")"
[ "$(png_size "$tmp/wh.png")" = "128x96" ]
check "--hires-width 128 --hires-height 96 gives 128x96 ($(png_size "$tmp/wh.png"))" $? ""

"$easel" "${gen[@]}" --hires --hires-upscaler None -o "$tmp/n.png" > "$tmp/log" 2>&1
check "--hires-upscaler None: no hires fix (sd-cli)" $? "$(cat "$tmp/log")"
[ "$(png_size "$tmp/n.png")" = "64x64" ]
check "None leaves 64x64" $? ""

expect_refused "unknown hires upscaler" "hires upscaler \"R-ESRGAN 4x+\"" "${gen[@]}" --hires --hires-upscaler "R-ESRGAN 4x+" -o "$tmp/out.png"
expect_refused "strength 0" "--hires-denoising-strength 0" "${gen[@]}" --hires --hires-denoising-strength 0 -o "$tmp/out.png"
expect_refused "scale 0" "--hires-scale 0" "${gen[@]}" --hires --hires-scale 0 -o "$tmp/out.png"
expect_refused "too large a target" "between 8 and 16384" "${gen[@]}" --hires --hires-scale 300 -o "$tmp/out.png"
expect_refused "one sigma" "--hires-sigmas needs at least two" "${gen[@]}" --hires --hires-sigmas 0.5 -o "$tmp/out.png"
expect_refused "with --mask" "--hires with --mask" "${gen[@]}" --hires -i "$data/reference/sd_tiny/case_init_image.png" \
  --mask "$data/reference/sd_tiny/case_init_image.png" -o "$tmp/out.png"
expect_refused "on a stage" "--hires runs its second pass inside" encode-prompt -m "$model" -p x --save-embeddings "$tmp/c.safetensors" --hires
expect_refused "a VAE as hires upscaler" "not an ESRGAN upscaler" "${gen[@]}" --hires \
  --hires-upscaler "$data/reference/autoencoder_kl_sd_tiny.safetensors" -o "$tmp/out.png"

echo "$fails failures"
[ "$fails" -eq 0 ]
