#!/bin/bash
# The 8 GB Vulkan reference user's template (issue 20; DEVELOPERS.md "Who it is for"), replayed
# unchanged except for the files and devices:
#   --diffusion-model flux-2-klein-9b-Q4_0.gguf --vae flux2-vae.safetensors --llm ...q4_k_m.gguf
#   --lora-model-dir loras -p "<lora:NAME:1.0>..." --guidance 3.5 --steps 10 --sampling-method euler
#   -i input.png --mask mask.png -W 352 -H 864 --output out.png --seed 42 --diffusion-fa --vae-tiling
#   --backend te=cpu,diffusion=vulkan1,vae=vulkan1 --params-backend cpu --mmap --max-vram 6
# Mapping: vulkan1 -> an `easel rpc-server` (RPC1; RPC0 is the card they leave alone); the FLUX.2
# Klein model, VAE and Qwen3 encoder -> the tiny Klein of tests/data/reference/klein_tiny (single
# files); input.png / mask.png -> a 352x864 gradient and a mask white on its left half; the LoRA
# folder -> a folder holding a small LoRA file NAME.safetensors.
# TODO(lora): the user's tag is <lora:NAME:1.0>; this build refuses to apply a LoRA ("applying
# LoRAs to a model is not in this build yet"), so the replay uses <lora:NAME:0> (checked, off) until
# the LoRA branch lands; then the tag goes back to 1.0 with a Klein LoRA file.
# Each flag's effect is checked where it can be: the image's size and parameters text (steps,
# sampler, seed), the masked in-painting (the kept right half of the final latent does not depend
# on the prompt, the repainted left half does), --guidance's one warning (Klein has no guidance input), --vae-tiling
# (tiled decode of the 108-cell-high latent), the plan rows (te on CPU, diffusion and vae on RPC1,
# weights in host RAM), --max-vram (the plan's budget), --mmap (accepted, -v line), the LoRA tag
# (checked, off at weight 0).
# Usage: user_vulkan_rx590.sh EASEL_BINARY TEST_DATA_DIR
set -u
easel="$1"
data="$2"
k="$data/reference/klein_tiny"
png() { python3 "$(dirname "$0")/lib/pngtool.py" "$@"; }
source "$(dirname "$0")/lib/rpc.bash"
start_rpc_pair  # $tmp, RPC0 and RPC1 ($rpc), fails=0

ok() { echo "ok   $1"; }
bad() {
  echo "FAIL $1"
  fails=$((fails + 1))
}

mkdir -p "$tmp/loras"
# a small LoRA file (kohya names; checked for presence and weight, off at weight 0)
python3 - "$tmp/loras/NAME.safetensors" <<'PY'
import json, struct, sys
spec = {"lora_unet_x.lora_down.weight": ([4, 32], 0.01), "lora_unet_x.lora_up.weight": ([32, 4], 0.01), "lora_unet_x.alpha": ([], 4.0)}
header, data = {}, b""
for name, (shape, value) in spec.items():
    n = 1
    for d in shape: n *= d
    b = struct.pack("<%df" % n, *([value] * n))
    header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [len(data), len(data) + len(b)]}
    data += b
h = json.dumps(header).encode()
h += b" " * ((8 - len(h) % 8) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + data)
PY
png make "$tmp/input.png" 352 864 gradient
png make "$tmp/mask.png" 352 864 mask

line=(--diffusion-model "$k/klein_tiny_transformer.safetensors" --vae "$k/klein_tiny_vae.safetensors"
  --llm "$k/diffusers/text_encoder/model.safetensors" --lora-model-dir "$tmp/loras"
  -p "<lora:NAME:0>a red cat sitting on a wooden chair" --guidance 3.5 --steps 10 --sampling-method euler
  -i "$tmp/input.png" --mask "$tmp/mask.png" -W 352 -H 864 --output "$tmp/out.png" --seed 42 --diffusion-fa --vae-tiling
  --backend te=cpu,diffusion=rpc1,vae=rpc1 --params-backend cpu --mmap --max-vram 6)

if ! "$easel" $rpc "${line[@]}" -v --no-cache >"$tmp/user.log" 2>&1; then
  echo "FAIL the user's line did not run: $(grep -m1 'error' "$tmp/user.log")"
  exit 1
fi
ok "the user's line runs (sd-cli flags, no subcommand)"

[ "$(png size "$tmp/out.png")" = "352 864" ] && ok "-W 352 -H 864 --output: 352x864 PNG" || bad "-W/-H: $(png size "$tmp/out.png")"
params=$(png text "$tmp/out.png" parameters)
for want in "Steps: 10" "Sampler: Euler" "Seed: 42" "Size: 352x864"; do
  [[ "$params" == *"$want"* ]] && ok "parameters text has '$want'" || bad "parameters text lacks '$want': $params"
