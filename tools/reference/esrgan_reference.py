"""PyTorch references for easel's ESRGAN upscalers (src/models/esrgan): RRDBNet and SRVGGNetCompact.

Both networks are written here from their published definitions (Wang et al., ESRGAN 2018 and Real-ESRGAN
2021; the architecture files of BasicSR / Real-ESRGAN were read, not copied):
  RRDBNet:  [pixel_unshuffle(u) for x2 (u=2) / x1 (u=4)] -> conv_first -> n x RRDB -> conv_body, + conv_first's output
            -> per stage lrelu(conv_up(nearest x2)) -> conv_last(lrelu(conv_hr)); RRDB = 3 dense blocks (5 convs,
            growth channels, lrelu 0.2, residual x 0.2), itself residual x 0.2
  SRVGGNetCompact: conv, PReLU, num_conv x (conv, PReLU), conv to 3*s^2, pixel_shuffle(s) + nearest-upsampled input
Random weights are saved in the real key layouts and run on a fixed input image, in float32 on the CPU (no
TF32 / cuDNN effects). easel's tests (tests/unit/esrgan_torch_test.cpp) compare its outputs within 1/255.

Run on the GPU machine (torch, safetensors, pillow, numpy):
    python3 tools/reference/esrgan_reference.py --out tests/data/reference/esrgan
writes, per case (rrdb_x4, rrdb_x2, rrdb_x4_esrgan, srvgg_x4, srvgg_x2):
  <case>.safetensors       the weights (BasicSR keys; rrdb_x4_esrgan: the original ESRGAN keys)
  <case>.pth               the same weights as Real-ESRGAN ships them: torch.save({'params_ema': sd}) (srvgg:
                           {'params': sd}; rrdb_x4_esrgan: a plain state dict, legacy format)
  <case>_out.safetensors   'output' float32 [1, 3, H*s, W*s] (unclamped) of the whole image
  <case>_out.png           the output as Real-ESRGAN writes it: clamp(0, 1) * 255, rounded
plus input.png (the 8-bit input image, 40x32) and input.safetensors ('input' float32 [1, 3, 32, 40] = png / 255),
cases.json (each case's architecture, sizes, scale) and SOURCE.md (versions; random weights, no third-party data).

The real realesr-animevideov3 file (../shared/models/esrgan-realesr-animevideov3, provenance unverified: never
commit it) is checked by hand:
    python3 tools/reference/esrgan_reference.py --real realesr-animevideov3.pth --image in.png --real-out torch.png \
        [--easel easel.png]
runs the file's network on the image (float32, CPU), writes torch's PNG and, given the PNG easel wrote for the same
input (`easel upscale -i in.png --upscale-model realesr-animevideov3.pth -o easel.png --upscale-tile-size 0`),
prints the largest difference in 1/255 units and how many channel values differ.
"""
import argparse
import json
import os
import platform

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors.torch import save_file


# ---------------------------------------------------------------- the networks
class DenseBlock(torch.nn.Module):
    def __init__(self, feat, grow):
        super().__init__()
        for k in range(5):
            setattr(self, f"conv{k + 1}", torch.nn.Conv2d(feat + k * grow, feat if k == 4 else grow, 3, 1, 1))

    def forward(self, x):
        feats = [x]
        for k in range(4):
            feats.append(F.leaky_relu(getattr(self, f"conv{k + 1}")(torch.cat(feats, 1)), 0.2))
        return self.conv5(torch.cat(feats, 1)) * 0.2 + x


class RRDBlock(torch.nn.Module):
    def __init__(self, feat, grow):
        super().__init__()
        self.rdb1, self.rdb2, self.rdb3 = DenseBlock(feat, grow), DenseBlock(feat, grow), DenseBlock(feat, grow)

    def forward(self, x):
        return self.rdb3(self.rdb2(self.rdb1(x))) * 0.2 + x


