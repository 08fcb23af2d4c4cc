#!/usr/bin/env python3
"""Writes tiny random-weight ESRGAN upscalers in the real key layouts (python3 standard library only).

The weights are uniform random (seeded, reproducible); what matters is the layout: tests/unit/esrgan_test.cpp
checks easel's networks on them against a plain double-precision implementation written from the
published definitions, and tests/cli/upscale.sh runs `easel upscale` on them. PyTorch parity on
random and real weights comes from tools/reference/esrgan_reference.py (needs torch: run on the GPU machine).

  rrdb_x4_tiny.safetensors   RRDBNet x4, BasicSR keys (conv_first, body.N.rdbK.convJ, conv_up1/2, conv_hr, conv_last);
                             8 features, grow 4, 2 RRDB blocks
  rrdb_x4_tiny_esrgan.pth    the same weights under the original ESRGAN keys (model.0, model.1.sub.N.RDBK.convJ.0, ...),
                             a plain state dict in the legacy torch.save format (as the 2018 ESRGAN files are)
  rrdb_x4_tiny_trunk.pth     the same weights under the ESRGAN repo's 2019 names (conv_first, RRDB_trunk.N.RDBK.convJ,
                             trunk_conv, upconv1/2, HRconv, conv_last), a plain state dict, zip format
  rrdb_x2_tiny.pth           RRDBNet x2 (pixel unshuffle 2: conv_first takes 12 channels), {'params_ema': ...} zip
  srvgg_x4_tiny.pth          SRVGGNetCompact x4 (8 features, 3 body convs, PReLU), {'params': ...} zip
  srvgg_x2_tiny.safetensors  SRVGGNetCompact x2 (8 features, 2 body convs)
Run: python3 tools/make-malformed/esrgan_files.py [output folder (default tests/data/esrgan)]
"""
import collections
import json
import os
import random
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pytorch_files as pf  # noqa: E402  (the torch.save look-alike)

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "esrgan")


def conv(rng, sd, name, cin, cout, k=3):
    b = 1.0 / (cin * k * k) ** 0.5
    sd[name + ".weight"] = ([cout, cin, k, k], [rng.uniform(-b, b) for _ in range(cout * cin * k * k)])
    sd[name + ".bias"] = ([cout], [rng.uniform(-b, b) for _ in range(cout)])


def rrdbnet(seed, feat=8, grow=4, blocks=2, in_ch=3, ups=2):
    rng = random.Random(seed)
    sd = collections.OrderedDict()
    conv(rng, sd, "conv_first", in_ch, feat)
    for n in range(blocks):
        for r in range(1, 4):
            for c in range(1, 6):
                conv(rng, sd, f"body.{n}.rdb{r}.conv{c}", feat + (c - 1) * grow, feat if c == 5 else grow)
    conv(rng, sd, "conv_body", feat, feat)
    for u in range(1, ups + 1):
        conv(rng, sd, f"conv_up{u}", feat, feat)
    conv(rng, sd, "conv_hr", feat, feat)
    conv(rng, sd, "conv_last", feat, 3)
    return sd


def esrgan_names(sd, blocks, ups):
    """BasicSR names -> the original ESRGAN repo's (B.sequential flattens: model.1.sub.<blocks> is the trunk conv)."""
    out = collections.OrderedDict()
    for k, v in sd.items():
        base, leaf = k.rsplit(".", 1)
        if base == "conv_first":
            n = "model.0"
        elif base == "conv_body":
            n = f"model.1.sub.{blocks}"
        elif base.startswith("conv_up"):
            n = f"model.{3 * int(base[7:])}"
        elif base == "conv_hr":
            n = f"model.{3 * ups + 2}"
        elif base == "conv_last":
            n = f"model.{3 * ups + 4}"
        else:
            _, b, r, c = base.split(".")
            n = f"model.1.sub.{b}.RDB{r[3:]}.conv{c[4:]}.0"
        out[n + "." + leaf] = v
    return out


def trunk_names(sd):
    """BasicSR names -> the ESRGAN repo's 2019 RRDBNet_arch names (RRDB_trunk, trunk_conv, upconvK, HRconv)."""
    out = collections.OrderedDict()
    for k, v in sd.items():
        base, leaf = k.rsplit(".", 1)
        if base == "conv_body":
            n = "trunk_conv"
        elif base == "conv_hr":
            n = "HRconv"
        elif base.startswith("conv_up"):
            n = "upconv" + base[7:]
        elif base.startswith("body."):
            _, b, r, c = base.split(".")
            n = f"RRDB_trunk.{b}.RDB{r[3:]}.{c}"
        else:
            n = base
        out[n + "." + leaf] = v
    return out


def srvgg(seed, feat=8, num_conv=3, scale=4):
    rng = random.Random(seed)
    sd = collections.OrderedDict()
    conv(rng, sd, "body.0", 3, feat)
    sd["body.1.weight"] = ([feat], [rng.uniform(0.0, 0.5) for _ in range(feat)])
    for i in range(num_conv):
        conv(rng, sd, f"body.{2 * i + 2}", feat, feat)
        sd[f"body.{2 * i + 3}.weight"] = ([feat], [rng.uniform(0.0, 0.5) for _ in range(feat)])
    conv(rng, sd, f"body.{2 * num_conv + 2}", feat, 3 * scale * scale)
    return sd


def safetensors(sd):
    header, data = {}, b""
    for k, (shape, vals) in sd.items():
        raw = struct.pack("<%df" % len(vals), *vals)
        header[k] = {"dtype": "F32", "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def torch_dict(sd):
    out = collections.OrderedDict()
    for i, (k, (shape, vals)) in enumerate(sd.items()):
        out[k] = pf.Tensor(pf.Storage("f32", vals, str(i)), shape)
    return out


def write(name, data):
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)


if __name__ == "__main__":
    x4 = rrdbnet(1)
    write("rrdb_x4_tiny.safetensors", safetensors(x4))
    write("rrdb_x4_tiny_esrgan.pth", pf.torch_legacy(torch_dict(esrgan_names(x4, 2, 2))))
    write("rrdb_x4_tiny_trunk.pth", pf.torch_zip(torch_dict(trunk_names(x4))))
    write("rrdb_x2_tiny.pth", pf.torch_zip({"params_ema": torch_dict(rrdbnet(2, in_ch=12))}))
    write("srvgg_x4_tiny.pth", pf.torch_zip({"params": torch_dict(srvgg(3))}))
    write("srvgg_x2_tiny.safetensors", safetensors(srvgg(4, num_conv=2, scale=2)))
    print("wrote", OUT)
