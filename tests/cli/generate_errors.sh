#!/bin/bash
# Bad input to `easel generate` gets a one-line "error: ..." naming the problem, exit 1, and no
# output file. Usage: generate_errors.sh EASEL_BINARY TEST_DATA_DIR
set -u
easel="$1"
data="$2"
sd="$data/reference/sd_tiny"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0

# expect_error NAME PATTERN ARGS...: exit 1, one stderr line "error: ...PATTERN...", no PNG
expect_error() {
  local name="$1" pattern="$2"
  shift 2
  rm -f "$tmp/out.png"
  err=$("$easel" generate -t 1 -o "$tmp/out.png" "$@" 2>&1 >/dev/null)
  rc=$?
  lines=$(printf '%s\n' "$err" | grep -c .)
  if [ "$rc" -ne 1 ] || [ "$lines" -ne 1 ] || [[ "$err" != "error: "* ]] || [[ "$err" != *"$pattern"* ]] || [ -e "$tmp/out.png" ]; then
    echo "FAIL $name: exit $rc, $lines stderr lines: $err"
    fails=$((fails + 1))
  else
    echo "ok   $name: $err"
  fi
}

printf 'not an image' > "$tmp/bad.png"
expect_error "VAE passed as -m" "not a diffusion model easel runs (no SD1.x/SD2.x/SDXL UNet)" -m "$data/reference/autoencoder_kl_sd_tiny.safetensors" -p x --steps 1
expect_error "missing model file" "no such file" -m "$tmp/nope.safetensors" -p x --steps 1
expect_error "malformed model file" "gguf_absurd_dims.gguf': GGUF tensor 0 has a shape whose element count overflows 64 bits" -m "$data/malformed/gguf_absurd_dims.gguf" -p x --steps 1
expect_error "unreadable init image" "bad.png" -m "$sd/sd_tiny.safetensors" -p x --steps 1 -i "$tmp/bad.png"
expect_error "mask of another size" "same size" -m "$sd/sd_tiny.safetensors" -p x --steps 1 -i "$sd/case_init_image.png" --mask "$data/png/$(ls "$data/png" | grep -m1 '\.png$')"
expect_error "unknown sampler" "sampl" -m "$sd/sd_tiny.safetensors" -p x --steps 1 --sampling-method nonsense
expect_error "unknown scheduler" "schedul" -m "$sd/sd_tiny.safetensors" -p x --steps 1 --scheduler nonsense
expect_error "unknown rng" "RNG" -m "$sd/sd_tiny.safetensors" -p x --steps 1 --rng nonsense
expect_error "output folder missing" "does not exist" -m "$sd/sd_tiny.safetensors" -p x --steps 1 -o "$tmp/no/such/dir/x.png"
expect_error "VAE tile that cannot advance (refused before the run)" "leaves no step" -m "$sd/sd_tiny.safetensors" -p x --steps 1 --vae-tiling --vae-tile-size 1x1
expect_error "VAE tile overlap of 1" "outside [0, 1)" -m "$sd/sd_tiny.safetensors" -p x --steps 1 --vae-tiling --vae-tile-overlap 1.0
mkdir -p "$tmp/adir"
expect_error "output is a folder (refused before the run)" "is a folder" -m "$sd/sd_tiny.safetensors" -p x --steps 1 -o "$tmp/adir"
expect_error "wrong text encoder" "text encoder" -m "$sd/sd_tiny.safetensors" --clip_l "$data/reference/clip_text_sd15_tiny.safetensors" -p x --steps 1
expect_error "unknown weight type" "--type" -m "$sd/sd_tiny.safetensors" -p x --steps 1 --type q9_9

# A width that is not a multiple of 8 is rounded down with a warning, and the image has that size.
err=$("$easel" generate -t 1 -m "$sd/sd_tiny.safetensors" -p x --steps 1 -W 70 -H 64 -o "$tmp/r.png" 2>&1 >/dev/null)
rc=$?
w=$(python3 -c "import struct,sys;d=open(sys.argv[1],'rb').read(24);print(struct.unpack('>I',d[16:20])[0])" "$tmp/r.png" 2>/dev/null)
if [ "$rc" -ne 0 ] || [[ "$err" != *"width 70 is not a multiple of 8: using 64"* ]] || [ "$w" != "64" ]; then
  echo "FAIL width rounding: exit $rc, width $w: $err"
  fails=$((fails + 1))
else
  echo "ok   width rounding"
fi

echo "$fails failures"
[ "$fails" -eq 0 ]
