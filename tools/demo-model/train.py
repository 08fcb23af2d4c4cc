"""Train the easel demo model (SD1.x architecture in miniature) on the procedural shapes dataset.

Stages (each fits one 10-minute run on one H200; fixed seeds; --time bounds the wall-clock training):
  python train.py vae  --out DIR --time 170
      AutoencoderKL (block_out_channels (32, 64, 64, 64), 2 resnets per level, 4 latent channels,
      factor 8, 32 norm groups) on 256x256 images; loss = L1 + 1e-6 * KL (KL summed over latent
      elements, L1 averaged, scaled as in SD's LPIPSWithDiscriminator sum convention: KL / (3*H*W)).
      Then the VAE is *normalised*: latents are multiplied by k so that 0.18215 * latent has unit std
      (quant_conv mean rows and bias * k, logvar bias + 2 ln k, post_quant_conv weight / k), so the
      standard SD1.x scaling_factor 0.18215 is right for this model. Writes DIR/vae.safetensors,
      DIR/vae_config.json, DIR/loss-log-vae.csv.
  python train.py unet --vae DIR --out DIR2 --time 420 --tok TOKDIR
      CLIP text encoder (width 128, 2 heads of 64, 3 layers, quick_gelu, vocab 49408, 77 positions)
      and UNet2DConditionModel (block_out_channels (32, 64, 128), CrossAttnDown x2 + Down, Up +
      CrossAttnUp x2, 8 heads, cross_attention_dim 128, 2 layers per block), trained together from
      scratch with epsilon prediction on SD's scaled_linear schedule (beta 0.00085..0.012, 1000 steps),
      10 % empty captions (for CFG), offset noise 0.05, AdamW, EMA 0.999. Then exports the EMA weights
      as one f16 original-layout checkpoint, samples images and measures attribute accuracy.
      Faster loop (runs 4-5): --pool N (encode N images once, sample batches from the latents),
      --fused (fused AdamW), --channels-last auto, --min-snr 5; --offset-noise 0.3 (run 5: hides
      the mean colour that SD's schedule leaks at t ~ 999); --vae-from FILE (VAE of a single file,
      text encoder + UNet from scratch); --cfgs / --ref-cfg auto (accuracy at several CFG scales,
      samples and references at the best).
      --arch v1|lowattn (archs.py): v1 is the UNet above (runs 1-6, the default, so earlier runs
      re-run unchanged); lowattn (run 7) moves the attention to the 16x16 and 8x8 latent levels
      (down: Down, CrossAttnDown x2; up: CrossAttnUp x2, Up; 8 heads of 8 and 16 channels).
      --end-by EPOCH --reserve S: training stops early enough that everything after it (export,
      accuracy, samples, references; about S seconds) ends by EPOCH (a GPU run's hard limit).
      --pyramid-noise D (run 8): multi-resolution noise (pyramid_noise()), against the spatial form of
      the schedule's leak: run 7 drew its objects at one of the 5 trained positions but ignored the
      prompt's, because at t = 999 the object still shows through the noise (a matched filter finds its
      position in 82 % of training latents, 97 % at t = 900), so the model read the position there
      instead of from the text; sampling starts from pure noise. With D = 0.8: 47 % / 70 %.
"""

import argparse
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
import shapes  # noqa: E402

SCALE = 0.18215
VAE_CFG = dict(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
               up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(32, 64, 64, 64), layers_per_block=2,
               latent_channels=4, norm_num_groups=32, sample_size=256, scaling_factor=SCALE)
UNET_CFG = archs.V1  # the UNet of the unet stage; main() sets it from --arch (archs.UNET_PRESETS)
TE_CFG = dict(vocab_size=49408, hidden_size=128, intermediate_size=512, num_hidden_layers=3, num_attention_heads=2,
              max_position_embeddings=77, hidden_act="quick_gelu", layer_norm_eps=1e-5, projection_dim=128,
              bos_token_id=49406, eos_token_id=49407, pad_token_id=49407)
SCHED = dict(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
             prediction_type="epsilon", timestep_spacing="linspace", steps_offset=1)


def log(*a):
    print(*a, flush=True)


def lr_at(step, total, peak, warmup):
    if step < warmup:
        return peak * (step + 1) / warmup
    p = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


