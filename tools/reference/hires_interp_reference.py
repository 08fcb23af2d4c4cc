"""torch.nn.functional.interpolate references for easel's latent upscalers (pipeline/hires.h).

A1111's latent_upscale_modes (Latent, Latent (nearest), Latent (nearest-exact), Latent
(antialiased), Latent (bicubic), Latent (bicubic antialiased)) on a seeded random latent
[1, 4, 7, 9], to 14x18 (2x), 11x13 (odd up) and 5x6 (down), on the CPU in float32. Writes
OUT/hires_interp.safetensors (input "x", outputs "<mode>_<aa>_<h>x<w>") for a test that compares
interpolate_latent with them (expected: equal within a few float32 ulps).

    python tools/reference/hires_interp_reference.py OUT_DIR
"""
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import save_file


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    g = torch.Generator().manual_seed(23)
    x = torch.randn(1, 4, 7, 9, generator=g, dtype=torch.float32)
    tensors = {"x": x.contiguous()}
    for mode, aa in [("bilinear", False), ("nearest", False), ("nearest-exact", False), ("bilinear", True), ("bicubic", False), ("bicubic", True)]:
        for h, w in [(14, 18), (11, 13), (5, 6)]:
            y = F.interpolate(x, size=(h, w), mode=mode, antialias=aa) if aa else F.interpolate(x, size=(h, w), mode=mode)
            tensors[f"{mode}_{int(aa)}_{h}x{w}"] = y.contiguous()
    save_file(tensors, os.path.join(out, "hires_interp.safetensors"))
    print("wrote", len(tensors), "tensors to", os.path.join(out, "hires_interp.safetensors"))


if __name__ == "__main__":
    main()
