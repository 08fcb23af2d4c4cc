#!/usr/bin/env bash
# The model card's samples grid, drawn by easel itself (not diffusers): the 8 card prompts, seed 1, 256x256, with
# the settings the model file recommends (its easel.* metadata: no sampler / CFG / steps flags are given).
#   tools/demo-model/easel_grid.sh [MODEL] [OUT_DIR]     (defaults: models/demo/easel-demo-shapes.safetensors,
#                                                          models/demo/samples)
# Writes OUT_DIR/sample_0..7.png, OUT_DIR/grid.png (2 rows of 4, 128 px tiles) and OUT_DIR/first_command.png (the
# README's first command: `easel generate -p "a large red circle in the centre, blue background"`, nothing else
# but the model and output, so seed 42 and the default noise RNG) and prints the scorer's reading of each
# sample (tools/demo-model/score.py). Needs build/bin/easel (EASEL= another) and python3 (PYTHON= another) with
# numpy and PIL for the grid, torch and scipy for the scorer (Debian: python3-torch python3-pil python3-scipy).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
model=${1:-$root/models/demo/easel-demo-shapes.safetensors}
out=${2:-$root/models/demo/samples}
easel=${EASEL:-$root/build/bin/easel}
mkdir -p "$out"
prompts=("a large green star in the centre, white background"
         "a small purple triangle at the top, yellow background"
         "a large yellow ring on the right, blue background"
         "a small red cross at the bottom, black background"
         "a large blue square on the left, pink background"
         "a small orange circle on the right, grey background"
         "a large white circle at the bottom, red background"
         "a cyan star on the left, brown background")
"$easel" generate -m "$model" -p "a large red circle in the centre, blue background" -o "$out/first_command.png" >/dev/null
for i in "${!prompts[@]}"; do
  "$easel" generate -m "$model" -p "${prompts[$i]}" -W 256 -H 256 -s 1 --rng cpu -o "$out/sample_$i.png" >/dev/null
done
"${PYTHON:-python3}" - "$out" "${prompts[@]}" <<'PY'
import sys, os
import numpy as np
from PIL import Image
out, prompts = sys.argv[1], sys.argv[2:]
tiles = [np.asarray(Image.open(os.path.join(out, f"sample_{i}.png")).convert("RGB")) for i in range(8)]
grid = np.concatenate([np.concatenate(tiles[:4], 1), np.concatenate(tiles[4:], 1)], 0)
Image.fromarray(grid).resize((512, 256), Image.LANCZOS).save(os.path.join(out, "grid.png"))
try:
    import torch
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(out)), "..", "..", "tools", "demo-model"))
    sys.path.insert(0, os.path.join(os.getcwd(), "tools", "demo-model"))
    import score
    for p, t in zip(prompts, tiles):
        r = score.analyse(torch.from_numpy(t.copy()).permute(2, 0, 1).float() / 255)
        print(f"{p}: bg {r['bg']}, colour {r['colour']}, shape {r['shape']}, cx {r['cx']:.2f} cy {r['cy']:.2f}, "
              f"area {r['area']:.3f}, speck {r['speck_px']} px, frame {r['frame']:.3f}, edge {r['edge_px']} px")
except ImportError as e:
    print("scorer skipped:", e)
PY
echo "grid: $out/grid.png"
