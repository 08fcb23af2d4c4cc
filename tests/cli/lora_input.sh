#!/bin/bash
# LoRA and embedding flags of `easel generate` are checked before any model is opened or any stage
# runs (docs/lora.md): one "error:" line and exit 1 for a missing file, a weight that is not a number,
# a tag without --lora-model-dir, a name that leaves the folder, a file that is no LoRA, the old
# cloneofsimo format, NaN weights; a LoRA of weight 0 is off and the image is made; a LoRA named by a
# tag in a subfolder is applied (its patches counted in the log) and the image is made.
# Usage: lora_input.sh EASEL_BINARY TEST_DATA_DIR
set -u
easel="$1"
data="$2"
sd="$data/reference/sd_tiny/sd_tiny.safetensors"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0

expect_refused() {  # NAME PATTERN ARGS...: exit 1, one stderr line "error: ...PATTERN...", no stage ran, no out.png
  local name="$1" pattern="$2"
  shift 2
  rm -f "$tmp/out.png"
  err=$(timeout 60 "$easel" "$@" 2>&1 >/dev/null)
  rc=$?
  lines=$(printf '%s\n' "$err" | grep -c .)
  if [ "$rc" -ne 1 ] || [ "$lines" -ne 1 ] || [[ "$err" != "error: "* ]] || [[ "$err" != *"$pattern"* ]] || [[ "$err" == *"stage "* ]] || [ -e "$tmp/out.png" ]; then
    echo "FAIL $name: exit $rc: $err"
    fails=$((fails + 1))
  else
    echo "ok   $name: $err"
  fi
}

# small safetensors files: F32 tensors given as name -> (shape, value)
write_st() {  # FILE PYTHON-DICT-LITERAL
  python3 - "$1" "$2" <<'PY'
import json, struct, sys, math
path, spec = sys.argv[1], eval(sys.argv[2])
header, data = {}, b""
for name, (shape, value) in spec.items():
    n = 1
    for d in shape: n *= d
    b = struct.pack("<%df" % n, *([value] * n))
    header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [len(data), len(data) + len(b)]}
    data += b
h = json.dumps(header).encode()
h += b" " * ((8 - len(h) % 8) % 8)
open(path, "wb").write(struct.pack("<Q", len(h)) + h + data)
PY
}
mkdir -p "$tmp/loras/sub"
good="{'lora_unet_down_blocks_0_attentions_0_proj_in.lora_down.weight': ([4, 32, 1, 1], 0.01), 'lora_unet_down_blocks_0_attentions_0_proj_in.lora_up.weight': ([32, 4, 1, 1], 0.01), 'lora_unet_down_blocks_0_attentions_0_proj_in.alpha': ([], 4.0)}"
write_st "$tmp/loras/style.safetensors" "$good"
write_st "$tmp/loras/sub/deep.safetensors" "$good"
write_st "$tmp/nan.safetensors" "{'a.lora_down.weight': ([2, 4], float('nan')), 'a.lora_up.weight': ([4, 2], 0.5)}"
write_st "$tmp/clone.safetensors" "{'unet:0:up': ([4, 1], 0.1), 'unet:0:down': ([1, 4], 0.1)}"
write_st "$tmp/half.safetensors" "{'a.lora_up.weight': ([4, 2], 0.5)}"
base=(generate -m "$sd" -p "a cat" --steps 1 -W 64 -H 64 -t 1 --no-cache -o "$tmp/out.png")

expect_refused "--lora missing file" "--lora: LoRA file '$tmp/none.safetensors' not found" "${base[@]}" --lora "$tmp/none.safetensors"
expect_refused "--lora FILE:x" "weight 'strong' is not a number" "${base[@]}" --lora "$tmp/loras/style.safetensors:strong"
expect_refused "tag without --lora-model-dir" "the prompt names LoRA 'style' (<lora:style>) but no --lora-model-dir is given" \
  generate -m "$sd" -p "a cat <lora:style:0.5>" --steps 1 -W 64 -H 64 -t 1 --no-cache -o "$tmp/out.png"
expect_refused "tag naming a missing LoRA" "LoRA 'nope' not found in --lora-model-dir" \
  generate -m "$sd" -p "a cat <lora:nope:1>" --lora-model-dir "$tmp/loras" --steps 1 -W 64 -H 64 -t 1 --no-cache -o "$tmp/out.png"
expect_refused "negative-prompt tag leaving the folder" "leaves --lora-model-dir" \
  generate -m "$sd" -p "a cat" -n "<lora:../nan:1>" --lora-model-dir "$tmp/loras" --steps 1 -W 64 -H 64 -t 1 --no-cache -o "$tmp/out.png"
expect_refused "tag weight not a number" "has multiplier 'abc' that is not a number" \
  generate -m "$sd" -p "a cat <lora:style:abc>" --lora-model-dir "$tmp/loras" --steps 1 -W 64 -H 64 -t 1 --no-cache -o "$tmp/out.png"
expect_refused "--lora-model-dir not a folder" "--lora-model-dir '$tmp/nodir' is not a folder" "${base[@]}" --lora-model-dir "$tmp/nodir"
expect_refused "--lora-apply-mode bogus" "lora-apply-mode" "${base[@]}" --lora-apply-mode later
expect_refused "--lora a model file" "holds no LoRA tensors" "${base[@]}" --lora "$data/reference/unet_sd15_tiny.safetensors"
expect_refused "--lora cloneofsimo" "is a cloneofsimo/lora file" "${base[@]}" --lora "$tmp/clone.safetensors"
expect_refused "--lora incomplete pair" "has an up (lora_B) weight without a down (lora_A) weight" "${base[@]}" --lora "$tmp/half.safetensors"
expect_refused "--lora NaN weights" "holds a non-finite value" "${base[@]}" --lora "$tmp/nan.safetensors:0.5"
expect_refused "--embd-dir not a folder" "--embd-dir '$tmp/noemb' is not a folder" "${base[@]}" --embd-dir "$tmp/noemb"
rm -f "$tmp/out.png"
"$easel" generate -m "$sd" -p "a cat <lora:deep:0.8>" --lora-model-dir "$tmp/loras" --steps 1 -W 64 -H 64 -t 1 --no-cache \
  -o "$tmp/out.png" >/dev/null 2>"$tmp/err.txt"
rc=$?
if [ "$rc" -eq 0 ] && [ -s "$tmp/out.png" ] && grep -q "LoRA 'deep': 0 text-encoder and 1 diffusion-model patches" "$tmp/err.txt"; then
  echo "ok   a LoRA named by a tag is applied, the image is made"
else
  echo "FAIL <lora:deep:0.8>: exit $rc: $(cat "$tmp/err.txt")"
  fails=$((fails + 1))
fi

# weight 0 = off: the image is made, and says so
"$easel" "${base[@]}" --lora "$tmp/loras/style.safetensors:0" >/dev/null 2>"$tmp/err.txt"
rc=$?
if [ "$rc" -eq 0 ] && [ -s "$tmp/out.png" ] && grep -q "has weight 0: off" "$tmp/err.txt"; then
  echo "ok   --lora FILE:0 is off, the image is made"
else
  echo "FAIL --lora FILE:0: exit $rc: $(cat "$tmp/err.txt")"
  fails=$((fails + 1))
fi

[ "$fails" -eq 0 ] && echo "all LoRA input checks passed" || echo "$fails LoRA input checks failed"
[ "$fails" -eq 0 ]