def train_vae(a):
    from diffusers import AutoencoderKL
    from safetensors.torch import save_file

    dev = "cuda"
    torch.manual_seed(0)
    vae = AutoencoderKL(**VAE_CFG)
    if a.init:  # continue training from an earlier run's vae.safetensors
        from safetensors.torch import load_file

        vae.load_state_dict(load_file(os.path.join(a.init, "vae.safetensors")))
        log(f"vae: continuing from {a.init}")
    vae = vae.to(dev).to(memory_format=torch.channels_last)
    nparam = sum(p.numel() for p in vae.parameters())
    log(f"vae params {nparam / 1e6:.2f} M")
    opt = torch.optim.AdamW(vae.parameters(), lr=a.lr, betas=(0.9, 0.99), weight_decay=0.0)
    cg = torch.Generator().manual_seed(1)
    dg = torch.Generator(device=dev).manual_seed(2)
    os.makedirs(a.out, exist_ok=True)
    f = open(os.path.join(a.out, "loss-log-vae.csv"), "w", newline="")
    w = csv.writer(f)
    w.writerow(["step", "elapsed_s", "lr", "loss", "l1", "kl"])
    t0 = time.time()
    step = 0
    sched = Schedule(a.lr, 100, a.steps or a.est_steps, 0 if a.steps else a.time)
    while True:
        el = time.time() - t0
        if (a.steps and step >= a.steps) or (not a.steps and el > a.time):
            break
        lr = sched.lr(step, el)
        for g in opt.param_groups:
            g["lr"] = lr
        x, _, _ = shapes.batch(a.batch, 256, dev, cg, dg)
        x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            post = vae.encode(x).latent_dist
            z = post.sample()
            rec = vae.decode(z).sample
        l1 = (rec.float() - x).abs().mean()
        kl_sum = post.kl().float().mean()  # summed over the latent's elements, mean over the batch
        # SD's sum convention (rec summed over pixels + 1e-6 * KL sum), divided through by 3*H*W
        loss = l1 + 1e-6 * kl_sum / (3 * 256 * 256)
        kl = kl_sum / (4 * 32 * 32)  # per latent element, for the log
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        opt.step()
        if step % 25 == 0:
            w.writerow([step, f"{el:.1f}", f"{lr:.3e}", f"{loss.item():.5f}", f"{l1.item():.5f}", f"{kl.item():.5f}"])
        if step % 200 == 0 or step in (10, 50):
            log(f"vae step {step} t {el:.0f}s loss {loss.item():.4f} l1 {l1.item():.4f} kl/elem {kl.item():.4f}")
        step += 1
    f.close()
    log(f"vae: {step} steps in {time.time() - t0:.0f}s, batch {a.batch}")
    vae.eval()
    # latent statistics and normalisation so that SCALE * latent has unit std
    with torch.no_grad():
        zs, errs = [], []
        eg = torch.Generator(device=dev).manual_seed(99)
        ecg = torch.Generator().manual_seed(98)
        for _ in range(8):
            x, _, _ = shapes.batch(64, 256, dev, ecg, eg)
            post = vae.encode(x).latent_dist
            z = post.sample()
            zs.append(z.float())
            errs.append((vae.decode(post.mean).sample.float() - x).abs().mean().item())
        z = torch.cat(zs)
        std = z.std().item()
        k = (1.0 / SCALE) / std
        log(f"vae: latent mean {z.mean().item():.4f} std {std:.4f} per-channel std "
            f"{[round(v, 4) for v in z.std(dim=(0, 2, 3)).tolist()]}; normalising by k={k:.4f}; "
            f"eval L1 (mean latent) {sum(errs) / len(errs):.4f}")
        C = VAE_CFG["latent_channels"]
        qc, pqc = vae.quant_conv, vae.post_quant_conv
        qc.weight[:C] *= k
        qc.bias[:C] *= k
        qc.bias[C:] += 2 * math.log(k)
        pqc.weight /= k
        x, _, _ = shapes.batch(64, 256, dev, torch.Generator().manual_seed(98), torch.Generator(device=dev).manual_seed(99))
        post = vae.encode(x).latent_dist
        z2 = post.mean
        err2 = (vae.decode(z2).sample.float() - x).abs().mean().item()
        log(f"vae normalised: std(0.18215*z) {(SCALE * post.sample()).std().item():.4f}, L1 {err2:.4f}")
    sd = {k_: v.detach().float().cpu().contiguous() for k_, v in vae.state_dict().items()}
    save_file(sd, os.path.join(a.out, "vae.safetensors"))
    with open(os.path.join(a.out, "vae_config.json"), "w") as f:
        json.dump({"config": VAE_CFG, "steps": step, "batch": a.batch, "lr": a.lr, "latent_std_before": std,
                   "normalise_k": k, "eval_l1": err2}, f, indent=1)


def pyramid_noise(eps, discount, gen):
    """Multi-resolution ("pyramid") noise (J. Whitaker 2023; kohya-ss sd-scripts' multires noise):
    eps [B, C, H, W] plus, for i = 1, 2, ... while H / 2^i >= 1, discount^i times fresh N(0, 1) noise of
    size H / 2^i bilinearly upsampled to H x W, then divided by its std per sample (over C, H, W).
    Noise with this much low-frequency power hides the image's low frequencies (the object's position)
    at high timesteps, which the white noise of SD's schedule leaves readable."""
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
        torch._foreach_lerp_(self.shadow, [p.detach().float() for p in self.params], 1 - d)

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