class RRDBNet(torch.nn.Module):
    def __init__(self, feat, grow, blocks, scale):
        super().__init__()
        self.unshuffle = {4: 1, 2: 2, 1: 4}[scale]
        self.conv_first = torch.nn.Conv2d(3 * self.unshuffle ** 2, feat, 3, 1, 1)
        self.body = torch.nn.Sequential(*[RRDBlock(feat, grow) for _ in range(blocks)])
        self.conv_body = torch.nn.Conv2d(feat, feat, 3, 1, 1)
        self.conv_up1 = torch.nn.Conv2d(feat, feat, 3, 1, 1)
        self.conv_up2 = torch.nn.Conv2d(feat, feat, 3, 1, 1)
        self.conv_hr = torch.nn.Conv2d(feat, feat, 3, 1, 1)
        self.conv_last = torch.nn.Conv2d(feat, 3, 3, 1, 1)

    def forward(self, x):
        if self.unshuffle > 1:
            x = F.pixel_unshuffle(x, self.unshuffle)
        feat = self.conv_first(x)
        feat = feat + self.conv_body(self.body(feat))
        feat = F.leaky_relu(self.conv_up1(F.interpolate(feat, scale_factor=2, mode="nearest")), 0.2)
        feat = F.leaky_relu(self.conv_up2(F.interpolate(feat, scale_factor=2, mode="nearest")), 0.2)
        return self.conv_last(F.leaky_relu(self.conv_hr(feat), 0.2))


class SRVGGNetCompact(torch.nn.Module):
    def __init__(self, feat, num_conv, scale):
        super().__init__()
        self.scale = scale
        layers = [torch.nn.Conv2d(3, feat, 3, 1, 1), torch.nn.PReLU(feat)]
        for _ in range(num_conv):
            layers += [torch.nn.Conv2d(feat, feat, 3, 1, 1), torch.nn.PReLU(feat)]
        layers.append(torch.nn.Conv2d(feat, 3 * scale * scale, 3, 1, 1))
        self.body = torch.nn.ModuleList(layers)

    def forward(self, x):
        out = x
        for layer in self.body:
            out = layer(out)
        return F.pixel_shuffle(out, self.scale) + F.interpolate(x, scale_factor=self.scale, mode="nearest")


def esrgan_keys(sd, blocks):
    """BasicSR RRDBNet keys -> the original ESRGAN repo's (model.0, model.1.sub.N.RDBk.convj.0, model.3/6/8/10)."""
    out = {}
    for k, v in sd.items():
        base, leaf = k.rsplit(".", 1)
        if base == "conv_first":
            n = "model.0"
        elif base == "conv_body":
            n = f"model.1.sub.{blocks}"
        elif base == "conv_up1":
            n = "model.3"
        elif base == "conv_up2":
            n = "model.6"
        elif base == "conv_hr":
            n = "model.8"
        elif base == "conv_last":
            n = "model.10"
        else:
            _, b, r, c = base.split(".")
            n = f"model.1.sub.{b}.RDB{r[3:]}.conv{c[4:]}.0"
        out[n + "." + leaf] = v
    return out


