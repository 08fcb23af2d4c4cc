"""Train the easel demo model (SD1.x architecture in miniature) on the procedural shapes dataset.

Stages (each fits one 10-minute GPU run; fixed seeds; --time bounds the wall-clock training; on a machine
without CUDA everything runs on the CPU in float32, for smoke tests: `--steps 3 --batch 4`):
  python train.py vae  --out DIR --time 170 [--vae-arch gn3 --crop 128]
      AutoencoderKL (archs.VAE_PRESETS: v1 = runs 1-10, gn3 = run 11; 4 latent channels, factor 8, 32 norm
      groups) on 256x256 images (with --crop C: random C x C crops of them, biased towards the object, for all
      but the last --full-frac of the time); loss = L1 + --edge-weight * L1 of the horizontal and vertical pixel
      differences (edges sharp and in place) + 1e-6 * KL (SD's LPIPSWithDiscriminator sum convention, divided
      through by 3*H*W) + --outlier-weight * mean(relu(|z| - 5)^2) of the latent standardised per channel (no
      latent cell of extreme value: the v1 VAE hid the image's colour level in one, see archs.py).
      Then the VAE is *normalised*: latents are multiplied by k so that 0.18215 * latent has unit std
      (quant_conv mean rows and bias * k, logvar bias + 2 ln k, post_quant_conv weight / k), so the
      standard SD1.x scaling_factor 0.18215 is right. Then measured: L1, the scorer (score.py) on
      reconstructions of procedural pictures (colour, shape, speck, frame: the ceiling of any UNet on this VAE),
      flat-colour pictures, latent outliers. Writes DIR/vae.safetensors, vae_config.json, loss-log-vae.csv,
      vae_check.png (top: pictures, bottom: reconstructions).
  python train.py unet --vae DIR --out DIR2 --time 420 --tok TOKDIR
      CLIP text encoder (archs.TE_PRESETS: width 128 or 64, 3 layers, quick_gelu, vocab 49408, 77 positions) and
      UNet2DConditionModel (archs.UNET_PRESETS) trained together from scratch (or --resume FILE: all three models
      from an exported file, its architecture from the file's metadata), then the exported f16 original-layout
      file, settings chosen and accuracy measured (below).
      Options (earlier runs in tools/demo-model/README.md): --pool N (encode N pictures once, sample batches
      from the latents), --fused, --channels-last auto, --batch auto (times the candidate batch sizes and memory
      formats and takes the fastest per sample; the LR scales with sqrt(batch / 256)), --zsnr (zero-terminal-
      SNR betas, v-prediction), --offset-noise, --pyramid-noise, --min-snr, --vae-from FILE, --arch / --te-arch.
      Run 11 on: --obj-weight W (loss weight 1 + W on the latent cells the object covers: a small object is 2 %
      of the latent), --phrasings P and --hard-pairs H (shapes.py), --ema D1,D2 (several EMAs; the exported
      weights are the best of them and the raw weights on 64 prompts), --ckpt-every S (an f16 export of the
      first EMA every S seconds: what to resume from if the run is cut short), --end-by / --reserve (the whole
      job ends by a Unix time), --compile (torch.compile the training step).
      After training (export_and_sample): the weights are rounded to f16 and exported; sampler and CFG scale
      are chosen from --settings on 64 in-distribution and 64 held-out-pair prompts (score: mean of background,
      colour, shape, side, size and clean); the file's metadata records them (easel.sampler, easel.scheduler,
      easel.cfg_scale, easel.steps, easel.width, easel.height: docs/formats.md) so easel uses them when the user
      gives none; then the held-out phrasings, the test prompts, the model-card samples and the parity
      references (CPU, float32) at those settings. Everything in DIR2/train_summary.json.
"""

import argparse
import contextlib
import csv
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import archs  # noqa: E402
import score  # noqa: E402
import shapes  # noqa: E402

SCALE = 0.18215
VAE_BASE = dict(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
                up_block_types=("UpDecoderBlock2D",) * 4, latent_channels=4, norm_num_groups=32, sample_size=256,
                scaling_factor=SCALE)
VAE_CFG = dict(VAE_BASE, **archs.VAE_PRESETS["v1"])  # main() sets it from --vae-arch (or the resumed file)
TE_BASE = dict(vocab_size=49408, num_hidden_layers=3, max_position_embeddings=77, hidden_act="quick_gelu",
               layer_norm_eps=1e-5, bos_token_id=49406, eos_token_id=49407, pad_token_id=49407)
TE_CFG = dict(TE_BASE, projection_dim=128, **archs.TE_PRESETS["w128"])  # main(): --te-arch
UNET_CFG = archs.V1  # main(): --arch, cross_attention_dim = the text encoder's width
SCHED = dict(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
             prediction_type="epsilon", timestep_spacing="linspace", steps_offset=1)
DEV = "cuda" if torch.cuda.is_available() else "cpu"
EVAL_SIZE = 256  # the pictures sampled for scoring, samples and references (--smoke: 64)


def log(*a):
    print(*a, flush=True)


