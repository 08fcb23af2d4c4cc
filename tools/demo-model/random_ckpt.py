"""Random-weight original-layout (ldm) SD1.x checkpoint for a demo-model UNet preset, stdlib only.

Lets easel be tried on a new UNet architecture on the CPU before any GPU run: the UNet tensors get
the names and shapes that diffusers' UNet2DConditionModel(**preset) has, renamed to the ldm layout by
tools/reference/ldm_convert.py (the export train.py uses), with small random f16 values; the text
encoder and VAE tensors are copied byte for byte from an existing demo checkpoint.

  python3 tools/demo-model/random_ckpt.py --preset lowattn --from models/demo/easel-demo-shapes.safetensors \
      --out /tmp/lowattn.safetensors
  python3 tools/demo-model/random_ckpt.py --preset v1 --check models/demo/easel-demo-shapes.safetensors
      (the enumeration of v1 must give exactly the shipped file's UNet names and shapes)

Structure facts (names, shapes, channel flow) from diffusers models/unets/unet_2d_condition.py,
unet_2d_blocks.py (CrossAttnDownBlock2D, DownBlock2D, UNetMidBlock2DCrossAttn, CrossAttnUpBlock2D,
UpBlock2D), resnet.py (ResnetBlock2D), transformers/transformer_2d.py (Transformer2DModel, 1x1-conv
proj_in/proj_out when use_linear_projection is False), attention.py (BasicTransformerBlock: attn1,
attn2, GEGLU feed-forward of inner 4x, to_q/to_k/to_v without bias, to_out.0 with bias).
"""

import argparse
import json
import os
import random
import struct
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
sys.modules.setdefault("torch", types.ModuleType("torch"))  # ldm_convert imports torch only for dtypes
import archs  # noqa: E402
import ldm_convert  # noqa: E402


def unet_shapes(cfg):
    """diffusers state-dict names -> shapes of UNet2DConditionModel(**cfg) (SD1.x options only:
    conv projections, GEGLU, default time embedding)."""
    ch = list(cfg["block_out_channels"])
    n = len(ch)
    L = cfg["layers_per_block"]
    ctx = cfg["cross_attention_dim"]
    tl = cfg.get("transformer_layers_per_block", 1)
    tl = [tl] * n if isinstance(tl, int) else list(tl)
    c0 = ch[0]
    temb = 4 * c0
    s = {}

    def lin(name, o, i, bias=True):
        s[name + ".weight"] = [o, i]
        if bias:
            s[name + ".bias"] = [o]

    def conv(name, o, i, k):
        s[name + ".weight"] = [o, i, k, k]
        s[name + ".bias"] = [o]

    def norm(name, c):
        s[name + ".weight"] = [c]
        s[name + ".bias"] = [c]

    def resnet(p, i, o):
        norm(p + ".norm1", i)
        conv(p + ".conv1", o, i, 3)
        lin(p + ".time_emb_proj", o, temb)
        norm(p + ".norm2", o)
        conv(p + ".conv2", o, o, 3)
        if i != o:
            conv(p + ".conv_shortcut", o, i, 1)

    def transformer(p, c, depth):
        norm(p + ".norm", c)
        conv(p + ".proj_in", c, c, 1)
        for d in range(depth):
            b = f"{p}.transformer_blocks.{d}"
            norm(b + ".norm1", c)
            for a, kv in (("attn1", c), ("attn2", ctx)):
                lin(f"{b}.{a}.to_q", c, c, False)
                lin(f"{b}.{a}.to_k", c, kv, False)
                lin(f"{b}.{a}.to_v", c, kv, False)
                lin(f"{b}.{a}.to_out.0", c, c)
            norm(b + ".norm2", c)
            norm(b + ".norm3", c)
            lin(b + ".ff.net.0.proj", 8 * c, c)
            lin(b + ".ff.net.2", c, 4 * c)
        conv(p + ".proj_out", c, c, 1)

    conv("conv_in", c0, cfg["in_channels"], 3)
    lin("time_embedding.linear_1", temb, c0)
    lin("time_embedding.linear_2", temb, temb)
    h, skips = c0, [c0]
    for b, kind in enumerate(cfg["down_block_types"]):
        for j in range(L):
            resnet(f"down_blocks.{b}.resnets.{j}", h, ch[b])
            h = ch[b]
            if kind == "CrossAttnDownBlock2D":
                transformer(f"down_blocks.{b}.attentions.{j}", h, tl[b])
            elif kind != "DownBlock2D":
                raise ValueError(kind)
            skips.append(h)
        if b < n - 1:
            conv(f"down_blocks.{b}.downsamplers.0.conv", h, h, 3)
            skips.append(h)
    resnet("mid_block.resnets.0", h, h)
    transformer("mid_block.attentions.0", h, tl[-1])
    resnet("mid_block.resnets.1", h, h)
    rch, rtl = ch[::-1], tl[::-1]
    for b, kind in enumerate(cfg["up_block_types"]):
        for j in range(L + 1):
            resnet(f"up_blocks.{b}.resnets.{j}", h + skips.pop(), rch[b])
            h = rch[b]
            if kind == "CrossAttnUpBlock2D":
                transformer(f"up_blocks.{b}.attentions.{j}", h, rtl[b])
            elif kind != "UpBlock2D":
                raise ValueError(kind)
        if b < n - 1:
            conv(f"up_blocks.{b}.upsamplers.0.conv", h, h, 3)
    assert not skips
    norm("conv_norm_out", c0)
    conv("conv_out", cfg["out_channels"], c0, 3)
    return s