def load_vae(vae_dir, dev):
    from diffusers import AutoencoderKL
    from safetensors.torch import load_file

    vae = AutoencoderKL(**VAE_CFG)
    vae.load_state_dict(load_file(os.path.join(vae_dir, "vae.safetensors")))
    return vae.to(dev).eval()


def build_pool(vae, ids_of, dev, n, budget_s, chunk=512):
    """Draw up to n training images (shapes.batch, fixed seeds), encode them once with the frozen VAE
    (bf16 autocast, channels_last, batches of `chunk`) and keep 0.18215 * the posterior mean and std
    (float32, [n, 4, 32, 32], on the GPU) and the caption token ids ([n, 77]). Stops early when
    budget_s seconds have passed. Training then samples batches from this pool, drawing a fresh
    posterior sample each time, instead of rendering and encoding 256x256 images every step."""
    t0 = time.time()
    cg = torch.Generator().manual_seed(3)
    dg = torch.Generator(device=dev).manual_seed(4)
    vae.to(memory_format=torch.channels_last)
    means, stds, ids = [], [], []
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        while len(means) * chunk < n:
            x, caps, _ = shapes.batch(chunk, 256, dev, cg, dg)
            post = vae.encode(x.contiguous(memory_format=torch.channels_last)).latent_dist
            means.append((post.mean.float() * SCALE).contiguous())
            stds.append((post.std.float() * SCALE).contiguous())
            ids.append(ids_of(caps, dev))
            if len(means) in (1, 4):
                torch.cuda.synchronize()
                log(f"pool: {len(means) * chunk} encoded in {time.time() - t0:.1f}s")
            if time.time() - t0 > budget_s:
                break
    vae.to(memory_format=torch.contiguous_format)
    pool = {"mean": torch.cat(means), "std": torch.cat(stds), "ids": torch.cat(ids)}
    torch.cuda.synchronize()
    pool["n"] = pool["mean"].shape[0]
    pool["seconds"] = time.time() - t0
    log(f"pool: {pool['n']} latents in {pool['seconds']:.1f}s ({len(ids_of.cache)} distinct captions); "
        f"std of 0.18215*mean {pool['mean'].std().item():.3f}, mean posterior std {pool['std'].mean().item():.4f}")
    return pool


def pick_memory_format(unet, te, pool, B, dev):
    """Times UNet + text-encoder forward/backward (bf16 autocast, no optimizer step, gradients
    discarded) in the default and the channels_last memory format; returns "yes" if channels_last
    is faster by more than 5 %."""
    ids = pool["ids"][:B]
    z = pool["mean"][:B]
    t = torch.full((B,), 500, device=dev)
    res = {}
    for fmt in ("no", "yes", "no", "yes"):
        unet.to(memory_format=torch.channels_last if fmt == "yes" else torch.contiguous_format)
        zz = z.contiguous(memory_format=torch.channels_last) if fmt == "yes" else z.contiguous()
        for i in range(8):
            if i == 3:
                torch.cuda.synchronize()
                t0 = time.time()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = unet(zz, t, encoder_hidden_states=te(ids).last_hidden_state).sample
            out.float().square().mean().backward()
        torch.cuda.synchronize()
        res[fmt] = (time.time() - t0) / 5
    unet.to(memory_format=torch.contiguous_format)
    unet.zero_grad(set_to_none=True)
    te.zero_grad(set_to_none=True)
    pick = "yes" if res["yes"] < 0.95 * res["no"] else "no"
    log(f"fwd+bwd at batch {B}: contiguous {res['no'] * 1e3:.1f} ms, channels_last {res['yes'] * 1e3:.1f} ms "
        f"-> channels_last {pick}")
    return pick


