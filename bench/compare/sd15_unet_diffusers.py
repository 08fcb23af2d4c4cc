"""Times diffusers' SD1.5 UNet2DConditionModel on the made-up weights easel-bench wrote.

The same file easel times (`easel-bench --only unet --unet-weights FILE`: F16 values under the
diffusers key names) is loaded into diffusers' UNet2DConditionModel with SD1.5's configuration,
run in PyTorch eager mode with its default attention (scaled_dot_product_attention), in float16 on
the GPU. One timed evaluation = inputs copied to the GPU + forward + output copied back (what
easel-bench's median_s holds). Prints and writes JSON: per batch, median/min seconds, peak memory.

    python3 bench/compare/sd15_unet_diffusers.py --weights FILE --size 512 --batch 1 2 --json OUT
Needs torch with CUDA and diffusers' source on PYTHONPATH (tools/reference/device_setup.sh).
"""
import argparse
import json
import statistics
import time

import torch
from safetensors.torch import load_file


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", required=True)
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    from diffusers import UNet2DConditionModel
    import diffusers

    unet = UNet2DConditionModel(sample_size=a.size // 8, cross_attention_dim=768)  # SD1.5's other settings are the defaults
    sd = load_file(a.weights)
    missing, unexpected = unet.load_state_dict({k: v.float() for k, v in sd.items()}, strict=False)
    if missing or unexpected:
        raise SystemExit(f"weights do not match the SD1.5 UNet: missing {missing[:5]} unexpected {unexpected[:5]}")
    unet = unet.to("cuda", torch.float16).eval()
    n_params = sum(p.numel() for p in unet.parameters())
    lat = a.size // 8
    g = torch.Generator().manual_seed(2)
    res = {"what": "unet", "diffusers": diffusers.__version__, "torch": torch.__version__, "device": torch.cuda.get_device_name(0),
           "dtype": "float16", "attention": "sdpa (diffusers default AttnProcessor2_0)", "size": a.size, "param_count": n_params, "runs": []}
    for B in a.batch:
        sample = torch.randn(B, 4, lat, lat, generator=g, dtype=torch.float16)
        ctx = torch.randn(B, 77, 768, generator=g, dtype=torch.float16)
        t = torch.full((B,), 981.0)
        torch.cuda.reset_peak_memory_stats()

        def once():
            with torch.no_grad():
                out = unet(sample.cuda(), t.cuda(), encoder_hidden_states=ctx.cuda()).sample
            return out.float().cpu()

        for _ in range(a.warmup):
            once()
        times = []
        for _ in range(a.reps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = once()
            times.append(time.perf_counter() - t0)
        r = {"batch": B, "median_s": statistics.median(times), "min_s": min(times), "times_s": times,
             "peak_bytes": torch.cuda.max_memory_allocated(), "output": {"mean": out.mean().item(), "std": out.std().item()}}
        res["runs"].append(r)
        print(f"diffusers unet batch {B}: median {r['median_s']*1e3:.2f} ms (min {r['min_s']*1e3:.2f}), peak {r['peak_bytes']/2**20:.1f} MiB,"
              f" output mean {r['output']['mean']:.4g} std {r['output']['std']:.4g}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
