"""Extra UNet2DConditionModel reference fixtures for easel's UNet tests (run on the GPU machine).

Usage (repo root, diffusers source on PYTHONPATH, see device_setup.sh):
    python3 tools/reference/unet_extra_fixtures.py --out $OUT

Writes, in the format of ../shared/fixtures/reference (weights under state_dict names,
__input__.*, __output__.*, JSON sidecar with config):
  unet_sd15_tiny_odd.safetensors   the unet_sd15_tiny model on odd latent sizes (13x10), so
                                   diffusers' forward_upsample_size path is exercised (inputs and
                                   output only: the weights are unet_sd15_tiny.safetensors';
                                   copied to tests/data/reference for UnetSd.OddLatentSizesMatchDiffusers)
  unet_sd2_tiny.safetensors        an SD2.x-style tiny UNet: 9 input channels (in-painting),
                                   use_linear_projection, 3 levels (2 downsamplers), depth-2
                                   transformers, per-block heads, 4 groups; run on 12x20 and 11x7
Float32 on CPU, torch.no_grad().
"""
import argparse
import json
import struct
import sys

import numpy as np
import torch
from diffusers import UNet2DConditionModel


def save_st(path, tensors):
    header, off, blobs = {}, 0, []
    for k, v in tensors.items():
        a = v.detach().cpu().contiguous().to(torch.float32).numpy()
        b = a.tobytes()
        header[k] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def load_st(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, m in header.items():
        if k == "__metadata__":
            continue
        s, e = m["data_offsets"]
        assert m["dtype"] == "F32"
        out[k] = torch.from_numpy(np.frombuffer(data[s:e], dtype=np.float32).copy().reshape(m["shape"]))
    return out


def perturb(model):
    g = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.dim() <= 1 or torch.all(p == p.flatten()[0]):
                p.add_(torch.randn(p.shape, generator=g) * 0.1)


def stats(t):
    return {"shape": list(t.shape), "min": float(t.min()), "max": float(t.max()), "mean": float(t.mean())}


def run_case(name, model, init_kwargs, calls, out_dir, weights=True):
    tensors = {k: v for k, v in model.state_dict().items()} if weights else {}
    meta = {"case": name, "init_kwargs": init_kwargs, "config": dict(model.config), "calls": []}
    for tag, (sample, t, ctx) in calls.items():
        with torch.no_grad():
            y = model(sample, t, encoder_hidden_states=ctx, return_dict=False)[0]
            y64 = model.double()(sample.double(), t.double(), encoder_hidden_states=ctx.double(), return_dict=False)[0]
            model.float()
        tensors[f"__input__.{tag}.sample"] = sample
        tensors[f"__input__.{tag}.timestep"] = t
        tensors[f"__input__.{tag}.encoder_hidden_states"] = ctx
        tensors[f"__output__.{tag}.sample"] = y
        meta["calls"].append({"tag": tag, "sample": stats(sample), "timestep": t.tolist(), "context": stats(ctx),
                              "output": stats(y), "float64_vs_float32": float((y.double() - y64).abs().max())})
    save_st(f"{out_dir}/{name}.safetensors", tensors)
    meta["config"] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in meta["config"].items()}
    with open(f"{out_dir}/{name}.json", "w") as f:
        json.dump(meta, f, indent=1, default=str)
    print(name, "ok", [c["float64_vs_float32"] for c in meta["calls"]])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--fixture", default="tests/data/reference/unet_sd15_tiny")
    a = ap.parse_args()
    torch.set_grad_enabled(False)

    # 1. the SD1.5 tiny fixture on odd sizes
    meta = json.load(open(a.fixture + ".json"))
    m = UNet2DConditionModel(**meta["init_kwargs"]).float().eval()
    sd = load_st(a.fixture + ".safetensors")
    m.load_state_dict({k: v for k, v in sd.items() if not k.startswith("__")})
    g = torch.Generator().manual_seed(2001)
    calls = {"odd": (torch.randn(1, 4, 13, 10, generator=g), torch.tensor([37.25]), torch.randn(1, 7, 32, generator=g))}
    run_case("unet_sd15_tiny_odd", m, meta["init_kwargs"], calls, a.out, weights=False)

    # 2. SD2.x-style tiny UNet
    kw = dict(sample_size=16, in_channels=9, out_channels=4,
              down_block_types=["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
              mid_block_type="UNetMidBlock2DCrossAttn",
              up_block_types=["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"],
              block_out_channels=[16, 32, 32], layers_per_block=1, norm_num_groups=4, norm_eps=1e-5,
              cross_attention_dim=24, attention_head_dim=[2, 4, 4], use_linear_projection=True,
              transformer_layers_per_block=2, upcast_attention=True, act_fn="silu",
              flip_sin_to_cos=True, freq_shift=0)
    torch.manual_seed(0)
    m = UNet2DConditionModel(**kw).float().eval()
    perturb(m)
    g = torch.Generator().manual_seed(3001)
    calls = {
        "even": (torch.randn(2, 9, 12, 20, generator=g), torch.tensor([999.0, 0.5]), torch.randn(2, 5, 24, generator=g)),
        "odd": (torch.randn(1, 9, 11, 7, generator=g), torch.tensor([420.75]), torch.randn(1, 3, 24, generator=g)),
    }
    run_case("unet_sd2_tiny", m, kw, calls, a.out)


if __name__ == "__main__":
    sys.exit(main())
