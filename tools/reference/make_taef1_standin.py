#!/usr/bin/env python3
"""Writes tests/data/reference/taef1_standin_decoder.safetensors: a 16-channel tiny-autoencoder
decoder (TAEF1's shape: FLUX.1 / Z-Image latents) derived from the 4-channel diffusers
AutoencoderTiny test model autoencoder_tiny_taesd_tiny.safetensors, with no torch or numpy.

Every decoder.* tensor is copied unchanged except the first convolution, whose input channels
grow from 4 to 16: W16[o, c] = W4[o, c % 4] / 4. A 16-channel latent made of four copies of a
4-channel one, z16[c] = z4[c % 4], therefore decodes exactly as z4 does with the source model
(the decoder's first step, tanh(x / 3) * 3, is elementwise), up to float rounding of the sum.

Usage: make_taef1_standin.py SOURCE.safetensors OUT.safetensors
"""
import json
import struct
import sys


def read(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8:8 + n])
    data = b[8 + n:]
    tensors = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        s, e = v["data_offsets"]
        tensors[k] = (v["dtype"], v["shape"], data[s:e])
    return tensors


def main():
    src, out = sys.argv[1], sys.argv[2]
    t = read(src)
    keep = {k: v for k, v in t.items() if k.startswith("decoder.")}
    dtype, shape, raw = keep["decoder.layers.0.weight"]
    assert dtype == "F32" and shape[1] == 4, (dtype, shape)
    o, ci, kh, kw = shape
    w = struct.unpack("<%df" % (o * ci * kh * kw), raw)
    new = []
    for oo in range(o):
        for c in range(16):
            base = (oo * ci + c % 4) * kh * kw
            new.extend(x / 4.0 for x in w[base:base + kh * kw])
    keep["decoder.layers.0.weight"] = ("F32", [o, 16, kh, kw], struct.pack("<%df" % len(new), *new))
    header, blobs, off = {}, [], 0
    for k in sorted(keep):
        d, s, r = keep[k]
        header[k] = {"dtype": d, "shape": s, "data_offsets": [off, off + len(r)]}
        blobs.append(r)
        off += len(r)
    header["__metadata__"] = {"source": "autoencoder_tiny_taesd_tiny.safetensors (decoder), first conv widened to 16 latent "
                              "channels: W16[o, c] = W4[o, c % 4] / 4 (tools/reference/make_taef1_standin.py)"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(out, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for r in blobs:
            f.write(r)


if __name__ == "__main__":
    main()
