"""PyTorch checkpoints written by real torch.save, for easel's restricted unpickler (src/io/pickle.h).

tools/make-malformed/pytorch_files.py writes look-alike files with CPython's pickler (no torch on the dev
machine); this script writes what torch itself writes, so the reader is proven on the real thing: every
container format (zip, legacy, pickle protocol 2 and 4), every nesting (params / params_ema / state_dict /
Lightning checkpoints with a numpy global_step), nn.Parameter, nn.Module.state_dict() (with its _metadata),
non-contiguous views (a transpose, a strided slice), views sharing a storage, every dtype easel reads.

Run on the GPU machine (torch + numpy; no GPU needed):
    python3 tools/reference/make_pth_fixtures.py tests/data/pytorch/torch
Writes into the folder: the .pth / .pt / .ckpt / .bin files, expected.json (per file: every tensor's dtype,
shape and values in row-major order, as tests/unit/io_pytorch_test.cpp checks them), and SOURCE.md
(torch / numpy / python versions).
"""
import collections
import json
import os
import platform
import sys

import numpy as np
import torch

OUT = sys.argv[1] if len(sys.argv) > 1 else "pth_fixtures"
os.makedirs(OUT, exist_ok=True)
torch.manual_seed(0)

DTYPE_NAMES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64",
               torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}


class Small(torch.nn.Module):
    """A module with the parameter and buffer kinds checkpoints hold."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)  # running_mean / running_var / num_batches_tracked (int64)
        self.fc = torch.nn.Linear(6, 5)
        self.emb = torch.nn.Embedding(7, 3)
        self.prelu = torch.nn.PReLU(4)


def module_state():
    m = Small()
    with torch.no_grad():
        m.bn.running_mean.uniform_(-1, 1)
        m.bn.num_batches_tracked.fill_(12345)
    return m.state_dict()  # an OrderedDict with _metadata


def dtype_tensors():
    sd = collections.OrderedDict()
    base = torch.linspace(-3, 3, 24)
    sd["f64"] = base.double().reshape(2, 3, 4)
    sd["f32"] = base.reshape(4, 6)
    sd["f16"] = base.half().reshape(6, 4)
    sd["bf16"] = base.bfloat16()
    sd["i64"] = torch.arange(-5, 5, dtype=torch.int64)
    sd["i32"] = torch.arange(-3, 3, dtype=torch.int32).reshape(2, 3)
    sd["i16"] = torch.arange(-4, 4, dtype=torch.int16)
    sd["i8"] = torch.arange(-6, 6, dtype=torch.int8)
    sd["u8"] = torch.arange(0, 250, 25, dtype=torch.uint8)
    sd["bool"] = torch.tensor([True, False, True, True])
    sd["scalar"] = torch.tensor(2.5)
    sd["empty"] = torch.zeros(0, 3)
    return sd


def view_tensors():
    sd = collections.OrderedDict()
    w = torch.arange(48, dtype=torch.float32).reshape(6, 8)
    sd["whole"] = w
    sd["transposed"] = w.t()               # non-contiguous, shares the storage
    sd["rows"] = w[2:4]                    # contiguous view at an offset
    sd["strided"] = w[:, 1::3]             # non-contiguous slice
    sd["position_ids"] = torch.arange(8).expand((1, -1))  # CLIP's buffer: stride 0 on a size-1 dim
    return sd


def expected(sd):
    out = {}
    for k, t in sd.items():
        if not isinstance(t, torch.Tensor):
            continue
        v = t.detach().contiguous().reshape(-1)
        vals = v.float().tolist() if t.is_floating_point() else [float(x) for x in v.to(torch.int64).tolist()]
        out[k] = {"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape), "values": vals}
    return out


files = {}


def save(name, obj, tensors, metadata=None, **kw):
    torch.save(obj, os.path.join(OUT, name), **kw)
    files[name] = {"tensors": expected(tensors)}
    if metadata:
        files[name]["metadata"] = metadata


ms = module_state()
dt = dtype_tensors()
vw = view_tensors()
save("module_state_dict.pth", ms, ms)
save("module_state_dict_legacy.pt", ms, ms, _use_new_zipfile_serialization=False)
save("dtypes.pth", dt, dt)
save("dtypes_legacy.pt", dt, dt, _use_new_zipfile_serialization=False)
save("dtypes_protocol4.pth", dt, dt, pickle_protocol=4)
save("views.pth", vw, vw)
save("views_legacy.pt", vw, vw, _use_new_zipfile_serialization=False)
ema = collections.OrderedDict((k, v * 2) for k, v in ms.items() if v.is_floating_point())
save("params_ema.pth", {"params": ms, "params_ema": ema}, ema, {"pytorch.state_dict_key": "params_ema", "pytorch.unused_keys": "params"})
save("params.pth", {"params": ms}, ms, {"pytorch.state_dict_key": "params"})
params = collections.OrderedDict(w=torch.nn.Parameter(torch.randn(3, 4)), b=torch.nn.Parameter(torch.randn(3), requires_grad=False))
save("parameters.pth", params, params)
ckpt = {"epoch": 6, "global_step": np.int64(470000), "pytorch-lightning_version": "1.9.0", "state_dict": ms,
        "optimizer_states": [{"state": {0: {"exp_avg": torch.zeros(4)}}}], "lr_schedulers": [], "hparams": {"lr": 1e-4}}
save("lightning.ckpt", ckpt, ms, {"pytorch.state_dict_key": "state_dict", "epoch": "6", "global_step": "470000"})
save("lightning_legacy.ckpt", ckpt, ms, {"pytorch.state_dict_key": "state_dict", "global_step": "470000"},
     _use_new_zipfile_serialization=False)
save("model_wrapper.bin", {"model": ms}, ms, {"pytorch.state_dict_key": "model"})

with open(os.path.join(OUT, "expected.json"), "w") as f:
    json.dump(files, f, indent=1, sort_keys=True)
    f.write("\n")
with open(os.path.join(OUT, "SOURCE.md"), "w") as f:
    f.write("# PyTorch checkpoints written by torch.save\n\n")
    f.write(f"Made by tools/reference/make_pth_fixtures.py with torch {torch.__version__}, numpy {np.__version__}, "
            f"python {platform.python_version()}. Random values (torch.manual_seed(0)); no third-party weights.\n")
print("wrote", len(files), "files to", OUT)