def numel(shape):
    p = 1
    for d in shape:
        p *= d
    return p


def unet_gflop(cfg, latent=32, tokens=77):
    """Multiply-adds x 2 of one UNet evaluation (batch 1) in GFLOP: convs, linears, attention matmuls."""
    ch = list(cfg["block_out_channels"])
    shapes = unet_shapes(cfg)
    level_of = {}
    n = len(ch)
    for b in range(n):
        level_of[f"down_blocks.{b}."] = b
        level_of[f"up_blocks.{b}."] = n - 1 - b
    level_of["mid_block."] = n - 1
    fl = 0.0
    for name, sh in shapes.items():
        if not name.endswith(".weight") or len(sh) < 2:
            continue
        lev = next((v for k, v in level_of.items() if name.startswith(k)), 0)
        hw = (latent >> lev) ** 2
        if "downsamplers" in name:
            hw //= 4
        if name.startswith("time_embedding"):
            hw = 1
        if ".attn2.to_k" in name or ".attn2.to_v" in name:
            hw = tokens
        fl += 2 * hw * numel(sh)
        if name.endswith(".attn1.to_q.weight"):
            fl += 2 * 2 * hw * hw * sh[0]  # QK^T and AV over hw tokens
        if name.endswith(".attn2.to_q.weight"):
            fl += 2 * 2 * hw * tokens * sh[0]
    return fl / 1e9


def read_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    return h, 8 + n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="lowattn", choices=sorted(archs.UNET_PRESETS))
    ap.add_argument("--from", dest="src", help="demo checkpoint whose text encoder and VAE tensors are copied")
    ap.add_argument("--out", help="file to write")
    ap.add_argument("--check", help="compare the preset's ldm UNet names/shapes with this file's")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    cfg = archs.UNET_PRESETS[a.preset]
    shapes = unet_shapes(cfg)
    up_attn = ["CrossAttn" in t for t in cfg["up_block_types"]]
    ldm = {ldm_convert.UNET_PREFIX + ldm_convert._unet_key(k, cfg["layers_per_block"], up_attn): v
           for k, v in shapes.items()}
    assert len(ldm) == len(shapes)
    params = sum(numel(v) for v in shapes.values())
    print(f"preset {a.preset}: {len(ldm)} UNet tensors, {params / 1e6:.3f} M parameters ({2 * params / 1e6:.2f} MB f16), "
          f"{unet_gflop(cfg):.3f} GFLOP per evaluation at a 32x32 latent")
    if a.check:
        h, _ = read_header(a.check)
        got = {k: v["shape"] for k, v in h.items() if k.startswith(ldm_convert.UNET_PREFIX)}
        missing = sorted(set(got) - set(ldm))
        extra = sorted(set(ldm) - set(got))
        wrong = sorted(k for k in set(got) & set(ldm) if got[k] != ldm[k])
        print(f"check against {a.check}: {len(got)} UNet tensors there; missing {missing[:5]} ({len(missing)}), "
              f"extra {extra[:5]} ({len(extra)}), wrong shapes {wrong[:5]} ({len(wrong)})")
        if missing or extra or wrong:
            sys.exit(1)
    if a.out:
        if not a.src:
            sys.exit("--out needs --from (text encoder and VAE source)")
        h, base = read_header(a.src)
        meta = h.pop("__metadata__", {})
        keep = {k: v for k, v in h.items() if not k.startswith(ldm_convert.UNET_PREFIX)}
        rng = random.Random(a.seed)
        header, blobs, off = {}, [], 0
        with open(a.src, "rb") as f:
            for k in sorted(keep):
                b0, b1 = keep[k]["data_offsets"]
                f.seek(base + b0)
                blobs.append(f.read(b1 - b0))
                header[k] = {"dtype": keep[k]["dtype"], "shape": keep[k]["shape"], "data_offsets": [off, off + b1 - b0]}
                off += b1 - b0
        for k in sorted(ldm):
            sh = ldm[k]
            cnt = numel(sh)
            if k.endswith(".bias"):
                vals = [0.0] * cnt
            elif len(sh) == 1:  # norm weights
                vals = [1.0] * cnt
            else:  # fan-in scaled uniform, as torch's default init
                bound = 1.0 / (numel(sh[1:]) ** 0.5)
                vals = [rng.uniform(-bound, bound) for _ in range(cnt)]
            blob = struct.pack(f"<{cnt}e", *vals)
            blobs.append(blob)
            header[k] = {"dtype": "F16", "shape": sh, "data_offsets": [off, off + len(blob)]}
            off += len(blob)
        meta = dict(meta, easel_model="random-weight test file", unet_preset=a.preset)
        header["__metadata__"] = meta
        hb = json.dumps(header, separators=(",", ":")).encode()
        hb += b" " * ((8 - len(hb) % 8) % 8)
        with open(a.out, "wb") as f:
            f.write(struct.pack("<Q", len(hb)))
            f.write(hb)
            for b in blobs:
                f.write(b)
        print(f"wrote {a.out}: {os.path.getsize(a.out) / 1e6:.2f} MB, {len(header) - 1} tensors")


if __name__ == "__main__":
    main()
