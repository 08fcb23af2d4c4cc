#!/bin/bash
# `easel upscale`, sd-cli's `-M upscale`, `--upscale-model` on generate / decode / plan, and their
# refusals, on the tiny random-weight upscalers of tests/data/esrgan (tools/make-malformed/esrgan_files.py).
# Usage: upscale.sh EASEL_BINARY TEST_DATA_DIR
set -u
easel="$1"
data="$2"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
img="$data/reference/sd_tiny/case_init_image.png"

check() {  # check NAME STATUS DETAIL (take STATUS into a variable first when NAME runs a command)
  if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1: $3"; fails=$((fails + 1)); fi
}

# png_size FILE: "WIDTHxHEIGHT" from the IHDR chunk
png_size() {
  [ -f "$1" ] || { echo "missing"; return; }
  local w h
  w=$(od -An -tu1 -j16 -N4 "$1" | awk '{print $1*16777216+$2*65536+$3*256+$4}')
  h=$(od -An -tu1 -j20 -N4 "$1" | awk '{print $1*16777216+$2*65536+$3*256+$4}')
  echo "${w}x${h}"
}

in_size=$(png_size "$img")
iw=${in_size%x*}
ih=${in_size#*x}

# expect_refused NAME PATTERN ARGS...: exit 1, one stderr line "error: ...PATTERN...", no out.png
expect_refused() {
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

# easel upscale: x4 compact model from a .pth ({'params': ...}), whole image and tiled
"$easel" upscale -i "$img" --upscale-model "$data/esrgan/srvgg_x4_tiny.pth" -o "$tmp/a.png" -t 1 > "$tmp/log" 2>&1
check "upscale srvgg x4 (.pth)" $? "$(cat "$tmp/log")"
[ "$(png_size "$tmp/a.png")" = "$((iw * 4))x$((ih * 4))" ]
rc=$?
check "srvgg x4 output is 4x ($(png_size "$tmp/a.png"))" $rc ""
grep -q "Postprocess upscaler: SRVGGNetCompact x4" "$tmp/a.png"
check "postprocessing text chunk" $? ""
grep -q "upscale: SRVGGNetCompact x4" "$tmp/log" && grep -q "measured peak CPU" "$tmp/log"
check "report line with the measured peak" $? "$(cat "$tmp/log")"

# sd-cli's form: -M upscale without a subcommand, RRDBNet x2 (pixel unshuffle), two repeats, 16-px tiles
"$easel" -M upscale -i "$img" --upscale-model "$data/esrgan/rrdb_x2_tiny.pth" --upscale-repeats 2 --upscale-tile-size 16 \
  -o "$tmp/b.png" -t 1 > "$tmp/log" 2>&1
check "-M upscale rrdb x2, 2 repeats, tiles" $? "$(cat "$tmp/log")"
[ "$(png_size "$tmp/b.png")" = "$((iw * 4))x$((ih * 4))" ]
rc=$?
check "x2 twice is 4x ($(png_size "$tmp/b.png"))" $rc ""
grep -q "tiles of 16 px" "$tmp/log"
check "the tile size is used" $? "$(cat "$tmp/log")"

# the old ESRGAN key layout (legacy torch.save) and the BasicSR safetensors both run (the unit test
# esrgan_test.cpp shows they give the same image bit for bit)
"$easel" upscale -i "$img" --upscale-model "$data/esrgan/rrdb_x4_tiny_esrgan.pth" -o "$tmp/c.png" -t 1 > "$tmp/log" 2>&1
check "rrdb x4, ESRGAN keys, legacy .pth" $? "$(cat "$tmp/log")"
[ "$(png_size "$tmp/c.png")" = "$((iw * 4))x$((ih * 4))" ]
check "rrdb x4 output is 4x" $? ""

# generate with --upscale-model (the tiny SD pipeline): each image upscaled before it is written
"$easel" generate -m "$data/reference/sd_tiny/sd_tiny.safetensors" -p "a red circle" -W 64 -H 64 --steps 2 -s 1 -t 1 --no-cache \
  --upscale-model "$data/esrgan/srvgg_x2_tiny.safetensors" -b 2 -o "$tmp/g.png" > "$tmp/log" 2>&1
check "generate --upscale-model, batch of 2" $? "$(cat "$tmp/log")"
[ "$(png_size "$tmp/g.png")" = "128x128" ] && [ "$(png_size "$tmp/g_2.png")" = "128x128" ]
rc=$?
check "generated 64x64 upscaled to 128x128 ($(png_size "$tmp/g.png"))" $rc ""
grep -q "parameters" "$tmp/g.png" && grep -q "Postprocess upscale by: 2" "$tmp/g.png"
check "generation parameters and postprocessing text" $? ""

# easel plan shows the upscaler row
"$easel" plan -m "$data/reference/sd_tiny/sd_tiny.safetensors" -W 64 -H 64 --backend cpu \
  --upscale-model "$data/esrgan/rrdb_x4_tiny.safetensors" > "$tmp/plan" 2>&1
check "plan --upscale-model" $? "$(cat "$tmp/plan")"
grep -q "^upscaler" "$tmp/plan"
check "the plan has an upscaler row" $? "$(cat "$tmp/plan")"

# refusals: one line, exit 1, nothing written
expect_refused "not an upscaler" "not an ESRGAN upscaler" upscale -i "$img" --upscale-model "$data/reference/autoencoder_kl_sd_tiny.safetensors" -o "$tmp/out.png"
expect_refused "generate with a VAE as upscaler (before any stage)" "not an ESRGAN upscaler" generate -m "$data/reference/sd_tiny/sd_tiny.safetensors" \
  -p x --steps 1 -W 64 -H 64 --upscale-model "$data/reference/autoencoder_kl_sd_tiny.safetensors" -o "$tmp/out.png"
expect_refused "hostile pickle" "'posix.system'" upscale -i "$img" --upscale-model "$data/malformed/pt_os_system.pth" -o "$tmp/out.png"
expect_refused "corrupt zip" "truncated" upscale -i "$img" --upscale-model "$data/malformed/pt_truncated_zip.pth" -o "$tmp/out.png"
expect_refused "missing model file" "does not exist" upscale -i "$img" --upscale-model "$tmp/none.pth" -o "$tmp/out.png"
expect_refused "missing image" "" upscale -i "$tmp/none.png" --upscale-model "$data/esrgan/srvgg_x4_tiny.pth" -o "$tmp/out.png"
expect_refused "-M upscale without a model" "--upscale-model" -M upscale -i "$img" -o "$tmp/out.png"
expect_refused "-M upscale with 0 repeats" "--upscale-repeats 0" -M upscale -i "$img" --upscale-model "$data/esrgan/srvgg_x4_tiny.pth" \
  --upscale-repeats 0 -o "$tmp/out.png"
expect_refused "too large an output" "largest output side" upscale -i "$img" --upscale-model "$data/esrgan/srvgg_x4_tiny.pth" \
  --upscale-repeats 8 -o "$tmp/out.png"
expect_refused "--upscale-model on encode-prompt" "--upscale-model" encode-prompt -m "$data/reference/sd_tiny/sd_tiny.safetensors" -p x \
  --save-embeddings "$tmp/c.safetensors" --upscale-model "$data/esrgan/srvgg_x4_tiny.pth"

echo "$fails failures"
[ "$fails" -eq 0 ]