def train_unet(a):
    from diffusers import UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    dev = "cuda"
    torch.manual_seed(10)
    te = CLIPTextModel(CLIPTextConfig(**TE_CFG))
    torch.manual_seed(11)
    unet = UNet2DConditionModel(**UNET_CFG)
    if a.resume:  # continue from an exported single file (all three models, f16 values)
        import ldm_convert
        from diffusers import AutoencoderKL
        from safetensors.torch import load_file

        vae = AutoencoderKL(**VAE_CFG)
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
        from diffusers import AutoencoderKL
        from safetensors.torch import load_file

        vae = AutoencoderKL(**VAE_CFG)
        ldm = {k: v for k, v in load_file(a.vae_from).items() if k.startswith("first_stage_model.")}
        comps = ldm_convert.ldm_to_components(ldm, unet, vae, te)
        vae.load_state_dict({k: v.float() for k, v in comps["vae"].items()}, strict=True)
        vae = vae.to(dev).eval()
        log(f"vae from {a.vae_from} ({len(ldm)} tensors); text encoder and UNet from scratch")
    else:
        vae = load_vae(a.vae, dev)
    vae.requires_grad_(False)
    te, unet = te.to(dev), unet.to(dev)
    log(f"unet params {sum(p.numel() for p in unet.parameters()) / 1e6:.2f} M, "
        f"te params {sum(p.numel() for p in te.parameters()) / 1e6:.2f} M")
    try:
        from torch.utils.flop_counter import FlopCounterMode

        with torch.no_grad(), FlopCounterMode(display=False) as fc:
            unet(torch.zeros(1, 4, 32, 32, device=dev), torch.tensor([500], device=dev),
                 encoder_hidden_states=torch.zeros(1, 77, 128, device=dev))
        log(f"unet GFLOP per evaluation at 32x32 latent (batch 1): {fc.get_total_flops() / 1e9:.3f}")
        with torch.no_grad(), FlopCounterMode(display=False) as fc:
            vae.decode(torch.zeros(1, 4, 32, 32, device=dev))
        log(f"vae decoder GFLOP at 256x256: {fc.get_total_flops() / 1e9:.3f}")
    except Exception as e:  # noqa: BLE001
        log("flop count failed:", e)
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
    B = a.batch
    pool = build_pool(vae, ids_of, dev, a.pool, a.pool_time) if a.pool else None
    if pool is not None:
        empty_ids = ids_of([""], dev)[0]
        if a.channels_last == "auto":
            a.channels_last = pick_memory_format(unet, te, pool, B, dev)
        if a.channels_last == "yes":
            unet.to(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.99), weight_decay=0.01,
                            **({"fused": True} if a.fused else {}))
    ema = EMA(params, a.ema)
    os.makedirs(a.out, exist_ok=True)
    f = open(os.path.join(a.out, "loss-log-unet.csv"), "w", newline="")
    w = csv.writer(f)
    w.writerow(["step", "elapsed_s", "lr", "loss", "loss_ema"])
    if a.end_by:  # a hard end for the whole job: leave `reserve` seconds for export and sampling
        avail = a.end_by - time.time() - a.reserve
        if avail < a.time:
            log(f"training time {a.time:.0f}s -> {avail:.0f}s (--end-by, {a.reserve:.0f}s reserved after training)")
            a.time = max(20.0, avail)
    t0 = time.time()
    step, loss_ema = 0, None
    sched = Schedule(a.lr, a.warmup, a.steps or a.est_steps, 0 if a.steps else a.time)
    while True:
        el = time.time() - t0
        if (a.steps and step >= a.steps) or (not a.steps and el > a.time):
            break
        if step in (20, 60):  # the schedule's rate estimate needs the GPU's time, not the queue's
            torch.cuda.synchronize()
            el = time.time() - t0
        lr = sched.lr(step, el)
        for g in opt.param_groups:
            g["lr"] = lr
        if pool is None:  # the original loop: draw and encode every batch (slow: VAE encoder per step)
            x, caps, _ = shapes.batch(B, 256, dev, cg, dg)
            drop = torch.rand(B, generator=cg) < 0.1
            caps = ["" if d else c for c, d in zip(caps, drop.tolist())]
            ids = ids_of(caps, dev)
            with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
                z0 = vae.encode(x).latent_dist.sample(generator=ng).float() * SCALE
        else:  # a random batch of pre-encoded posteriors; a fresh posterior sample every time
            idx = torch.randint(0, pool["n"], (B,), device=dev, generator=ng)
            z0 = pool["mean"][idx] + pool["std"][idx] * torch.randn((B, 4, 32, 32), device=dev, generator=ng)
            drop = torch.rand((B, 1), device=dev, generator=ng) < 0.1
            ids = torch.where(drop, empty_ids[None], pool["ids"][idx])
        t = torch.randint(0, 1000, (B,), device=dev, generator=ng)
        eps = torch.randn(z0.shape, device=dev, generator=ng)
        if a.pyramid_noise:
            eps = pyramid_noise(eps, a.pyramid_noise, ng)
        eps = eps + a.offset_noise * torch.randn((B, 4, 1, 1), device=dev, generator=ng)
        at = ac[t].view(B, 1, 1, 1)
        zt = at.sqrt() * z0 + (1 - at).sqrt() * eps
        if a.channels_last == "yes":
            zt = zt.contiguous(memory_format=torch.channels_last)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            ehs = te(ids).last_hidden_state
            pred = unet(zt, t, encoder_hidden_states=ehs).sample
        # v = sqrt(ab) eps - sqrt(1 - ab) x0 (Salimans & Ho 2022, arXiv:2202.00512; diffusers get_velocity)
        target = at.sqrt() * eps - (1 - at).sqrt() * z0 if a.zsnr else eps
        mse = (pred.float() - target).square().mean(dim=(1, 2, 3))
        loss = mse.mean()  # logged: plain MSE of the target (epsilon: comparable with the earlier runs; v with --zsnr)
        if a.min_snr:  # Min-SNR-gamma weighting (Hang et al. 2023, arXiv:2303.09556), epsilon form
            snr = at.view(B) / (1 - at.view(B))
            obj = (mse * snr.clamp(max=a.min_snr) / snr).mean()
        else:
            obj = loss
        opt.zero_grad(set_to_none=True)
        obj.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        ema.update(step)
        lv = loss.item() if step % 25 == 0 else None
        if lv is not None:
            loss_ema = lv if loss_ema is None else 0.9 * loss_ema + 0.1 * lv
            w.writerow([step, f"{el:.1f}", f"{lr:.3e}", f"{lv:.5f}", f"{loss_ema:.5f}"])
        if step % 500 == 0 or step in (10, 50, 100, 250):
            log(f"unet step {step} t {el:.0f}s loss {loss.item():.4f} (smoothed {loss_ema:.4f}) lr {lr:.2e}")
        step += 1
    torch.cuda.synchronize()
    f.close()
    a.train_s = time.time() - t0
    log(f"unet: {step} steps in {a.train_s:.0f}s, batch {a.batch}")
    ema.copy_to()
    unet.to(memory_format=torch.contiguous_format)
    te.eval()
    unet.eval()
    a.lr_schedule_steps = sched.total
    a.pool_n = pool["n"] if pool is not None else 0
    a.pool_s = pool["seconds"] if pool is not None else 0
    a.loss_smoothed = loss_ema
    export_and_sample(a, vae, te, unet, ids_of, step)