def autocast():
    """bf16 autocast on CUDA; float32 on the CPU (smoke tests)."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if DEV == "cuda" else contextlib.nullcontext()


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def set_arch(vae_cfg=None, te_cfg=None, unet_cfg=None):
    """Sets the module configs (dicts as archs.py / a file's metadata give them)."""
    global VAE_CFG, TE_CFG, UNET_CFG
    if vae_cfg is not None:
        VAE_CFG = dict(VAE_BASE, **{k: (tuple(v) if isinstance(v, list) else v) for k, v in vae_cfg.items()})
    if te_cfg is not None:
        TE_CFG = dict(TE_BASE, **te_cfg)
        TE_CFG["projection_dim"] = TE_CFG["hidden_size"]
    if unet_cfg is not None:
        UNET_CFG = {k: (tuple(v) if isinstance(v, list) else v) for k, v in unet_cfg.items()}
    UNET_CFG = dict(UNET_CFG, cross_attention_dim=TE_CFG["hidden_size"])


def lr_at(step, total, peak, warmup):
    if step < warmup:
        return peak * (step + 1) / warmup
    p = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


class Schedule:
    """Cosine LR with warmup over est_total steps; with a time budget, est_total is re-estimated once
    from the measured step rate (steps 20..60) so the schedule ends with the budget."""

    def __init__(self, peak, warmup, est_total, time_budget):
        self.peak, self.warmup, self.total, self.budget = peak, warmup, est_total, time_budget
        self.t20 = None

    def lr(self, step, elapsed):
        if self.budget and step == 20:
            self.t20 = elapsed
        if self.budget and step == 60 and self.t20 is not None:
            rate = 40 / max(1e-6, elapsed - self.t20)
            self.total = int(60 + rate * max(0.0, self.budget - elapsed))
            log(f"schedule: {rate:.2f} steps/s, laying the LR schedule out over {self.total} steps")
        return lr_at(step, self.total, self.peak, self.warmup)


def time_options(name, run, options, reps=3):
    """Times run(option) (one forward + backward, no optimizer step) for each option: 2 warm-up calls, then
    the mean of `reps`. Returns {option: seconds}."""
    res = {}
    for opt in options:
        for i in range(2 + reps):
            if i == 2:
                sync()
                t0 = time.time()
            run(opt)
        sync()
        res[opt] = (time.time() - t0) / reps
    log(f"{name}: " + ", ".join(f"{o}: {s * 1e3:.1f} ms" for o, s in res.items()))
    return res


# ---------------------------------------------------------------------------------------------- VAE stage

def make_vae():
    from diffusers import AutoencoderKL

    return AutoencoderKL(**VAE_CFG)


def object_crops(x, attrs, size, gen):
    """Random size x size crops of x [B, C, H, W]: 70 % centred on the object (jittered by up to 3/8 of the
    crop), the rest anywhere."""
    B, C, H, W = x.shape
    u = torch.rand((B, 3), generator=gen).tolist()
    oy, ox = [], []
    for (a, (r0, r1, r2)) in zip(attrs, u):
        if r0 < 0.7:
            px, py = shapes.POSITION_XY[a["pos"]]
            cy = py * H + (r1 - 0.5) * 0.75 * size
            cx = px * W + (r2 - 0.5) * 0.75 * size
        else:
            cy, cx = size / 2 + r1 * (H - size), size / 2 + r2 * (W - size)
        oy.append(int(min(max(cy - size / 2, 0), H - size)))
        ox.append(int(min(max(cx - size / 2, 0), W - size)))
    ar = torch.arange(size, device=x.device)
    iy = (torch.tensor(oy, device=x.device)[:, None] + ar)[:, None, :, None].expand(B, C, size, W)
    x = x.gather(2, iy)
    ix = (torch.tensor(ox, device=x.device)[:, None] + ar)[:, None, None, :].expand(B, C, size, size)
    return x.gather(3, ix)


def vae_loss(vae, x, a):
    """One VAE training loss (module docstring) -> (loss, {term: value})."""
    with autocast():
        post = vae.encode(x).latent_dist
        rec = vae.decode(post.sample()).sample
    rec = rec.float()
    l1 = (rec - x).abs().mean()
    edge = ((rec[..., :, 1:] - rec[..., :, :-1]) - (x[..., :, 1:] - x[..., :, :-1])).abs().mean() + \
           ((rec[..., 1:, :] - rec[..., :-1, :]) - (x[..., 1:, :] - x[..., :-1, :])).abs().mean()
    kl_sum = post.kl().float().mean()  # summed over the latent's elements, mean over the batch
    zm = post.mean.float()
    zs = (zm - zm.mean(dim=(0, 2, 3), keepdim=True)) / (zm.std(dim=(0, 2, 3), keepdim=True) + 1e-6)
    outl = F.relu(zs.abs() - 5).square().mean()
    loss = l1 + a.edge_weight * edge + 1e-6 * kl_sum / (3 * x.shape[2] * x.shape[3]) + a.outlier_weight * outl
    return loss, {"l1": l1, "edge": edge, "kl": kl_sum / zm[0].numel(), "outl": outl, "zmax": zs.abs().max()}


def train_vae(a):
    from safetensors.torch import save_file

    dev = DEV
    torch.manual_seed(0)
    vae = make_vae()
    if a.init:  # continue training from an earlier run's vae.safetensors
        from safetensors.torch import load_file

        vae.load_state_dict(load_file(os.path.join(a.init, "vae.safetensors")))
        log(f"vae: continuing from {a.init}")
    vae = vae.to(dev)
    nparam = sum(p.numel() for p in vae.parameters())
    log(f"vae {a.vae_arch}: {VAE_CFG['block_out_channels']}, {VAE_CFG['layers_per_block']} resnets per level; "
        f"params {nparam / 1e6:.2f} M; device {dev}")
    opt = torch.optim.AdamW(vae.parameters(), lr=a.lr, betas=(0.9, 0.99), weight_decay=0.0,
                            **({"fused": True} if a.fused and dev == "cuda" else {}))
    cg = torch.Generator().manual_seed(1)
    dg = torch.Generator(device=dev).manual_seed(2)
    crop_gen = torch.Generator().manual_seed(7)
    crop = a.crop if a.crop and a.crop < 256 else 0
    bcrop = a.batch
    bfull = max(2, a.batch * crop * crop // (256 * 256)) if crop else a.batch

    def data(full):
        B = bfull if (full or not crop) else bcrop
        x, _, attrs = shapes.batch(B, 256, dev, cg, dg)
        if crop and not full:
            x = object_crops(x, attrs, crop, crop_gen)
        return x

    if a.channels_last == "auto" and dev == "cuda":
        x0 = data(False)

        def run(fmt):
            vae.to(memory_format=torch.channels_last if fmt == "yes" else torch.contiguous_format)
            xx = x0.contiguous(memory_format=torch.channels_last) if fmt == "yes" else x0.contiguous()
            vae_loss(vae, xx, a)[0].backward()

        t = time_options("vae fwd+bwd, channels_last", run, ["no", "yes"])
        vae.zero_grad(set_to_none=True)
        a.channels_last = "yes" if t["yes"] < 0.95 * t["no"] else "no"
    cl = a.channels_last == "yes" and dev == "cuda"
    vae.to(memory_format=torch.channels_last if cl else torch.contiguous_format)
    os.makedirs(a.out, exist_ok=True)
    f = open(os.path.join(a.out, "loss-log-vae.csv"), "w", newline="")
    w = csv.writer(f)
    w.writerow(["step", "elapsed_s", "lr", "loss", "l1", "edge", "kl", "outlier", "zmax", "crop"])
    if a.end_by:
        avail = a.end_by - time.time() - a.reserve
        if avail < a.time:
            log(f"vae training time {a.time:.0f}s -> {avail:.0f}s (--end-by, {a.reserve:.0f}s reserved)")
            a.time = max(10.0, avail)
    t0 = time.time()
    step = 0
    sched = Schedule(a.lr, a.warmup if a.warmup is not None else 100, a.steps or a.est_steps, 0 if a.steps else a.time)
    full_from = (a.steps or 0) * (1 - a.full_frac)
    while True:
        el = time.time() - t0
        if (a.steps and step >= a.steps) or (not a.steps and el > a.time):
            break
        full = (step >= full_from) if a.steps else (el >= a.time * (1 - a.full_frac))
        lr = sched.lr(step, el)
        for g in opt.param_groups:
            g["lr"] = lr
        x = data(full)
        if cl:
            x = x.contiguous(memory_format=torch.channels_last)
        loss, terms = vae_loss(vae, x, a)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        opt.step()
        if step % 25 == 0:
            tv = {k: v.item() for k, v in terms.items()}
            w.writerow([step, f"{el:.1f}", f"{lr:.3e}", f"{loss.item():.5f}", f"{tv['l1']:.5f}", f"{tv['edge']:.5f}",
                        f"{tv['kl']:.4f}", f"{tv['outl']:.5f}", f"{tv['zmax']:.2f}", x.shape[-1]])
            if step % 200 == 0 or step in (25, 50, 100):
                log(f"vae step {step} t {el:.0f}s {x.shape[-1]}px loss {loss.item():.4f} l1 {tv['l1']:.4f} "
                    f"edge {tv['edge']:.4f} kl/elem {tv['kl']:.3f} zmax {tv['zmax']:.1f}")
        step += 1
    sync()
    f.close()
    train_s = time.time() - t0
    log(f"vae: {step} steps in {train_s:.0f}s, batch {bcrop} at {crop or 256}px / {bfull} at 256px")
    vae.eval()
    vae.to(memory_format=torch.contiguous_format)
    small = DEV == "cpu"  # smoke tests on the CPU: a few pictures only
    k, std = normalise_vae(vae, 16 if small else 512)
    summary = {"arch": a.vae_arch, "config": VAE_CFG, "steps": step, "train_s": train_s, "batch": bcrop,
               "batch_full": bfull, "crop": crop, "full_frac": a.full_frac, "lr": a.lr, "edge_weight": a.edge_weight,
               "outlier_weight": a.outlier_weight, "channels_last": a.channels_last, "latent_std_before": std,
               "normalise_k": k}
    summary.update(check_vae(vae, os.path.join(a.out, "vae_check.png"), 8 if small else 64))
    log("vae check: " + json.dumps({k_: v for k_, v in summary.items() if k_ not in ("config",)}, default=str))
    sd = {k_: v.detach().float().cpu().contiguous() for k_, v in vae.state_dict().items()}
    save_file(sd, os.path.join(a.out, "vae.safetensors"))
    with open(os.path.join(a.out, "vae_config.json"), "w") as f:
        json.dump(summary, f, indent=1, default=str)


@torch.no_grad()
def normalise_vae(vae, n=512):
    """Rescales the latent so that SCALE * latent has unit std over n pictures (module docstring)."""
    zs = []
    eg = torch.Generator(device=DEV).manual_seed(99)
    ecg = torch.Generator().manual_seed(98)
    for _ in range(max(1, n // 64)):
        x, _, _ = shapes.batch(min(64, n), 256, DEV, ecg, eg)
        with autocast():
            zs.append(vae.encode(x).latent_dist.sample().float())
    z = torch.cat(zs)
    std = z.std().item()
    k = (1.0 / SCALE) / std
    C = VAE_CFG["latent_channels"]
    qc, pqc = vae.quant_conv, vae.post_quant_conv
    qc.weight[:C] *= k
    qc.bias[:C] *= k
    qc.bias[C:] += 2 * math.log(k)
    pqc.weight /= k
    log(f"vae: latent std {std:.4f} (per channel {[round(v, 3) for v in z.std(dim=(0, 2, 3)).tolist()]}); "
        f"normalised by k={k:.4f}")
    return k, std


@torch.no_grad()
def check_vae(vae, png=None, n=64):
    """The VAE measured on n procedural pictures (not the training ones; held-out pairs too) and the 12 flat
    palette colours: L1 (mean latent), the scorer on the reconstructions, the largest latent value in standard
    deviations of its channel, std of 0.18215 * latent."""
    cg = torch.Generator().manual_seed(4321)
    dg = torch.Generator(device=DEV).manual_seed(4322)
    attrs, _ = shapes.sample_attributes(n, cg, allow_heldout=True)
    x = shapes.render(attrs, 256, DEV, dg)
    flat = torch.stack([torch.tensor(shapes.COLOURS[c], device=DEV)[:, None, None].expand(3, 256, 256)
                        for c in shapes.COLOUR_NAMES]) * 2 - 1
    outs = {}
    for name, xx in (("pictures", x), ("flat", flat)):
        recs, zs = [], []
        for i in range(0, len(xx), 16):
            post = vae.encode(xx[i:i + 16]).latent_dist
            zs.append(post.mean.float())
            recs.append(vae.decode(post.mean).sample.float())
        rec, z = torch.cat(recs), torch.cat(zs)
        zs_ = (z - z.mean(dim=(0, 2, 3), keepdim=True)) / z.std(dim=(0, 2, 3), keepdim=True)
        outs[name] = (rec, z)
        outs[name + "_l1"] = (rec - xx).abs().mean().item()
        outs[name + "_zmax_std"] = zs_.abs().max().item()
        outs[name + "_scaled_std"] = (z * SCALE).std().item()
    res = {"eval_l1": outs["pictures_l1"], "flat_l1": outs["flat_l1"], "latent_max_std": outs["pictures_zmax_std"],
           "scaled_latent_std": outs["pictures_scaled_std"]}
    rec = ((outs["pictures"][0] + 1) / 2).clamp(0, 1)
    tally = {k: 0 for k in score.ATTRS + ("clean",)}
    specks = frames = 0
    edge = 0.0
    for at, r in zip(attrs, rec.cpu()):
        an = score.analyse(r)
        ch = score.check(at, an)
        for k in tally:
            tally[k] += int(ch[k])
        specks += int(an["speck"])
        frames += int(an["frame_flag"])
        edge += an["edge_px"] or 0.0
    res["reconstruction_scores"] = {k: v / n for k, v in tally.items()}
    res["reconstruction_speck_rate"] = specks / n
    res["reconstruction_frame_rate"] = frames / n
    res["reconstruction_edge_px"] = edge / n
    fr = ((outs["flat"][0] + 1) / 2).clamp(0, 1)
    res["flat_frame"] = max(score.analyse(r)["frame"] for r in fr.cpu())
    if png:
        from PIL import Image
        import numpy as np

        def row(t):
            return np.concatenate([(((u + 1) / 2).clamp(0, 1) * 255).round().byte().permute(1, 2, 0).cpu().numpy()
                                   for u in t], 1)

        top = row(torch.cat([x[:8], flat[[0, 3, 7, 11]]]))
        bot = row(torch.cat([outs["pictures"][0][:8], outs["flat"][0][[0, 3, 7, 11]]]))
        Image.fromarray(np.concatenate([top, bot], 0)).resize((12 * 96, 192), Image.LANCZOS).save(png)
    return res


# ---------------------------------------------------------------------------------------------- UNet stage

def pyramid_noise(eps, discount, gen):
    """Multi-resolution ("pyramid") noise (J. Whitaker 2023; kohya-ss sd-scripts' multires noise):
    eps [B, C, H, W] plus, for i = 1, 2, ... while H / 2^i >= 1, discount^i times fresh N(0, 1) noise of
    size H / 2^i bilinearly upsampled to H x W, then divided by its std per sample (over C, H, W)."""
    B, C, H, W = eps.shape
    out, s, i = eps, H, 1
    while s > 1:
        s //= 2
        lo = torch.randn((B, C, s, s), device=eps.device, generator=gen)
        out = out + discount ** i * F.interpolate(lo, size=(H, W), mode="bilinear", align_corners=False)
        i += 1
    return out / out.std(dim=(1, 2, 3), keepdim=True)


class EMA:
    def __init__(self, params, decay):
        self.params = list(params)
        self.shadow = [p.detach().clone().float() for p in self.params]
        self.decay = decay

    @torch.no_grad()
    def update(self, step):
        d = min(self.decay, (1 + step) / (10 + step))
        torch._foreach_mul_(self.shadow, d)
        torch._foreach_add_(self.shadow, [p.detach().float() for p in self.params], alpha=1 - d)

    @torch.no_grad()
    def copy_to(self):
        for p, s in zip(self.params, self.shadow):
            p.copy_(s)


class CaptionIds:
    """Caption -> [77] token ids (BOS ... EOS, padded with <|endoftext|> 49407), cached."""

    def __init__(self, tok_dir):
        from transformers import CLIPTokenizer

        self.tok = CLIPTokenizer.from_pretrained(tok_dir, model_max_length=77)
        self.cache = {}

    def __call__(self, caps, device):
        new = sorted({c for c in caps if c not in self.cache})
        if new:
            ids = self.tok(new, padding="max_length", max_length=77, truncation=True)["input_ids"]
            self.cache.update(zip(new, ids))
        return torch.tensor([self.cache[c] for c in caps], device=device)


def load_vae(vae_dir, dev, a=None):
    """DIR/vae.safetensors of the vae stage; its architecture from DIR/vae_config.json (sets VAE_CFG)."""
    from safetensors.torch import load_file

    cfg_path = os.path.join(vae_dir, "vae_config.json")
    if os.path.exists(cfg_path):
        with open(cfg_path) as f:
            info = json.load(f)
        set_arch(vae_cfg={k: info["config"][k] for k in ("block_out_channels", "layers_per_block")})
        if a is not None:
            a.vae_arch = info.get("arch", a.vae_arch)
            a.vae_steps = f"{info.get('steps')} (batch {info.get('batch')}, crop {info.get('crop')})"
    vae = make_vae()
    vae.load_state_dict(load_file(os.path.join(vae_dir, "vae.safetensors")))
    return vae.to(dev).eval()


def build_pool(vae, ids_of, dev, n, budget_s, a, chunk=512):
    """Draw up to n training pictures (shapes.batch with --phrasings / --hard-pairs, fixed seeds), encode them
    once with the frozen VAE (bf16 autocast, batches of `chunk`) and keep 0.18215 * the posterior mean and std
    (float32, [n, 4, 32, 32]), the object's coverage of each latent cell (uint8 0..255, [n, 1, 32, 32]) and the
    caption token ids ([n, 77]). Stops early when budget_s seconds have passed. Training then samples batches
    from this pool, drawing a fresh posterior sample each time."""
    t0 = time.time()
    cg = torch.Generator().manual_seed(3)
    dg = torch.Generator(device=dev).manual_seed(4)
    chunk = min(chunk, n)
    means, stds, ids, cov = [], [], [], []
    with torch.no_grad(), autocast():
        while len(means) * chunk < n:
            x, caps, _, alpha = shapes.batch(chunk, 256, dev, cg, dg, phrasings=a.phrasings, hard_pairs=a.hard_pairs,
                                             return_alpha=True)
            post = vae.encode(x).latent_dist
            means.append((post.mean.float() * SCALE).contiguous())
            stds.append((post.std.float() * SCALE).contiguous())
            cov.append((F.avg_pool2d(alpha.float(), 8) * 255).round().to(torch.uint8))
            ids.append(ids_of(caps, dev))
            if len(means) in (1, 4):
                sync()
                log(f"pool: {len(means) * chunk} encoded in {time.time() - t0:.1f}s")
            if time.time() - t0 > budget_s:
                break
    pool = {"mean": torch.cat(means), "std": torch.cat(stds), "ids": torch.cat(ids), "cov": torch.cat(cov)}
    sync()
    pool["n"] = pool["mean"].shape[0]
    pool["seconds"] = time.time() - t0
    log(f"pool: {pool['n']} latents in {pool['seconds']:.1f}s ({len(ids_of.cache)} distinct captions); "
        f"std of 0.18215*mean {pool['mean'].std().item():.3f}, mean posterior std {pool['std'].mean().item():.4f}, "
        f"object share of the latent {pool['cov'].float().mean().item() / 255:.3f}")
    return pool


def file_meta(path):
    """The __metadata__ of a safetensors file (stdlib)."""
    import struct

    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)).get("__metadata__", {}) or {}


def train_unet(a):
    from diffusers import UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    dev = DEV
    if a.resume:  # the architecture of the file being continued (its metadata), whatever the flags say
        meta = file_meta(a.resume)
        set_arch(vae_cfg=json.loads(meta["vae_config"]) if "vae_config" in meta else archs.VAE_PRESETS["v1"],
                 te_cfg=json.loads(meta["te_config"]) if "te_config" in meta else archs.TE_PRESETS["w128"],
                 unet_cfg=json.loads(meta["unet_config"]))
        a.arch = meta.get("unet_preset", a.arch)
        a.te_arch = meta.get("te_preset", "w128")
        a.vae_arch = meta.get("vae_preset", "v1")
        a.vae_steps = meta.get("train_steps_vae", a.vae_steps)
        a.history = a.history or meta.get("train_steps_unet", "")
    elif a.vae_from:
        meta = file_meta(a.vae_from)
        if "vae_config" in meta:
            set_arch(vae_cfg=json.loads(meta["vae_config"]))
            a.vae_arch = meta.get("vae_preset", a.vae_arch)
    torch.manual_seed(10)
    te = CLIPTextModel(CLIPTextConfig(**TE_CFG))
    torch.manual_seed(11)
    unet = UNet2DConditionModel(**UNET_CFG)
    if a.resume:  # continue from an exported single file (all three models, f16 values)
        import ldm_convert
        from safetensors.torch import load_file

        vae = make_vae()
        # the v_pred / ztsnr marker tensors of a --zsnr export are no model parameters
        ldm = ldm_convert.fix_te_keys({k: v for k, v in load_file(a.resume).items() if k not in ("v_pred", "ztsnr")})
        comps = ldm_convert.ldm_to_components(ldm, unet, vae, te)
        for name, m in (("unet", unet), ("vae", vae), ("text_encoder", te)):
            sd = {k: v.float() for k, v in comps[name].items()}
            missing, unexpected = m.load_state_dict(sd, strict=False)
            assert not unexpected and all(k.endswith("position_ids") for k in missing), (name, missing, unexpected)
        vae = vae.to(dev).eval()
        log(f"resumed from {a.resume}")
    elif a.vae_from:  # the VAE of an exported single file (its first_stage_model.* tensors); te + UNet new
        import ldm_convert
        from safetensors.torch import load_file

        vae = make_vae()
        ldm = {k: v for k, v in load_file(a.vae_from).items() if k.startswith("first_stage_model.")}
        comps = ldm_convert.ldm_to_components(ldm, unet, vae, te)
        vae.load_state_dict({k: v.float() for k, v in comps["vae"].items()}, strict=True)
        vae = vae.to(dev).eval()
        log(f"vae from {a.vae_from} ({len(ldm)} tensors); text encoder and UNet from scratch")
    else:
        vae = load_vae(a.vae, dev, a)
    vae.requires_grad_(False)
    te, unet = te.to(dev), unet.to(dev)
    log(f"unet {a.arch} {UNET_CFG['block_out_channels']} params {sum(p.numel() for p in unet.parameters()) / 1e6:.2f} M, "
        f"te {a.te_arch} (width {TE_CFG['hidden_size']}) params {sum(p.numel() for p in te.parameters()) / 1e6:.2f} M, "
        f"vae {a.vae_arch} {VAE_CFG['block_out_channels']}; device {dev}")
    try:
        from torch.utils.flop_counter import FlopCounterMode

        with torch.no_grad(), FlopCounterMode(display=False) as fc:
            unet(torch.zeros(1, 4, 32, 32, device=dev), torch.tensor([500], device=dev),
                 encoder_hidden_states=torch.zeros(1, 77, TE_CFG["hidden_size"], device=dev))
        log(f"unet GFLOP per evaluation at 32x32 latent (batch 1): {fc.get_total_flops() / 1e9:.3f}")
        with torch.no_grad(), FlopCounterMode(display=False) as fc:
            vae.decode(torch.zeros(1, 4, 32, 32, device=dev))
        log(f"vae decoder GFLOP at 256x256: {fc.get_total_flops() / 1e9:.3f}")
    except Exception as e:  # noqa: BLE001  (torch < 2.1 has no flop counter)
        log("flop count skipped:", e)
    ids_of = CaptionIds(a.tok)
    params = list(unet.parameters()) + list(te.parameters())
    betas = torch.linspace(0.00085 ** 0.5, 0.012 ** 0.5, 1000, dtype=torch.float64) ** 2
    if a.zsnr:  # zero terminal SNR (Lin et al. 2023, arXiv:2305.08891, algorithm 1): alpha_bar[999] = 0
        sab = torch.cumprod(1 - betas, 0).sqrt()
        sab = (sab - sab[-1]) * sab[0] / (sab[0] - sab[-1])
        ab = sab ** 2
        betas = 1 - torch.cat([ab[:1], ab[1:] / ab[:-1]])
    ac = torch.cumprod(1 - betas, 0).float().to(dev)
    log(f"alphas_cumprod[0] {ac[0].item():.6f}, [999] {ac[-1].item():.3e}; target {'v' if a.zsnr else 'epsilon'}")
    cg = torch.Generator().manual_seed(3)
    dg = torch.Generator(device=dev).manual_seed(4)
    ng = torch.Generator(device=dev).manual_seed(5)
    pool = build_pool(vae, ids_of, dev, a.pool, a.pool_time, a) if a.pool else None
    analyser = Analyser(a.workers)  # worker processes start now, while the GPU trains
    empty_ids = ids_of([""], dev)[0]

    def batch_from_pool(B):
        idx = torch.randint(0, pool["n"], (B,), device=dev, generator=ng)
        z0 = pool["mean"][idx] + pool["std"][idx] * torch.randn((B, 4, 32, 32), device=dev, generator=ng)
        drop = torch.rand((B, 1), device=dev, generator=ng) < 0.1
        ids = torch.where(drop, empty_ids[None], pool["ids"][idx])
        return z0, ids, pool["cov"][idx]

    def batch_fresh(B):  # the original loop: draw and encode every batch (slow: VAE encoder per step)
        x, caps, _, alpha = shapes.batch(B, 256, dev, cg, dg, phrasings=a.phrasings, hard_pairs=a.hard_pairs,
                                         return_alpha=True)
        drop = torch.rand(B, generator=cg) < 0.1
        caps = ["" if d else c for c, d in zip(caps, drop.tolist())]
        with torch.no_grad(), autocast():
            z0 = vae.encode(x).latent_dist.sample(generator=ng).float() * SCALE
        return z0, ids_of(caps, dev), (F.avg_pool2d(alpha.float(), 8) * 255).round().to(torch.uint8)

    get_batch = batch_from_pool if pool is not None else batch_fresh

    def loss_of(model, z0, ids, cov, B, cl):
        t = torch.randint(0, 1000, (B,), device=dev, generator=ng)
        eps = torch.randn(z0.shape, device=dev, generator=ng)
        if a.pyramid_noise:
            eps = pyramid_noise(eps, a.pyramid_noise, ng)
        if a.offset_noise:
            eps = eps + a.offset_noise * torch.randn((B, 4, 1, 1), device=dev, generator=ng)
        at = ac[t].view(B, 1, 1, 1)
        zt = at.sqrt() * z0 + (1 - at).sqrt() * eps
        if cl:
            zt = zt.contiguous(memory_format=torch.channels_last)
        with autocast():
            pred = model(zt, t, ids)
        # v = sqrt(ab) eps - sqrt(1 - ab) x0 (Salimans & Ho 2022, arXiv:2202.00512; diffusers get_velocity)
        target = at.sqrt() * eps - (1 - at).sqrt() * z0 if a.zsnr else eps
        se = (pred.float() - target).square()
        mse = se.mean(dim=(1, 2, 3))
        if a.obj_weight:  # 1 + W on the cells the object covers (and their neighbours: its edge)
            wmap = 1 + a.obj_weight * F.max_pool2d(cov.float() / 255, 3, 1, 1)
            per = (wmap * se).mean(dim=(1, 2, 3)) / wmap.mean(dim=(1, 2, 3))
        else:
            per = mse
        if a.min_snr:  # Min-SNR-gamma weighting (Hang et al. 2023, arXiv:2303.09556), epsilon form
            snr = at.view(B) / (1 - at.view(B))
            per = per * snr.clamp(max=a.min_snr) / snr
        return per.mean(), mse.mean()

    class Step(torch.nn.Module):  # text encoder + UNet as one module (what --compile compiles)
        def __init__(self):
            super().__init__()
            self.te, self.unet = te, unet

        def forward(self, zt, t, ids):
            return self.unet(zt, t, encoder_hidden_states=self.te(ids).last_hidden_state).sample

    model = Step()
    # batch size and memory format: time the candidates (forward + backward) and take the fastest per sample
    cands = [int(b) for b in str(a.batch).split(",")] if str(a.batch) != "auto" else [256, 512]
    fmts = ["no", "yes"] if (a.channels_last == "auto" and dev == "cuda") else \
        [a.channels_last if dev == "cuda" else "no"]
    if len(cands) * len(fmts) > 1:
        probe = {B: get_batch(B) for B in cands}

        def run(opt):
            B, fmt = opt
            unet.to(memory_format=torch.channels_last if fmt == "yes" else torch.contiguous_format)
            loss_of(model, *probe[B], B, fmt == "yes")[0].backward()

        opts = [(B, fm) for B in cands for fm in fmts]
        res = time_options("fwd+bwd (batch, channels_last)", run, opts)
        unet.zero_grad(set_to_none=True)
        te.zero_grad(set_to_none=True)
        # per sample, a larger batch only if it is at least 20 % faster per sample (fewer, larger steps)
        best = min(opts, key=lambda o: res[o] / o[0])
        small = min((o for o in opts if o[0] == min(cands)), key=lambda o: res[o])
        pick = best if res[best] / best[0] < 0.8 * res[small] / small[0] else small
        B, a.channels_last = pick
        a.timings = {f"{o[0]} {o[1]}": res[o] for o in opts}
    else:
        B, a.channels_last = cands[0], fmts[0]
    cl = a.channels_last == "yes"
    unet.to(memory_format=torch.channels_last if cl else torch.contiguous_format)
    lr_peak = a.lr * math.sqrt(B / 256) if a.lr_scale else a.lr
    a.batch, a.lr_used = B, lr_peak
    log(f"batch {B}, channels_last {a.channels_last}, peak LR {lr_peak:.2e}")
    step_model = model
    if a.compile and dev == "cuda":
        t_c = time.time()
        try:
            step_model = torch.compile(model)
            loss_of(step_model, *get_batch(B), B, cl)[0].backward()  # compiles forward and backward now
            unet.zero_grad(set_to_none=True)
            te.zero_grad(set_to_none=True)
            log(f"torch.compile: {time.time() - t_c:.0f}s")
        except Exception as e:  # noqa: BLE001
            step_model = model
            log(f"torch.compile failed after {time.time() - t_c:.0f}s, eager: {e}")
    opt = torch.optim.AdamW(params, lr=lr_peak, betas=(0.9, 0.99), weight_decay=0.01,
                            **({"fused": True} if a.fused and dev == "cuda" else {}))
    emas = [EMA(params, float(d)) for d in str(a.ema).split(",")]
    os.makedirs(a.out, exist_ok=True)
    f = open(os.path.join(a.out, "loss-log-unet.csv"), "w", newline="")
    w = csv.writer(f)
    w.writerow(["step", "elapsed_s", "lr", "loss", "loss_ema"])
    if a.end_by:  # a hard end for the whole job: leave `reserve` seconds for export and sampling
        avail = a.end_by - time.time() - a.reserve
        if avail < a.time:
            log(f"training time {a.time:.0f}s -> {avail:.0f}s (--end-by, {a.reserve:.0f}s reserved after training)")
            a.time = max(10.0, avail)
    t0 = time.time()
    last_ckpt = t0
    step, loss_ema = 0, None
    sched = Schedule(lr_peak, a.warmup if a.warmup is not None else 300, a.steps or a.est_steps,
                     0 if a.steps else a.time)
    while True:
        el = time.time() - t0
        if (a.steps and step >= a.steps) or (not a.steps and el > a.time):
            break
        if step in (20, 60):  # the schedule's rate estimate needs the GPU's time, not the queue's
            sync()
            el = time.time() - t0
        lr = sched.lr(step, el)
        for g in opt.param_groups:
            g["lr"] = lr
        obj, loss = loss_of(step_model, *get_batch(B), B, cl)
        opt.zero_grad(set_to_none=True)
        obj.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        for e in emas:
            e.update(step)
        lv = loss.item() if step % 25 == 0 else None
        if lv is not None:
            loss_ema = lv if loss_ema is None else 0.9 * loss_ema + 0.1 * lv
            w.writerow([step, f"{el:.1f}", f"{lr:.3e}", f"{lv:.5f}", f"{loss_ema:.5f}"])
        if step % 500 == 0 or step in (10, 50, 100, 250):
            log(f"unet step {step} t {el:.0f}s loss {loss.item():.4f} (smoothed {loss_ema:.4f}) lr {lr:.2e}")
        if a.ckpt_every and time.time() - last_ckpt > a.ckpt_every:
            save_checkpoint(a, vae, te, unet, emas[0], step)
            last_ckpt = time.time()
        step += 1
    sync()
    f.close()
    a.train_s = time.time() - t0
    log(f"unet: {step} steps in {a.train_s:.0f}s, batch {B}")
    unet.to(memory_format=torch.contiguous_format)
    te.eval()
    unet.eval()
    a.lr_schedule_steps = sched.total
    a.pool_n = pool["n"] if pool is not None else 0
    a.pool_s = pool["seconds"] if pool is not None else 0
    a.loss_smoothed = loss_ema
    del pool
    candidates = {"raw": [p.detach().float().clone() for p in params]}
    for e in emas:
        candidates[f"ema {e.decay:g}"] = e.shadow
    export_and_sample(a, vae, te, unet, ids_of, step, candidates, params, analyser)


def save_checkpoint(a, vae, te, unet, ema, step):
    """The first EMA's weights, exported as the final file would be (f16, ldm layout) to OUT/checkpoint.safetensors;
    the training weights are put back afterwards."""
    import ldm_convert
    from safetensors.torch import save_file

    t0 = time.time()
    keep = [p.detach().clone() for p in ema.params]
    ema.copy_to()
    ldm = ldm_convert.pipeline_to_ldm(unet, vae, te, dtype=torch.float16)
    with torch.no_grad():
        for p, k in zip(ema.params, keep):
            p.copy_(k)
    if a.zsnr:
        ldm["v_pred"] = torch.tensor(0.0)
        ldm["ztsnr"] = torch.tensor(0.0)
    meta = model_meta(a, step, {})
    meta["checkpoint"] = f"EMA {ema.decay:g} at step {step}"
    path = os.path.join(a.out, "checkpoint.safetensors")
    save_file(ldm, path + ".tmp", metadata=meta)
    os.replace(path + ".tmp", path)
    log(f"checkpoint at step {step}: {path} ({time.time() - t0:.1f}s)")


def make_scheduler(sampler):
    """diffusers scheduler of an easel sampler name (euler / euler_a) with the model's schedule (SCHED)."""
    from diffusers import EulerAncestralDiscreteScheduler, EulerDiscreteScheduler

    if sampler == "euler":
        return EulerDiscreteScheduler(**SCHED)
    if sampler == "euler_a":
        return EulerAncestralDiscreteScheduler(**SCHED)
    raise ValueError(sampler)


def make_pipe(vae, te, unet, tok, sampler="euler"):
    from diffusers import StableDiffusionPipeline

    p = StableDiffusionPipeline(vae=vae, text_encoder=te, tokenizer=tok, unet=unet,
                                scheduler=make_scheduler(sampler), safety_checker=None,
                                feature_extractor=None, requires_safety_checker=False)
    p.set_progress_bar_config(disable=True)
    return p


# ---------------------------------------------------------------------------------------------- scoring

def analyse(img):
    """score.analyse (kept here by name: the scorer used to live in this file)."""
    return score.analyse(img)


check = score.check


class Analyser:
    """score.analyse over many pictures (8-bit, as saved), in `workers` processes (spawned) when > 1."""

    def __init__(self, workers):
        self.pool = None
        if workers and workers > 1:
            import multiprocessing as mp

            self.pool = mp.get_context("spawn").Pool(workers, initializer=score.worker_init)

    def __call__(self, imgs):
        arrs = list((imgs.float().clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy())
        if self.pool is None:
            return [score.analyse_u8(x) for x in arrs]
        return self.pool.map(score.analyse_u8, arrs, chunksize=max(1, len(arrs) // 64))


def prompt_sets(n=64):
    """The fixed prompt sets (CPU generator 777, as runs 1-10): "random" = in-distribution pairs, the training
    template; "heldout" = the held-out (colour, shape) pairs, training template; "phrasings" = in-distribution
    pairs in the held-out phrasings (shapes.HELDOUT_PHRASINGS). -> {name: (attrs, captions)}."""
    cg = torch.Generator().manual_seed(777)
    out = {}
    for name in ("random", "heldout", "phrasings"):
        attrs, _ = shapes.sample_attributes(256, cg, allow_heldout=True)
        if name == "heldout":
            hl = sorted(shapes.HELDOUT)
            for i, at in enumerate(attrs):
                at["colour"], at["shape"] = hl[i % len(hl)]
                if at["bg"] == at["colour"]:
                    at["bg"] = "white" if at["colour"] != "white" else "black"
        else:
            attrs = [at for at in attrs if (at["colour"], at["shape"]) not in shapes.HELDOUT]
        attrs = attrs[:n]
        if name == "phrasings":
            T = shapes.HELDOUT_PHRASINGS
            caps = [shapes.phrase(T[i % len(T)], at["size"], at["colour"], at["shape"], at["pos"], at["bg"])
                    for i, at in enumerate(attrs)]
        else:
            caps = [shapes.caption(at["size"], at["colour"], at["shape"], at["pos"], at["bg"]) for at in attrs]
        out[name] = (attrs, caps)
    return out


def score_images(analyser, imgs, attrs):
    """-> ({attribute: share right, "all", "speck", "frame", "edge_px", "n"}, per-image analyses)."""
    res = analyser(imgs)
    tally = {k: 0 for k in score.ATTRS + ("clean", "all")}
    specks = frames = 0
    edge = []
    for at, an in zip(attrs, res):
        ch = score.check(at, an)
        for k in score.ATTRS + ("clean",):
            tally[k] += int(ch[k])
        tally["all"] += int(all(ch[k] for k in score.ATTRS))
        specks += int(an["speck"])
        frames += int(an["frame_flag"])
        if an["edge_px"] is not None:
            edge.append(an["edge_px"])
    n = len(attrs)
    out = {k: v / n for k, v in tally.items()}
    out.update(speck=specks / n, frame=frames / n, edge_px=sum(edge) / max(1, len(edge)), n=n)
    return out, res


def generate(pipe, caps, sampler, cfg, steps, seed, size=None, chunk=64):
    size = size or EVAL_SIZE
    pipe.scheduler = make_scheduler(sampler)
    imgs = []
    for i in range(0, len(caps), chunk):
        with torch.no_grad():
            imgs.append(pipe(prompt=caps[i:i + chunk], num_inference_steps=steps, guidance_scale=cfg, height=size,
                             width=size, generator=torch.Generator(DEV).manual_seed(seed + i),
                             output_type="pt").images.float())
    return torch.cat(imgs)


def setting_score(r):
    """Selection score of one setting: mean over its prompt sets of the mean of the five attributes and clean."""
    return sum(sum(x[k] for k in score.ATTRS + ("clean",)) / 6 for x in r.values()) / len(r)


def model_meta(a, steps_done, rec):
    """The exported file's safetensors metadata. easel.* keys: the settings easel uses when the user gives none
    (docs/formats.md)."""
    meta = {"format": "pt", "easel_model": "easel-demo-shapes", "architecture": "SD1.x (miniature)",
            "unet_preset": a.arch, "unet_config": json.dumps(UNET_CFG),
            "vae_preset": a.vae_arch, "vae_config": json.dumps({k: VAE_CFG[k] for k in ("block_out_channels",
                                                                                     "layers_per_block")}),
            "te_preset": a.te_arch, "te_config": json.dumps({k: TE_CFG[k] for k in ("hidden_size", "intermediate_size",
                                                                                   "num_attention_heads")}),
            "scaling_factor": str(SCALE), "licence": "CC0-1.0",
            "train_steps_unet": (a.history + " + " if a.history else "") + f"{steps_done} (batch {a.batch})",
            "prediction_type": SCHED["prediction_type"],
            "beta_schedule": "scaled_linear 0.00085..0.012, 1000 steps"
            + (", rescaled to zero terminal SNR (Lin et al. 2023)" if a.zsnr else ""),
            "clip_skip": "1 (final layer norm output)",
            "train_steps_vae": a.vae_steps, "resolution": "256x256 (32x32 latent)",
            "tokenizer": "CLIP BPE (openai bpe_simple_vocab_16e6), 77 tokens, pad with <|endoftext|> 49407",
            "source": "tools/demo-model (easel repository)",
            "easel.sampler": rec.get("sampler", "euler"), "easel.scheduler": "discrete",
            "easel.cfg_scale": f"{rec.get('cfg', 5.0):g}", "easel.steps": str(rec.get("steps", 20)),
            "easel.width": "256", "easel.height": "256"}
    return meta


def export_file(a, vae, te, unet, steps_done, rec):
    import ldm_convert
    from safetensors.torch import save_file

    ldm = ldm_convert.pipeline_to_ldm(unet, vae, te, dtype=torch.float16)
    if a.zsnr:  # ComfyUI's / Forge's markers of a v-prediction, zero-terminal-SNR single file (presence counts)
        ldm["v_pred"] = torch.tensor(0.0)
        ldm["ztsnr"] = torch.tensor(0.0)
    path = os.path.join(a.out, "easel-demo-shapes.safetensors")
    save_file(ldm, path, metadata=model_meta(a, steps_done, rec))
    log(f"exported {path}: {os.path.getsize(path) / 1e6:.2f} MB, {len(ldm)} tensors, settings {rec}")
    return path


def export_and_sample(a, vae, te, unet, ids_of, steps_done, candidates, params, analyser):
    from PIL import Image
    import numpy as np

    t_start = time.time()

    def left():  # seconds left before --end-by (inf without it)
        return a.end_by - time.time() if a.end_by else float("inf")

    def load(ws):  # a candidate's weights, rounded to f16 (what the file holds), into the modules
        with torch.no_grad():
            for p, v in zip(params, ws):
                p.copy_(v.to(p.dtype).half().float())

    with torch.no_grad():
        for m in (vae, te, unet):
            m.float()
            for p in m.parameters():
                p.copy_(p.half().float())
    tok = ids_of.tok
    pipe = make_pipe(vae, te, unet, tok)
    pipe.to(DEV)
    sets = prompt_sets(a.n_prompts)
    summary = {"unet_steps": steps_done, "batch": a.batch, "lr": a.lr, "lr_used": getattr(a, "lr_used", a.lr),
               "warmup": a.warmup, "ema": a.ema, "train_s": getattr(a, "train_s", None),
               "pool_latents": getattr(a, "pool_n", 0), "pool_s": getattr(a, "pool_s", 0),
               "timings": getattr(a, "timings", None), "channels_last": a.channels_last, "min_snr": a.min_snr,
               "offset_noise": a.offset_noise, "pyramid_noise": a.pyramid_noise, "zsnr": a.zsnr,
               "obj_weight": a.obj_weight, "phrasings": a.phrasings, "hard_pairs": a.hard_pairs,
               "vae_from": a.vae_from, "vae": a.vae, "resume": a.resume,
               "final_loss_smoothed": getattr(a, "loss_smoothed", None),
               "lr_schedule_steps": getattr(a, "lr_schedule_steps", None),
               "arch": a.arch, "te_arch": a.te_arch, "vae_arch": a.vae_arch, "unet_config": UNET_CFG,
               "text_encoder_config": TE_CFG, "vae_config": VAE_CFG, "scheduler": SCHED}
    if a.vae and os.path.exists(os.path.join(a.vae, "vae_config.json")):
        with open(os.path.join(a.vae, "vae_config.json")) as f:
            summary["vae_training"] = json.load(f)
    spath = os.path.join(a.out, "train_summary.json")

    def dump():
        with open(spath, "w") as f:
            json.dump(summary, f, indent=1, default=str)

    # --- which weights: the raw ones or an EMA (64 in-distribution prompts, euler, CFG 5, 20 steps) ------------
    attrs, caps = sets["random"]
    summary["weights"] = {}
    if len(candidates) > 1 and not a.quick:
        for name, ws in candidates.items():
            load(ws)
            r, _ = score_images(analyser, generate(pipe, caps, "euler", 5.0, 20, 5), attrs)
            summary["weights"][name] = r
            log(f"weights {name}: {json.dumps(r)}")
        best = max(candidates, key=lambda k: (round(setting_score({"r": summary["weights"][k]}), 6), k != "raw"))
    else:
        best = list(candidates)[-1]
    load(candidates[best])
    summary["weights_chosen"] = best
    log(f"weights chosen: {best}")
    rec = {"sampler": "euler", "cfg": 5.0, "steps": 20}
    path = export_file(a, vae, te, unet, steps_done, rec)
    summary["file_mb"] = os.path.getsize(path) / 1e6
    dump()
    # --- the settings: sampler x CFG on in-distribution and held-out-pair prompts ---------------------------------
    summary["settings"] = {}
    settings = [(s.split(":")[0], float(s.split(":")[1])) for s in a.settings.split(",")]
    for sampler, cfg in settings:
        if left() < a.reserve_refs + 15:
            log(f"settings: stopped before {sampler} CFG {cfg:g} ({left():.0f}s left)")
            break
        r = {}
        for name in ("random", "heldout"):
            at_, cp_ = sets[name]
            r[name], _ = score_images(analyser, generate(pipe, cp_, sampler, cfg, 20, 5), at_)
        summary["settings"][f"{sampler} cfg {cfg:g}"] = r
        log(f"setting {sampler} CFG {cfg:g}: score {setting_score(r):.4f} " + json.dumps(r))
        dump()
    if summary["settings"]:
        key = max(summary["settings"], key=lambda k: (round(setting_score(summary["settings"][k]), 6),
                                                       k.startswith("euler cfg"), -abs(float(k.split()[-1]) - 5)))
        rec = {"sampler": key.split()[0], "cfg": float(key.split()[-1]), "steps": 20}
        path = export_file(a, vae, te, unet, steps_done, rec)
    summary["recommended"] = rec
    sampler, cfg = rec["sampler"], rec["cfg"]
    log(f"recommended settings: {rec}")
    dump()
    # --- held-out phrasings at the recommended settings -------------------------------------------------------
    if left() > a.reserve_refs + 10:
        at_, cp_ = sets["phrasings"]
        summary["phrasings"], _ = score_images(analyser, generate(pipe, cp_, sampler, cfg, 20, 5), at_)
        log("held-out phrasings: " + json.dumps(summary["phrasings"]))
        dump()
    # --- model-card samples (GPU) --------------------------------------------------------------------
    card = ["a large green star in the centre, white background",
            "a small purple triangle at the top, yellow background",
            "a large yellow ring on the right, blue background",
            "a small red cross at the bottom, black background",
            "a large blue square on the left, pink background",
            "a small orange circle on the right, grey background",
            "a large white circle at the bottom, red background",
            "a cyan star on the left, brown background"]
    if a.smoke:
        card = card[:2]
    summary["card_prompts"] = card
    sdir = os.path.join(a.out, "samples")
    os.makedirs(sdir, exist_ok=True)
    imgs = generate(pipe, card, sampler, cfg, 20, 1)
    tiles = []
    for i, img in enumerate(imgs):
        arr = (img.permute(1, 2, 0).float().cpu().numpy() * 255).round().astype("uint8")
        Image.fromarray(arr).save(os.path.join(sdir, f"sample_{i}.png"))
        tiles.append(arr)
    half = (len(tiles) + 1) // 2
    grid = np.concatenate([np.concatenate(tiles[:half], 1), np.concatenate(tiles[half:] + tiles[:2 * half - len(tiles)], 1)], 0)
    Image.fromarray(grid).save(os.path.join(sdir, "grid_full.png"))
    Image.fromarray(grid).resize((128 * half, 256), Image.LANCZOS).save(os.path.join(sdir, "grid.png"))
    # --- the measured-check test's prompts with CPU-generator noise (easel --rng cpu) ---------------
    if left() > a.reserve_refs + 5:
        rows = []
        pipe.scheduler = make_scheduler(sampler)
        tps = TEST_PROMPTS[:2] if a.smoke else TEST_PROMPTS
        for seed in range(1, 2 if a.smoke else 5):
            ls = EVAL_SIZE // 8
            noise = torch.cat([torch.randn((1, 4, ls, ls), generator=torch.Generator().manual_seed(seed))
                               for _ in tps])
            with torch.no_grad():
                timgs = pipe(prompt=tps, num_inference_steps=20, guidance_scale=cfg, height=EVAL_SIZE, width=EVAL_SIZE,
                             latents=noise.to(DEV), output_type="pt").images
            for p, an in zip(tps, analyser(timgs)):
                rows.append({"prompt": p, "seed": seed, "analysis": an, "check": check(parse_prompt(p), an)})
        summary["test_prompts"] = {f"{EVAL_SIZE}px 20 steps {sampler} cfg {cfg:g}": rows}
        ok = sum(all(r["check"][k] for k in score.ATTRS) for r in rows)
        log(f"test prompts: {ok}/{len(rows)} pass every attribute check")
        dump()
    # --- parity references on the CPU in float32 (for easel's --rng cpu comparison) -----------------
    if left() > 5:
        make_references(a, pipe, sampler, cfg)
    # --- extras while time is left: 10 steps, the VAE's own reconstructions were measured by the vae stage ------
    if a.extra_analysis and left() > 20:
        pipe.to(DEV)
        r = {}
        for name in ("random", "heldout"):
            at_, cp_ = sets[name]
            r[name], _ = score_images(analyser, generate(pipe, cp_, sampler, cfg, 10, 5), at_)
        summary["settings"][f"{sampler} cfg {cfg:g} 10 steps"] = r
        log(f"10 steps: {json.dumps(r)}")
    summary["export_and_sample_s"] = time.time() - t_start
    dump()
    log(f"export and sampling done ({summary['export_and_sample_s']:.0f}s)")


def make_references(a, pipe, sampler, cfg):
    """diffusers' output for two prompts on the CPU in float32 (exactly the file's f16 values), with
    torch.Generator("cpu") noise (easel --rng cpu): tests/data/reference/demo/."""
    from PIL import Image
    from safetensors.torch import save_file as sf

    pipe.to("cpu")
    pipe.scheduler = make_scheduler(sampler)
    refs = []
    rdir = os.path.join(a.out, "reference")
    os.makedirs(rdir, exist_ok=True)
    for j, (prompt, seed) in enumerate([("a small red circle on the left, blue background", 1),
                                        ("a large green star in the centre, white background", 2)]):
        lat = []

        def cb(p, i, ts, kw):
            lat.append(kw["latents"].detach().float().clone())
            return kw

        with torch.no_grad():
            cond, uncond = pipe.encode_prompt(prompt, "cpu", 1, True)
            img = pipe(prompt=prompt, num_inference_steps=20, guidance_scale=cfg, height=EVAL_SIZE, width=EVAL_SIZE,
                       generator=torch.Generator("cpu").manual_seed(seed), output_type="pt",
                       callback_on_step_end=cb).images
        noise = torch.randn((1, 4, EVAL_SIZE // 8, EVAL_SIZE // 8), generator=torch.Generator("cpu").manual_seed(seed))
        name = f"demo_ref_{j}"
        sf({"noise": noise, "final_latent": lat[-1], "step_latents": torch.cat(lat), "cond": cond.float(),
            "uncond": uncond.float(), "image": img.float(), "sigmas": pipe.scheduler.sigmas.float(),
            "timesteps": pipe.scheduler.timesteps.float()}, os.path.join(rdir, name + ".safetensors"))
        arr = (img[0].permute(1, 2, 0).numpy() * 255).round().astype("uint8")
        Image.fromarray(arr).save(os.path.join(rdir, name + ".png"))
        an = analyse(img[0].float())
        refs.append({"name": name, "prompt": prompt, "negative_prompt": "", "seed": seed, "width": EVAL_SIZE,
                     "height": EVAL_SIZE, "steps": 20, "cfg_scale": cfg, "sampling_method": sampler,
                     "scheduler": "discrete", "rng": "cpu", "png": name + ".png",
                     "tensors": name + ".safetensors",
                     "diffusers_scheduler_config": {k: v for k, v in dict(pipe.scheduler.config).items()
                                                    if not k.startswith("_")},
                     "sigmas": [float(s) for s in pipe.scheduler.sigmas],
                     "timesteps": [float(s) for s in pipe.scheduler.timesteps],
                     "check": {k: an[k] for k in ("bg", "colour", "cx", "cy", "area", "shape", "speck_px", "frame")}})
    with open(os.path.join(rdir, "cases.json"), "w") as f:
        json.dump({"model": "models/demo/easel-demo-shapes.safetensors", "device": "cpu float32",
                   "weights": "exactly the f16 values of the file", "cases": refs}, f, indent=1, default=str)
    pipe.to(DEV)


# Prompts of the measured-check test (tests/e2e/demo_checks_test.cpp), fixed before any image was seen:
# every colour but one appears as object or background, every shape, position and size; (small,
# large) pairs for the size check; no held-out (colour, shape) pair.
TEST_PROMPTS = [
    "a large red circle in the centre, blue background",
    "a small red circle in the centre, blue background",
    "a small yellow square on the left, black background",
    "a large yellow square on the left, black background",
    "a large white triangle on the right, green background",
    "a small cyan star at the top, purple background",
    "a large orange ring at the bottom, white background",
    "a small pink cross on the right, grey background",
    "a large green square at the top, red background",
    "a small black circle at the bottom, yellow background",
    "a large blue triangle on the left, orange background",
    "a large purple star in the centre, cyan background",
]


def parse_prompt(p):
    """Inverse of shapes.caption for full captions: -> attribute dict."""
    head, bg = p.split(", ")
    w = head.split()
    pos = {"on the left": "left", "on the right": "right", "at the top": "top", "at the bottom": "bottom",
           "in the centre": "centre"}[" ".join(w[4:])]
    return dict(size=w[1], colour=w[2], shape=w[3], pos=pos, bg=bg.split()[0])


def random_file(a):
    """An untrained file of the chosen presets (--arch, --te-arch, --vae-arch; diffusers' / transformers'
    default initialisation, seeds 10-12), exported as training exports: to try easel's loader and speed on an
    architecture before any GPU run (`easel-bench --demo FILE`)."""
    from diffusers import UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(10)
    te = CLIPTextModel(CLIPTextConfig(**TE_CFG))
    torch.manual_seed(11)
    unet = UNet2DConditionModel(**UNET_CFG)
    torch.manual_seed(12)
    vae = make_vae()
    a.batch, a.history, a.vae_steps = 0, "untrained", "untrained"
    os.makedirs(a.out, exist_ok=True)
    path = export_file(a, vae, te, unet, 0, {})
    log(f"untrained {a.arch} / {a.te_arch} / {a.vae_arch}: {path}")


def preview(a):
    """Write 16 dataset samples (4x4 grid PNG, 128 px tiles) and their captions, for the model card."""
    import numpy as np
    from PIL import Image

    os.makedirs(a.out, exist_ok=True)
    x, caps, _ = shapes.batch(16, 128, "cpu", torch.Generator().manual_seed(123), torch.Generator().manual_seed(124))
    tiles = ((x.permute(0, 2, 3, 1).numpy() + 1) * 127.5).round().clip(0, 255).astype("uint8")
    rows = [np.concatenate(list(tiles[r * 4:(r + 1) * 4]), 1) for r in range(4)]
    Image.fromarray(np.concatenate(rows, 0)).save(os.path.join(a.out, "dataset_preview.png"))
    with open(os.path.join(a.out, "dataset_preview.json"), "w") as f:
        json.dump(caps, f, indent=0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("stage", choices=["vae", "unet", "preview", "random"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--vae", help="folder with vae.safetensors and vae_config.json (unet stage)")
    ap.add_argument("--resume", help="unet stage: exported single file to continue training from (its architecture "
                                     "from its metadata)")
    ap.add_argument("--warmup", type=int, default=None, help="LR warm-up steps (vae: 100, unet: 300)")
    ap.add_argument("--init", help="vae stage: folder with a vae.safetensors to continue from")
    ap.add_argument("--tok", help="folder with the CLIP tokenizer files (unet stage)")
    ap.add_argument("--time", type=float, default=170, help="training wall-clock budget in seconds")
    ap.add_argument("--steps", type=int, default=0, help="fixed step count instead of --time (exact re-runs)")
    ap.add_argument("--est-steps", type=int, default=6000, help="steps the LR schedule is laid out for")
    ap.add_argument("--batch", default="0", help="batch size; unet stage: also a comma list or 'auto' (256,512), "
                                                 "timed and the fastest per sample taken")
    ap.add_argument("--lr", type=float, default=0)
    ap.add_argument("--lr-scale", action="store_true", help="unet stage: peak LR * sqrt(batch / 256)")
    ap.add_argument("--pool", type=int, default=0,
                    help="unet stage: encode this many training images once and sample batches from them (0: "
                         "render and encode every batch, the original loop)")
    ap.add_argument("--pool-time", type=float, default=60, help="unet stage: seconds at most for building the pool")
    ap.add_argument("--channels-last", choices=["auto", "yes", "no"], default="no",
                    help="memory format (auto: time both, take the faster)")
    ap.add_argument("--fused", action="store_true", help="fused AdamW kernel")
    ap.add_argument("--compile", action="store_true", help="unet stage: torch.compile the text encoder + UNet step")
    ap.add_argument("--ema", default="0.999", help="unet stage: EMA decay(s), comma list; the best of them and the "
                                                   "raw weights is exported")
    ap.add_argument("--settings", default="euler:3,euler:4,euler:5,euler:6.5,euler_a:5,euler_a:7",
                    help="unet stage: sampler:CFG settings measured after training; the best is recommended in the "
                         "file's metadata and used for samples and references")
    ap.add_argument("--n-prompts", type=int, default=64, help="unet stage: prompts per measured set")
    ap.add_argument("--workers", type=int, default=max(1, min(12, (os.cpu_count() or 1) - 2)),
                    help="unet stage: processes for the scorer")
    ap.add_argument("--smoke", action="store_true", help="unet stage: 64x64 pictures, 2 model-card prompts, 2 test "
                                                         "prompts x 1 seed (CPU smoke tests; with --n-prompts 2)")
    ap.add_argument("--quick", action="store_true", help="unet stage: skip the choice between EMA and raw weights")
    ap.add_argument("--vae-from", help="unet stage: take the VAE from this single file (first_stage_model.*), "
                                       "train text encoder and UNet from scratch")
    ap.add_argument("--offset-noise", type=float, default=0.05,
                    help="unet stage: std of the per-channel offset added to the noise (Crosslabs' offset noise)")
    ap.add_argument("--no-extra-analysis", dest="extra_analysis", action="store_false",
                    help="unet stage: skip the 10-step accuracy run")
    ap.add_argument("--pyramid-noise", type=float, default=0,
                    help="unet stage: discount of multi-resolution noise added to the noise (0: off; run 8: 0.8)")
    ap.add_argument("--min-snr", type=float, default=0, help="unet stage: Min-SNR-gamma loss weight (0: off)")
    ap.add_argument("--zsnr", action="store_true",
                    help="unet stage: zero-terminal-SNR betas (Lin et al. 2023) and v-prediction; the file gets the "
                         "v_pred and ztsnr marker tensors and the samplers EulerDiscreteScheduler(rescale_betas_zero_snr)")
    ap.add_argument("--obj-weight", type=float, default=0, help="unet stage: extra loss weight on the object's cells")
    ap.add_argument("--phrasings", type=float, default=0, help="share of training captions in the other phrasings")
    ap.add_argument("--hard-pairs", type=float, default=0, help="share of samples with a hard colour pair")
    ap.add_argument("--history", default="", help="unet stage: earlier training, recorded in the file's metadata")
    ap.add_argument("--vae-steps", default="2040 (1458 + 582 continued), batch 32",
                    help="unet stage: the VAE's training, recorded in the file's metadata")
    ap.add_argument("--arch", default="v1", choices=sorted(archs.UNET_PRESETS),
                    help="unet stage: UNet preset of tools/demo-model/archs.py")
    ap.add_argument("--te-arch", default="w128", choices=sorted(archs.TE_PRESETS), help="text encoder preset")
    ap.add_argument("--vae-arch", default="v1", choices=sorted(archs.VAE_PRESETS),
                    help="vae stage: VAE preset (the unet stage takes the VAE's from vae_config.json or the file)")
    ap.add_argument("--crop", type=int, default=0, help="vae stage: train on random crops of this size")
    ap.add_argument("--full-frac", type=float, default=0.25, help="vae stage with --crop: last share at 256x256")
    ap.add_argument("--edge-weight", type=float, default=0.0, help="vae stage: weight of the pixel-difference L1")
    ap.add_argument("--outlier-weight", type=float, default=0.0, help="vae stage: weight of the latent outlier term")
    ap.add_argument("--ckpt-every", type=float, default=0, help="unet stage: seconds between checkpoint exports")
    ap.add_argument("--end-by", type=float, default=0,
                    help="Unix time by which the whole job must end; training is shortened to fit")
    ap.add_argument("--reserve", type=float, default=75,
                    help="with --end-by: seconds kept after training (unet: export, settings, scoring, references)")
    ap.add_argument("--reserve-refs", type=float, default=25,
                    help="unet stage with --end-by: seconds kept for the CPU references at the end")
    a = ap.parse_args()
    set_arch(vae_cfg=archs.VAE_PRESETS[a.vae_arch], te_cfg=archs.TE_PRESETS[a.te_arch],
             unet_cfg=archs.UNET_PRESETS[a.arch])
    if a.zsnr:
        if a.min_snr:
            ap.error("--min-snr weighs the top timestep (SNR 0) by 0 with v-prediction; leave it out with --zsnr")
        SCHED.update(prediction_type="v_prediction", rescale_betas_zero_snr=True)
    if DEV == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
    if getattr(a, "smoke", False):
        global EVAL_SIZE
        EVAL_SIZE = 64
    if a.stage == "preview":
        preview(a)
    elif a.stage == "random":
        random_file(a)
    elif a.stage == "vae":
        a.batch = int(a.batch) or 32
        a.lr = a.lr or 4e-4
        train_vae(a)
    else:
        if a.batch in ("0", ""):
            a.batch = "128"
        a.lr = a.lr or 5e-4
        train_unet(a)


if __name__ == "__main__":
    main()
