#!/bin/bash
# The stage commands refuse missing or wrong files with one "error: ..." line naming the flag,
# exit 1, and write nothing. Usage: stages_errors.sh EASEL_BINARY TEST_DATA_DIR
set -u
easel="$1"
data="$2"
sd="$data/reference/sd_tiny"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
m=(-m "$sd/sd_tiny.safetensors" -t 1 --rng cpu)

# expect_error NAME PATTERN COMMAND ARGS...: exit 1, one stderr line "error: ...PATTERN...", no out.*
expect_error() {
  local name="$1" pattern="$2"
  shift 2
  rm -f "$tmp"/out.*
  "$easel" "$@" >/dev/null 2>"$tmp/err.txt"
  rc=$?
  # info lines of the stages that ran before the failure are not errors
  err=$(grep -v '^stage \|^conditioning from\|^image ' "$tmp/err.txt")
  lines=$(printf '%s\n' "$err" | grep -c .)
  if [ "$rc" -ne 1 ] || [ "$lines" -ne 1 ] || [[ "$err" != "error: "* ]] || [[ "$err" != *"$pattern"* ]] || ls "$tmp"/out.* >/dev/null 2>&1; then
    echo "FAIL $name: exit $rc, $lines lines: $err"
    fails=$((fails + 1))
  else
    echo "ok   $name: $err"
  fi
}

"$easel" encode-prompt "${m[@]}" -p "a cat" --save-embeddings "$tmp/cond.safetensors" >/dev/null 2>&1 || { echo "FAIL encode-prompt"; exit 1; }
"$easel" encode-image "${m[@]}" -i "$sd/case_init_image.png" --save-latent "$tmp/init.safetensors" >/dev/null 2>&1 || { echo "FAIL encode-image"; exit 1; }

expect_error "encode-prompt without --save-embeddings" "--save-embeddings" encode-prompt "${m[@]}" -p x
expect_error "encode-image without -i" "-i IMAGE" encode-image "${m[@]}" --save-latent "$tmp/out.safetensors"
expect_error "denoise without --load-embeddings" "--load-embeddings" denoise "${m[@]}" --save-latent "$tmp/out.safetensors"
expect_error "denoise without --save-latent" "--save-latent" denoise "${m[@]}" --load-embeddings "$tmp/cond.safetensors"
expect_error "denoise with -i" "--load-latent INIT" denoise "${m[@]}" --load-embeddings "$tmp/cond.safetensors" -i "$sd/case_init_image.png" --save-latent "$tmp/out.safetensors"
expect_error "resume without --checkpoint-dir" "--checkpoint-dir" denoise "${m[@]}" --load-embeddings "$tmp/cond.safetensors" --save-latent "$tmp/out.safetensors" --resume
expect_error "resume from an empty folder" "no checkpoint" denoise "${m[@]}" --load-embeddings "$tmp/cond.safetensors" --save-latent "$tmp/out.safetensors" --checkpoint-dir "$tmp/ck" --resume
expect_error "conditioning given as latent" "expected a latent file" decode "${m[@]}" --load-latent "$tmp/cond.safetensors" -o "$tmp/out.png"
expect_error "decode of an image posterior" "posterior" decode "${m[@]}" --load-latent "$tmp/init.safetensors" -o "$tmp/out.png"
expect_error "missing conditioning file" "no such file" denoise "${m[@]}" --load-embeddings "$tmp/nope.safetensors" --save-latent "$tmp/out.safetensors"
expect_error "unknown --stage" "unknown stage" generate "${m[@]}" --stage nonsense -p x
"$easel" encode-prompt "${m[@]}" -p "a cat" --cfg-scale 1 --save-embeddings "$tmp/cond1.safetensors" >/dev/null 2>&1 || { echo "FAIL encode-prompt cfg 1"; exit 1; }
expect_error "CFG without a negative prompt" "holds no negative prompt" denoise "${m[@]}" --load-embeddings "$tmp/cond1.safetensors" --save-latent "$tmp/out.safetensors"

echo "$fails failures"
[ "$fails" -eq 0 ]
