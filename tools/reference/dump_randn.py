"""Dump torch.randn values (CPU and CUDA generators) so easel's `--rng cpu|cuda` generators can be
checked bit for bit against PyTorch.

Output: JSON {"torch_version", "cuda_device", "cpu": [{"seed", "shape", "values"}], "cuda": [...]}
where values are the flattened (row-major, C order) float32 samples written with repr(float(v)),
which round-trips exactly. Case: torch.manual_seed(seed); torch.randn(shape[, device="cuda"]).
"""

import argparse
import json

import torch

SEEDS = [0, 42, 123456789]
SHAPES = [[7], [1, 4, 8, 8], [1, 4, 32, 32]]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    res = {"torch_version": torch.__version__, "dtype": "float32", "layout": "flattened row-major (C order)"}
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    if torch.cuda.is_available():
        res["cuda_device"] = torch.cuda.get_device_name(0)
    for dev in devices:
        cases = []
        for s in SEEDS:
            for shape in SHAPES:
                torch.manual_seed(s)
                t = torch.randn(shape, device=dev, dtype=torch.float32).cpu()
                cases.append({"seed": s, "shape": shape, "values": [float(v) for v in t.flatten().tolist()]})
        res[dev] = cases
    # json writes each float with repr(float(v)): the shortest form that round-trips exactly
    text = json.dumps(res, separators=(",", ":"))
    with open(a.out, "w") as f:
        f.write(text)
    print("randn: wrote", a.out, {d: len(res[d]) for d in devices})


if __name__ == "__main__":
    main()
