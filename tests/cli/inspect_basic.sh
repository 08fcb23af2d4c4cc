#!/bin/bash
# `easel inspect` on real test files: family lines, JSON output, multiple files, exit codes.
# Usage: inspect_basic.sh EASEL_BINARY TEST_DATA_DIR
set -eu
easel="$1"
data="$2"
ref="$data/reference"
out=$("$easel" inspect "$ref/clip_text_sd15_tiny.safetensors")
grep -q "^format:     safetensors" <<<"$out"
grep -q "^family:     CLIP text encoder \[hidden 32, 3 layers\]" <<<"$out"
grep -q "class = CLIPTextModel" <<<"$out"
# single-file checkpoint: three modules with their prefixes
out=$("$easel" inspect "$ref/sd_tiny/sd_tiny.safetensors")
grep -q "^family:     SD1.x" <<<"$out"
grep -q "diffusion model .*\[model.diffusion_model.\]" <<<"$out"
grep -q "VAE .*\[first_stage_model.\]" <<<"$out"
# JSON: machine-readable, one object per file, an array for several
json=$("$easel" inspect --json "$ref/unet_sd15_tiny.safetensors")
python3 -c 'import json,sys; d=json.loads(sys.argv[1]); assert d["family"]=="SD1.x", d; assert d["components"][0]["parameters"]==283284, d' "$json"
json=$("$easel" inspect --json "$ref/unet_sd15_tiny.safetensors" "$ref/clip_text_sd15_tiny.safetensors")
python3 -c 'import json,sys; d=json.loads(sys.argv[1]); assert [x["family"] for x in d]==["SD1.x","CLIP text encoder"], d' "$json"
# a diffusers pipeline folder: one section per component with weights
out=$("$easel" inspect "$ref/sd_tiny/diffusers")
[ "$(grep -c '^== ' <<<"$out")" -eq 3 ]
# a good and a bad file: the good one is reported, exit 1, one error line
set +e
err=$("$easel" inspect "$ref/unet_sd15_tiny.safetensors" "$data/malformed/st_empty.safetensors" 2>&1 >/dev/null)
rc=$?
set -e
[ "$rc" -eq 1 ]
[ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ]
echo ok
