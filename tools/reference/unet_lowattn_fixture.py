"""Reference fixture for a UNet whose first level has no attention (the demo model's "lowattn" layout,
tools/demo-model/archs.py), stored in the original (ldm) key layout as a single file would hold it.

  PYTHONPATH=<diffusers source> python3 tools/reference/unet_lowattn_fixture.py --out tests/data/reference

diffusers UNet2DConditionModel, float32, CPU, random weights (torch.manual_seed 0, then redrawn from a
generator seeded 1: matrices and kernels N(0, 1/fan_in), biases N(0, 0.02), norm weights N(1, 0.02), so no
block is an identity or zero): down DownBlock2D,
CrossAttnDownBlock2D x2; up CrossAttnUpBlock2D x2, UpBlock2D; block_out_channels (16, 16, 32); 8 heads (attention_head_dim 8:
diffusers' naming quirk), the SD1.x convention a single-file loader assumes; 8 GroupNorm groups (a loader
must be told: 32 is the convention); cross_attention_dim 16; layers_per_block 2. Weights are rounded to
f16 before the forward pass and stored as F16 (exact), everything else F32. Names converted with
tools/reference/ldm_convert.py (model.diffusion_model.input_blocks..., upsamplers at
output_blocks.2.2.conv and output_blocks.5.2.conv, no attention at input_blocks.1-2 / output_blocks.6-8).
Inputs: sample [2, 4, 16, 16] ~ N(0, 1), timestep [999, 17], encoder_hidden_states [2, 7, 16] ~ N(0, 1).
Writes unet_lowattn_tiny.safetensors (weights + __input__.* + __output__.sample) and unet_lowattn_tiny.json.
"""

import argparse
import hashlib
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ldm_convert  # noqa: E402

CFG = dict(sample_size=16, in_channels=4, out_channels=4, layers_per_block=2, block_out_channels=(16, 16, 32),
           down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
           up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
           cross_attention_dim=16, attention_head_dim=8, norm_num_groups=8)


def write_safetensors(path, tensors):
    """float16 / float32 tensors -> safetensors file (8-byte header length, JSON header, raw little-endian data)."""
    header, blobs, off = {}, [], 0
    for k, v in tensors.items():
        half = v.dtype == torch.float16
        b = v.detach().contiguous().numpy().astype("<f2" if half else "<f4").tobytes()
        header[k] = {"dtype": "F16" if half else "F32", "shape": list(v.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(hb).to_bytes(8, "little"))
        f.write(hb)
        for b in blobs:
            f.write(b)


def main():
    from diffusers import UNet2DConditionModel

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.manual_seed(0)
    unet = UNet2DConditionModel(**CFG).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in unet.named_parameters():
            is_norm_weight = p.ndim == 1 and name.endswith(".weight")
            p.copy_(torch.randn(p.shape, generator=g) * 0.02 + (1.0 if is_norm_weight else 0.0))
            if p.ndim >= 2:  # fan-in scaled so activations keep their size through the network
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=g) / fan_in ** 0.5)
            p.copy_(p.half().float())
    sample = torch.randn((2, 4, 16, 16), generator=g)
    timestep = torch.tensor([999.0, 17.0])
    ctx = torch.randn((2, 7, 16), generator=g)
    with torch.no_grad():
        out = unet(sample, timestep, encoder_hidden_states=ctx).sample
    ldm = ldm_convert.unet_to_ldm(unet.state_dict(), unet.config)
    tensors = {k: v.detach().half().contiguous() for k, v in ldm.items()}
    tensors["__input__.sample"] = sample
    tensors["__input__.timestep"] = timestep
    tensors["__input__.encoder_hidden_states"] = ctx
    tensors["__output__.sample"] = out.float().contiguous()
    path = os.path.join(a.out, "unet_lowattn_tiny.safetensors")
    write_safetensors(path, tensors)
    sha = hashlib.sha256(open(path, "rb").read()).hexdigest()
    import diffusers

    side = {"case": "unet_lowattn_tiny", "library": "diffusers", "diffusers_version": diffusers.__version__,
            "torch_version": torch.__version__, "cls": "UNet2DConditionModel", "init_kwargs": CFG,
            "key_layout": "ldm (model.diffusion_model.*, tools/reference/ldm_convert.py)",
            "file": os.path.basename(path), "sha256": sha,
            "forward": "unet(__input__.sample, __input__.timestep, encoder_hidden_states=__input__.encoder_hidden_states).sample",
            "output_std": float(out.std()), "notes": __doc__}
    with open(os.path.join(a.out, "unet_lowattn_tiny.json"), "w") as f:
        json.dump(side, f, indent=1)
    print(f"wrote {path} ({os.path.getsize(path)} bytes), output std {out.std():.4f}, {len(ldm)} weights")


if __name__ == "__main__":
    main()