def make_pipe(vae, te, unet, tok):
    from diffusers import EulerDiscreteScheduler, StableDiffusionPipeline

    p = StableDiffusionPipeline(vae=vae, text_encoder=te, tokenizer=tok, unet=unet,
                                scheduler=EulerDiscreteScheduler(**SCHED), safety_checker=None,
                                feature_extractor=None, requires_safety_checker=False)
    p.set_progress_bar_config(disable=True)
    return p


PALETTE_NAMES = shapes.COLOUR_NAMES


def analyse(img):
    """img: float [3, H, W] in [0, 1] -> (bg colour, object colour, cx, cy, area fraction), where the
    background colour is the palette colour nearest to the median of a 6-pixel border and the object is
    every pixel farther than 0.25 (RGB distance) from that median."""
    pal = torch.tensor([shapes.COLOURS[n] for n in PALETTE_NAMES], device=img.device)
    H, W = img.shape[1:]
    border = torch.cat([img[:, :6].reshape(3, -1), img[:, -6:].reshape(3, -1), img[:, :, :6].reshape(3, -1),
                        img[:, :, -6:].reshape(3, -1)], 1)
    bgm = border.median(1).values
    bg = PALETTE_NAMES[int(((pal - bgm) ** 2).sum(1).argmin())]
    d = ((img - bgm[:, None, None]) ** 2).sum(0).sqrt()
    m = d > 0.25
    area = m.float().mean().item()
    if m.sum() < 4:
        return bg, None, None, None, area
    obj = img[:, m].median(1).values
    oc = PALETTE_NAMES[int(((pal - obj) ** 2).sum(1).argmin())]
    ys, xs = torch.nonzero(m, as_tuple=True)
    return bg, oc, (xs.float().mean().item() + 0.5) / W, (ys.float().mean().item() + 0.5) / H, area


def check(attr, res):
    bg, oc, cx, cy, area = res
    out = {"bg": bg == attr["bg"], "colour": oc == attr["colour"]}
    if cx is None:
        out.update(pos=False, size=False)
        return out
    p = attr["pos"]
    out["pos"] = {"left": cx < 0.42, "right": cx > 0.58, "top": cy < 0.42, "bottom": cy > 0.58,
                  "centre": abs(cx - 0.5) < 0.1 and abs(cy - 0.5) < 0.1}[p]
    out["size"] = area < 0.06 if attr["size"] == "small" else area > 0.06
    return out


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