done

# --mask: the kept right half (black) is the init image's latent whatever the prompt, the repainted
# left half (white) follows the prompt: the same line with another prompt, final latents compared
# per half (the tiny VAE has random weights, so pixels cannot be compared with the init image)
if "$easel" $rpc "${line[@]}" -p "<lora:NAME:0>a blue dog under a tree" --save-latent "$tmp/b.latent" -o "$tmp/b.png" --no-cache >"$tmp/b.log" 2>&1 &&
  "$easel" $rpc "${line[@]}" --save-latent "$tmp/a.latent" -o "$tmp/a.png" --no-cache >"$tmp/a.log" 2>&1; then
  read -r left right < <(python3 - "$tmp/a.latent" "$tmp/b.latent" <<'PY'
import json, struct, sys
def latent(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    k = [k for k in h if k != "__metadata__" and h[k]["dtype"] == "F32" and len(h[k]["shape"]) == 4][0]
    s, e = h[k]["data_offsets"]
    return h[k]["shape"], struct.unpack("<%df" % ((e - s) // 4), b[8 + n + s:8 + n + e])
(shape, a), (_, b) = latent(sys.argv[1]), latent(sys.argv[2])
N, C, H, W = shape
left = right = 0.0
for c in range(C):
    for y in range(H):
        for x in range(W):
            i = (c * H + y) * W + x
            d = abs(a[i] - b[i])
            if x < W // 2: left = max(left, d)
            else: right = max(right, d)
print(left, right)
PY
  )
  if awk -v l="$left" -v r="$right" 'BEGIN { exit !(l > 0 && r == 0) }'; then
    ok "--mask: the repainted half follows the prompt (max latent difference $left), the kept half does not ($right)"
  else
    bad "--mask: max latent difference between two prompts: repainted half $left, kept half $right (expected > 0 and 0)"
  fi
else
  bad "--mask: the runs with --save-latent failed: $(grep -hm1 error "$tmp/a.log" "$tmp/b.log")"
fi

# --guidance: one warning (FLUX.2 Klein has no guidance input)
n=$(grep -c "guidance 3.5: FLUX.2 Klein has no distilled-guidance input" "$tmp/user.log")
[ "$n" -eq 1 ] && ok "--guidance 3.5: one warning (Klein has no guidance input)" || bad "--guidance: $n warning lines"
# --vae-tiling: the decode ran in tiles (108 latent cells high with 32-cell tiles)
grep -qiE "tile|tiled" <(grep -iE "decode|vae" "$tmp/user.log") && ok "--vae-tiling: the VAE ran tiled" || bad "--vae-tiling: no tiling in the log"
# placement rows
grep -Eq "^te +CPU" "$tmp/user.log" && ok "--backend te=cpu: te row on CPU" || bad "--backend te=cpu: $(grep -E '^te' "$tmp/user.log" | head -1)"
grep -Eq "^diffusion +RPC1" "$tmp/user.log" && ok "--backend diffusion=rpc1: diffusion row on RPC1" || bad "diffusion=rpc1: $(grep -E '^diffusion' "$tmp/user.log" | head -1)"
grep -Eq "^vae +RPC1" "$tmp/user.log" && ok "--backend vae=rpc1: vae row on RPC1" || bad "vae=rpc1: $(grep -E '^vae' "$tmp/user.log" | head -1)"
grep -q "parameters held in CPU" "$tmp/user.log" && ok "--params-backend cpu: weights in host RAM in the plan" ||
  bad "--params-backend cpu: not in the plan: $(grep -iE 'params' "$tmp/user.log" | head -2)"
grep -q "mmap: easel memory-maps every model file" "$tmp/user.log" && ok "--mmap: -v says easel maps already" || bad "--mmap: no -v line"
grep -Eq "^diffusion +RPC1 .* 6144\.0 " "$tmp/user.log" && ok "--max-vram 6: the plan's budget on RPC1 is 6144 MiB" ||
  bad "--max-vram 6: $(grep -E '^diffusion' "$tmp/user.log" | head -1)"
grep -q "LoRA 'NAME'.*weight 0: off" "$tmp/user.log" && ok "<lora:NAME:0> with --lora-model-dir: found, checked, off (TODO(lora): weight 1.0)" ||
  bad "LoRA tag: $(grep -i lora "$tmp/user.log" | head -2)"
echo "TODO(lora): the user's <lora:NAME:1.0> is replayed at weight 0 until this build applies LoRAs"

[ "$fails" -eq 0 ] && echo "all Vulkan-RX590 user checks passed" || echo "$fails Vulkan-RX590 user checks failed"
[ "$fails" -eq 0 ]