def randomize(net, seed):
    """Uniform weights of about the default init's size (bound 1/sqrt(fan_in)); PReLU slopes in [0, 0.5)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, torch.nn.PReLU):
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) * 0.5)
            elif isinstance(m, torch.nn.Conv2d):
                b = 1.0 / m.weight[0].numel() ** 0.5
                m.weight.copy_((torch.rand(m.weight.shape, generator=g) * 2 - 1) * b)
                m.bias.copy_((torch.rand(m.bias.shape, generator=g) * 2 - 1) * b)
    return net


def test_image(h=32, w=40):
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([0.5 + 0.4 * np.sin(0.37 * x + 0.23 * y * (c + 1)) * np.cos(0.11 * (x - y) + c) for c in range(3)], -1)
    return np.clip(np.round(img * 255), 0, 255).astype(np.uint8)


def to_png(t):
    a = (t[0].clamp(0, 1) * 255.0).round().to(torch.uint8).permute(1, 2, 0).numpy()
    return Image.fromarray(a)


def make_cases(out):
    os.makedirs(out, exist_ok=True)
    img = test_image()
    Image.fromarray(img).save(os.path.join(out, "input.png"))
    x = torch.from_numpy(img).permute(2, 0, 1)[None].float() / 255.0
    save_file({"input": x.contiguous()}, os.path.join(out, "input.safetensors"))
    cases = {}
    specs = [("rrdb_x4", lambda: RRDBNet(16, 8, 3, 4), 11), ("rrdb_x2", lambda: RRDBNet(16, 8, 3, 2), 12),
             ("srvgg_x4", lambda: SRVGGNetCompact(16, 4, 4), 13), ("srvgg_x2", lambda: SRVGGNetCompact(16, 3, 2), 14)]
    for name, make, seed in specs:
        net = randomize(make().eval(), seed)
        sd = {k: v.contiguous() for k, v in net.state_dict().items()}
        with torch.no_grad():
            y = net(x)
        wrapper = "params" if name.startswith("srvgg") else "params_ema"
        save_file(sd, os.path.join(out, name + ".safetensors"))
        torch.save({wrapper: sd}, os.path.join(out, name + ".pth"))
        save_file({"output": y.contiguous()}, os.path.join(out, name + "_out.safetensors"))
        to_png(y).save(os.path.join(out, name + "_out.png"))
        cases[name] = {"arch": type(net).__name__, "scale": net.scale if hasattr(net, "scale") else {1: 4, 2: 2, 4: 1}[net.unshuffle],
                       "input": list(x.shape), "output": list(y.shape), "wrapper": wrapper}
        if name == "rrdb_x4":  # the same weights under the original ESRGAN keys, legacy torch.save
            old = {k: v for k, v in esrgan_keys(sd, 3).items()}
            save_file(old, os.path.join(out, "rrdb_x4_esrgan.safetensors"))
            torch.save(old, os.path.join(out, "rrdb_x4_esrgan.pth"), _use_new_zipfile_serialization=False)
            save_file({"output": y.contiguous()}, os.path.join(out, "rrdb_x4_esrgan_out.safetensors"))
            to_png(y).save(os.path.join(out, "rrdb_x4_esrgan_out.png"))
            cases["rrdb_x4_esrgan"] = dict(cases[name], wrapper="")
    with open(os.path.join(out, "cases.json"), "w") as f:
        json.dump(cases, f, indent=1, sort_keys=True)
        f.write("\n")
    with open(os.path.join(out, "SOURCE.md"), "w") as f:
        f.write("# ESRGAN references (random weights)\n\nMade by tools/reference/esrgan_reference.py with torch "
                f"{torch.__version__}, python {platform.python_version()}, float32 on the CPU. Random, seeded weights in the "
                "real key layouts; the input is a synthetic pattern. No third-party weights or images.\n")
    print("wrote", len(cases), "cases to", out)


def run_real(path, image, out_png, easel_png):
    sd = torch.load(path, map_location="cpu", weights_only=True)
    sd = sd.get("params_ema", sd.get("params", sd))
    convs = sorted(int(k.split(".")[1]) for k in sd if k.startswith("body.") and sd[k].dim() == 4)
    feat, last = sd["body.0.weight"].shape[0], convs[-1]
    scale = int(round((sd[f"body.{last}.weight"].shape[0] / 3) ** 0.5))
    net = SRVGGNetCompact(feat, last // 2 - 1, scale).eval()
    net.load_state_dict(sd)
    img = np.array(Image.open(image).convert("RGB")) if image else test_image(64, 96)
    x = torch.from_numpy(img).permute(2, 0, 1)[None].float() / 255.0
    with torch.no_grad():
        y = net(x)
    to_png(y).save(out_png)
    print(f"{path}: SRVGGNetCompact x{scale}, {feat} features, {last // 2 - 1} body convs; {img.shape[1]}x{img.shape[0]} -> "
          f"{y.shape[3]}x{y.shape[2]}; wrote {out_png}")
    if easel_png:
        a = np.array(Image.open(out_png).convert("RGB")).astype(np.int32)
        b = np.array(Image.open(easel_png).convert("RGB")).astype(np.int32)
        if a.shape != b.shape:
            print(f"easel's image is {b.shape[1]}x{b.shape[0]}, torch's {a.shape[1]}x{a.shape[0]}")
            return
        d = np.abs(a - b)
        print(f"max |torch - easel| = {d.max()}/255; values differing: {(d > 0).sum()} of {d.size}; differing by more than 1: {(d > 1).sum()}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", help="folder for the random-weight cases")
    ap.add_argument("--real", help="a real SRVGGNetCompact .pth (realesr-animevideov3) to run")
    ap.add_argument("--image", help="input image for --real (default: a 96x64 synthetic pattern)")
    ap.add_argument("--real-out", default="torch_real.png")
    ap.add_argument("--easel", help="easel's output PNG for the same input, to compare with")
    a = ap.parse_args()
    torch.set_grad_enabled(False)
    if a.out:
        make_cases(a.out)
    if a.real:
        run_real(a.real, a.image, a.real_out, a.easel)
    if not a.out and not a.real:
        ap.error("give --out FOLDER and/or --real FILE")