def accuracy(pipe, cfg, size, steps):
    """Attribute accuracy over 64 in-distribution and 64 held-out-pair prompts (fixed: CPU generator
    777, GPU noise seed 5) at one setting -> {"random": {...}, "heldout": {...}}."""
    cg = torch.Generator().manual_seed(777)
    results = {}
    for name in ("random", "heldout"):
        attrs, caps = shapes.sample_attributes(256, cg, allow_heldout=True)
        if name == "heldout":
            hl = sorted(shapes.HELDOUT)
            for i, at in enumerate(attrs):
                at["colour"], at["shape"] = hl[i % len(hl)]
                if at["bg"] == at["colour"]:
                    at["bg"] = "white" if at["colour"] != "white" else "black"
        else:
            attrs = [at for at in attrs if (at["colour"], at["shape"]) not in shapes.HELDOUT]
        attrs = attrs[:64]
        caps = [shapes.caption(at["size"], at["colour"], at["shape"], at["pos"], at["bg"]) for at in attrs]
        with torch.no_grad():
            imgs = pipe(prompt=caps, num_inference_steps=steps, guidance_scale=cfg, height=size, width=size,
                        generator=torch.Generator("cuda").manual_seed(5), output_type="pt").images
        tally = {"bg": 0, "colour": 0, "pos": 0, "size": 0, "all": 0}
        for img, at in zip(imgs, attrs):
            ch = check(at, analyse(img.float()))
            for k_, v in ch.items():
                tally[k_] += int(v)
            tally["all"] += int(all(ch.values()))
        results[name] = {k_: v / len(attrs) for k_, v in tally.items()}
        results[name]["n"] = len(attrs)
    return results


def export_and_sample(a, vae, te, unet, ids_of, steps_done):
    import ldm_convert
    from PIL import Image
    from safetensors.torch import save_file

    t_start = time.time()
    # f16 round, then everything below runs on exactly the exported weights (in float32)
    with torch.no_grad():
        for m in (vae, te, unet):
            m.float()
            for p in m.parameters():
                p.copy_(p.half().float())
    ldm = ldm_convert.pipeline_to_ldm(unet, vae, te, dtype=torch.float16)
    path = os.path.join(a.out, "easel-demo-shapes.safetensors")
    meta = {"format": "pt", "easel_model": "easel-demo-shapes", "architecture": "SD1.x (miniature)",
            "unet_preset": a.arch, "unet_config": json.dumps(UNET_CFG),
            "scaling_factor": str(SCALE), "licence": "CC0-1.0",
            "train_steps_unet": (a.history + " + " if a.history else "") + f"{steps_done} (batch {a.batch})",
            "prediction_type": SCHED["prediction_type"],
            "beta_schedule": "scaled_linear 0.00085..0.012, 1000 steps"
            + (", rescaled to zero terminal SNR (Lin et al. 2023)" if a.zsnr else ""),
            "clip_skip": "1 (final layer norm output)",
            "train_steps_vae": "2040 (1458 + 582 continued), batch 32", "resolution": "256x256 (32x32 latent)",
            "tokenizer": "CLIP BPE (openai bpe_simple_vocab_16e6), 77 tokens, pad with <|endoftext|> 49407",
            "source": "tools/demo-model (easel repository)"}
    if a.zsnr:  # ComfyUI's / Forge's markers of a v-prediction, zero-terminal-SNR single file (presence counts)
        ldm["v_pred"] = torch.tensor(0.0)
        ldm["ztsnr"] = torch.tensor(0.0)
    save_file(ldm, path, metadata=meta)
    log(f"exported {path}: {os.path.getsize(path) / 1e6:.2f} MB, {len(ldm)} tensors")
    summary = {"unet_steps": steps_done, "history": meta["train_steps_unet"], "batch": a.batch, "lr": a.lr,
               "warmup": a.warmup, "ema": a.ema, "train_s": getattr(a, "train_s", None),
               "pool_latents": getattr(a, "pool_n", 0), "pool_s": getattr(a, "pool_s", 0),
               "channels_last": a.channels_last, "min_snr": a.min_snr, "offset_noise": a.offset_noise,
               "pyramid_noise": a.pyramid_noise, "zsnr": a.zsnr,
               "vae_from": a.vae_from, "resume": a.resume, "final_loss_smoothed": getattr(a, "loss_smoothed", None),
               "lr_schedule_steps": getattr(a, "lr_schedule_steps", None),
               "arch": a.arch, "unet_config": UNET_CFG, "text_encoder_config": TE_CFG, "vae_config": VAE_CFG,
               "scheduler": SCHED, "file_mb": os.path.getsize(path) / 1e6}
    spath = os.path.join(a.out, "train_summary.json")

    def dump():
        with open(spath, "w") as f:
            json.dump(summary, f, indent=1, default=str)

    dump()
    tok = ids_of.tok
    pipe = make_pipe(vae, te, unet, tok)
    pipe.to("cuda")
    # --- attribute accuracy on the GPU at several CFG scales; the best in-distribution mean wins --------
    cfgs = [float(c) for c in a.cfgs.split(",")]
    summary["accuracy"] = {}
    for c in cfgs:
        r = accuracy(pipe, c, 256, 20)
        summary["accuracy"][f"256px 20 steps cfg {c:g}"] = r
        log(f"accuracy cfg {c:g}:", json.dumps(r))
    dump()
    score = {c: sum(summary["accuracy"][f"256px 20 steps cfg {c:g}"]["random"][k] for k in ("bg", "colour", "pos", "size"))
             for c in cfgs}
    best = max(cfgs, key=lambda c: (round(score[c], 6), c))
    cfg = best if a.ref_cfg == "auto" else float(a.ref_cfg)
    summary["cfg_chosen"] = cfg
    log(f"cfg scores {score}; chosen {cfg:g}")
    for size, steps in (((128, 20), (256, 10)) if a.extra_analysis else ()):
        r = accuracy(pipe, cfg, size, steps)
        summary["accuracy"][f"{size}px {steps} steps cfg {cfg:g}"] = r
        log(f"accuracy {size}px {steps} steps cfg {cfg:g}:", json.dumps(r))
    dump()
    # --- the measured-check test's prompts with CPU-generator noise (easel --rng cpu) ---------------
    summary["test_prompts"] = {}
    for size in ((256, 128) if a.extra_analysis else (256,)):
        rows = []
        for seed in range(1, 5):
            noise = torch.cat([torch.randn((1, 4, size // 8, size // 8), generator=torch.Generator().manual_seed(seed))
                               for _ in TEST_PROMPTS])
            with torch.no_grad():
                imgs = pipe(prompt=TEST_PROMPTS, num_inference_steps=20, guidance_scale=cfg, height=size, width=size,
                            latents=noise.to("cuda"), output_type="pt").images
            for p, img in zip(TEST_PROMPTS, imgs):
                res = analyse(img.float())
                rows.append({"prompt": p, "seed": seed, "analysis": res, "check": check(parse_prompt(p), res)})
        summary["test_prompts"][f"{size}px 20 steps cfg {cfg:g}"] = rows
        ok = sum(all(r["check"].values()) for r in rows)
        log(f"test prompts {size}px: {ok}/{len(rows)} pass all checks")
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
    summary["card_prompts"] = card
    sdir = os.path.join(a.out, "samples")
    os.makedirs(sdir, exist_ok=True)
    with torch.no_grad():
        imgs = pipe(prompt=card, num_inference_steps=20, guidance_scale=cfg, height=256, width=256,
                    generator=torch.Generator("cuda").manual_seed(1), output_type="pt").images
    tiles = []
    for i, img in enumerate(imgs):
        arr = (img.permute(1, 2, 0).float().cpu().numpy() * 255).round().astype("uint8")
        Image.fromarray(arr).save(os.path.join(sdir, f"sample_{i}.png"))
        tiles.append(arr)
    import numpy as np

    grid = np.concatenate([np.concatenate(tiles[:4], 1), np.concatenate(tiles[4:], 1)], 0)
    Image.fromarray(grid).resize((512, 256), Image.LANCZOS).save(os.path.join(sdir, "grid.png"))
    # --- parity references on the CPU in float32 (for easel's --rng cpu comparison) -----------------
    pipe.to("cpu")
    refs = []
    rdir = os.path.join(a.out, "reference")
    os.makedirs(rdir, exist_ok=True)
    from safetensors.torch import save_file as sf
    for j, (prompt, seed) in enumerate([("a small red circle on the left, blue background", 1),
                                        ("a large green star in the centre, white background", 2)]):
        lat = []

        def cb(p, i, ts, kw):
            lat.append(kw["latents"].detach().float().clone())
            return kw

        with torch.no_grad():
            cond, uncond = pipe.encode_prompt(prompt, "cpu", 1, True)
            img = pipe(prompt=prompt, num_inference_steps=20, guidance_scale=cfg, height=256, width=256,
                       generator=torch.Generator("cpu").manual_seed(seed), output_type="pt",
                       callback_on_step_end=cb).images
        noise = torch.randn((1, 4, 32, 32), generator=torch.Generator("cpu").manual_seed(seed))
        name = f"demo_ref_{j}"
        sf({"noise": noise, "final_latent": lat[-1], "step_latents": torch.cat(lat), "cond": cond.float(),
            "uncond": uncond.float(), "image": img.float(), "sigmas": pipe.scheduler.sigmas.float(),
            "timesteps": pipe.scheduler.timesteps.float()}, os.path.join(rdir, name + ".safetensors"))
        arr = (img[0].permute(1, 2, 0).numpy() * 255).round().astype("uint8")
        Image.fromarray(arr).save(os.path.join(rdir, name + ".png"))
        refs.append({"name": name, "prompt": prompt, "negative_prompt": "", "seed": seed, "width": 256,
                     "height": 256, "steps": 20, "cfg_scale": cfg, "sampling_method": "euler",
                     "scheduler": "discrete", "rng": "cpu", "png": name + ".png",
                     "tensors": name + ".safetensors",
                     "diffusers_scheduler_config": {k: v for k, v in dict(pipe.scheduler.config).items()
                                                    if not k.startswith("_")},
                     "sigmas": [float(s) for s in pipe.scheduler.sigmas],
                     "timesteps": [float(s) for s in pipe.scheduler.timesteps],
                     "check": dict(zip(["bg", "colour", "cx", "cy", "area"], analyse(img[0].float())))})
    with open(os.path.join(rdir, "cases.json"), "w") as f:
        json.dump({"model": "models/demo/easel-demo-shapes.safetensors", "device": "cpu float32",
                   "weights": "exactly the f16 values of the file", "cases": refs}, f, indent=1, default=str)
    summary["export_and_sample_s"] = time.time() - t_start
    dump()
    log(f"export and sampling done ({summary['export_and_sample_s']:.0f}s)")


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
    ap.add_argument("stage", choices=["vae", "unet", "preview"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--vae", help="folder with vae.safetensors (unet stage)")
    ap.add_argument("--resume", help="unet stage: exported single file to continue training from")
    ap.add_argument("--warmup", type=int, default=300, help="unet stage: LR warm-up steps")
    ap.add_argument("--init", help="vae stage: folder with a vae.safetensors to continue from")
    ap.add_argument("--tok", help="folder with the CLIP tokenizer files (unet stage)")
    ap.add_argument("--time", type=float, default=170, help="training wall-clock budget in seconds")
    ap.add_argument("--steps", type=int, default=0, help="fixed step count instead of --time (exact re-runs)")
    ap.add_argument("--est-steps", type=int, default=6000, help="steps the LR schedule is laid out for")
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--lr", type=float, default=0)
    ap.add_argument("--pool", type=int, default=0,
                    help="unet stage: encode this many training images once and sample batches from them (0: "
                         "render and encode every batch, the original loop)")
    ap.add_argument("--pool-time", type=float, default=60, help="unet stage: seconds at most for building the pool")
    ap.add_argument("--channels-last", choices=["auto", "yes", "no"], default="no",
                    help="unet stage with --pool: UNet memory format (auto: time both, take the faster)")
    ap.add_argument("--fused", action="store_true", help="unet stage: fused AdamW kernel")
    ap.add_argument("--ema", type=float, default=0.999, help="unet stage: EMA decay")
    ap.add_argument("--cfgs", default="7.5", help="unet stage: CFG scales to measure accuracy at (comma list)")
    ap.add_argument("--ref-cfg", default="7.5",
                    help="unet stage: CFG scale of samples and references ('auto': the best measured of --cfgs)")
    ap.add_argument("--vae-from", help="unet stage: take the VAE from this single file (first_stage_model.*), "
                                       "train text encoder and UNet from scratch")
    ap.add_argument("--offset-noise", type=float, default=0.05,
                    help="unet stage: std of the per-channel offset added to the noise (Crosslabs' offset noise)")
    ap.add_argument("--no-extra-analysis", dest="extra_analysis", action="store_false",
                    help="unet stage: skip the 128x128 and 10-step accuracy runs and the 128x128 test prompts")
    ap.add_argument("--pyramid-noise", type=float, default=0,
                    help="unet stage: discount of multi-resolution noise added to the noise (0: off; run 8: 0.8)")
    ap.add_argument("--min-snr", type=float, default=0, help="unet stage: Min-SNR-gamma loss weight (0: off)")
    ap.add_argument("--zsnr", action="store_true",
                    help="unet stage: zero-terminal-SNR betas (Lin et al. 2023) and v-prediction; the file gets the "
                         "v_pred and ztsnr marker tensors and the samplers EulerDiscreteScheduler(rescale_betas_zero_snr)")
    ap.add_argument("--history", default="", help="unet stage: earlier training, recorded in the file's metadata")
    ap.add_argument("--arch", default="v1", choices=sorted(archs.UNET_PRESETS),
                    help="unet stage: UNet preset of tools/demo-model/archs.py (v1: runs 1-6; lowattn: run 7)")
    ap.add_argument("--end-by", type=float, default=0,
                    help="unet stage: Unix time by which the whole job must end; training is shortened to fit")
    ap.add_argument("--reserve", type=float, default=75,
                    help="unet stage with --end-by: seconds kept for export, accuracy, samples and references")
    a = ap.parse_args()
    global UNET_CFG
    UNET_CFG = archs.UNET_PRESETS[a.arch]
    if a.zsnr:
        if a.min_snr:
            ap.error("--min-snr weighs the top timestep (SNR 0) by 0 with v-prediction; leave it out with --zsnr")
        SCHED.update(prediction_type="v_prediction", rescale_betas_zero_snr=True)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    if a.stage == "preview":
        preview(a)
    elif a.stage == "vae":
        a.batch = a.batch or 32
        a.lr = a.lr or 4e-4
        train_vae(a)
    else:
        a.batch = a.batch or 128
        a.lr = a.lr or 5e-4
        train_unet(a)


if __name__ == "__main__":
    main()
