"""Tiny complete FLUX.2 [klein] pipeline (random, seeded weights), reference generations, and a TAEF2 check.

Runs on the GPU machine with diffusers' source on PYTHONPATH; every model runs on the CPU in float32 (weights
rounded to f16 values first), so the numbers do not depend on TF32/cuDNN.

Components (diffusers' Flux2KleinPipeline: scheduler, vae, text_encoder, tokenizer, transformer; is_distilled=False
so that guidance_scale > 1 runs CFG with the negative prompt "" as the pipeline does):
  tokenizer     the real Qwen3 tokenizer (tokenizer.json + tokenizer_config.json, carried gzipped)
  text_encoder  Qwen3ForCausalLM, real vocabulary (151936), hidden 8, 28 layers (the pipeline reads hidden_states
                9, 18 and 27, so the tiny model keeps the real layer convention: 27 < 28 layers, so hidden_states[27]
                is a raw layer output as in Qwen3-4B/8B with 36 layers), 2 q heads / 1 kv head, head_dim 16, tied
                embeddings (saved keys model.*, as ComfyUI's qwen_3_4b.safetensors)
  transformer   Flux2Transformer2DModel: in_channels 128 (32 latent channels x 2x2), 2 double + 2 single blocks,
                2 heads x 16, joint_attention_dim 24 (= 3 x 8), axes (4, 4, 4, 4), theta 2000, no guidance embeds
  vae           AutoencoderKLFlux2: 4 levels of 32 channels (factor 8), 1 resnet per level, 32 latent channels,
                32 groups (the real count: a single file carries no config), quant convs, BatchNorm statistics
                set to random values (so a mapping bug shows)
  scheduler     FlowMatchEulerDiscreteScheduler as FLUX.2 [klein]'s scheduler_config.json (dynamic shifting,
                exponential time shift; mu = compute_empirical_mu(image_seq_len, steps) given by the pipeline)

Writes into --out:
  diffusers/                        Flux2KleinPipeline.save_pretrained, f16 weights; tokenizer/ holds only
                                    tokenizer_config.json (+ chat template), not the 11 MB tokenizer.json
  klein_tiny_transformer.safetensors the transformer in the BFL / ComfyUI layout (bare keys, f16): img_in, txt_in,
                                    time_in.{in,out}_layer, *_modulation_*.lin, double_blocks.N.{img,txt}_attn.qkv
                                    (fused), .norm.{query,key}_norm.scale, .proj, {img,txt}_mlp.{0,2},
                                    single_blocks.N.{linear1,linear2,norm.*}, final_layer.{adaLN_modulation.1
                                    (shift, scale), linear} (the inverse of diffusers'
                                    convert_flux2_transformer_checkpoint_to_diffusers)
  klein_tiny_vae.safetensors        the VAE in the BFL flux2 ae.safetensors layout (ldm names, encoder.quant_conv,
                                    decoder.post_quant_conv, bn.running_mean / bn.running_var), f16
  (te single file: diffusers/text_encoder/model.safetensors itself)
  ref0.png, ref1.png                reference images of the edit case (72x64: centre-cropped to 64x64 by the
                                    pipeline; 64x96)
  cases.json                        every case: prompt, seed, size, steps, guidance, references, easel flags,
                                    templated prompt, token ids, sigmas, timesteps, mu
  case_<name>.png                   final image (uint8 as diffusers' numpy_to_pil: (x*255).round())
  case_<name>.safetensors           float32: noise [1,128,h,w], cond [512, 24] (stacked hidden_states 9/18/27 of all
                                    512 padded tokens), uncond (CFG cases), input_ids [512], attention_mask [512],
                                    ref_latents [1, Lref, 128] (packed, normalised; edit case), dit0_x [1, L, 128]
                                    (noisy tokens then reference tokens), dit0_t [1] (t/1000), dit0_img_ids [1, L, 4],
                                    dit0_txt_ids [1, 512, 4], dit0_out [1, L, 128] (whole output incl. reference
                                    tokens), step_latents [steps, Li, 128] (packed), final_latent [1, 128, h, w],
                                    vae_latent [1, 32, H/8, W/8] (what vae.decode gets), image [1, 3, H, W] in [0, 1]
  te_hidden_states.safetensors      for the first case: every hidden_states[i] over the real tokens (debugging)
  taef2_test_image.png              a procedural photo-like test image (256x192), deterministic
  taef2_check.safetensors           TAEF2 (the real weights) on it: latents [1, 32, 24, 32]
  taef2_check.json                  PSNR of encode -> decode (float, and after uint8 rounding)
"""

import argparse
import gzip
import json
import math
import os
import shutil
import sys
import time

import numpy as np
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ldm_convert  # noqa: E402

TE_CFG = dict(vocab_size=151936, hidden_size=8, intermediate_size=16, num_hidden_layers=28, num_attention_heads=2,
              num_key_value_heads=1, head_dim=16, hidden_act="silu", max_position_embeddings=40960,
              rms_norm_eps=1e-6, rope_theta=1000000.0, attention_bias=False, tie_word_embeddings=True,
              initializer_range=0.1, bos_token_id=151643, eos_token_id=151645)
DIT_CFG = dict(patch_size=1, in_channels=128, out_channels=None, num_layers=2, num_single_layers=2,
               attention_head_dim=16, num_attention_heads=2, joint_attention_dim=24, timestep_guidance_channels=256,
               mlp_ratio=3.0, axes_dims_rope=(4, 4, 4, 4), rope_theta=2000, eps=1e-6, guidance_embeds=False)
VAE_CFG = dict(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
               up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(32, 32, 32, 32), layers_per_block=1,
               act_fn="silu", latent_channels=32, norm_num_groups=32, sample_size=64, use_quant_conv=True,
               use_post_quant_conv=True, mid_block_add_attention=True, batch_norm_eps=1e-4, batch_norm_momentum=0.1,
               patch_size=(2, 2))
# FLUX.2 [klein] scheduler_config.json (black-forest-labs/FLUX.2-klein-4B)
SCHED_CFG = dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                 base_image_seq_len=256, max_image_seq_len=4096, time_shift_type="exponential")

CASES = [
    # name, prompt, seed, W, H, steps, guidance_scale (diffusers), reference images
    ("cat_s0_64", "a photo of a cat", 0, 64, 64, 4, 1.0, []),
    ("cfg_s1_96x64", "a small red circle on the left, blue background", 1, 96, 64, 4, 4.0, []),
    ("edit_s2_64", "make the sky purple", 2, 64, 64, 4, 1.0, ["ref0.png", "ref1.png"]),
]


def round_f16(m):
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(p.half().float())
        for b in m.buffers():
            if b.is_floating_point():
                b.copy_(b.half().float())
    m.eval()
    return m


def build_models(seed):
    from diffusers import AutoencoderKLFlux2, Flux2Transformer2DModel
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = dict(TE_CFG)
    theta = cfg.pop("rope_theta")
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}  # transformers 5 form
    te = Qwen3ForCausalLM(Qwen3Config(**cfg))
    te.set_attn_implementation("eager")
    torch.manual_seed(seed + 1)
    dit = Flux2Transformer2DModel(**DIT_CFG)
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed + 3)
        for n, p in dit.named_parameters():
            if float(p.abs().max()) == 0.0:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    torch.manual_seed(seed + 2)
    vae = AutoencoderKLFlux2(**VAE_CFG)
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed + 4)
        vae.bn.running_mean.copy_(torch.randn(vae.bn.running_mean.shape, generator=g) * 0.2)
        vae.bn.running_var.copy_(0.5 + torch.rand(vae.bn.running_var.shape, generator=g) * 1.5)
    return round_f16(te), round_f16(dit), round_f16(vae)


def dit_to_bfl(sd):
    """diffusers Flux2Transformer2DModel state dict -> BFL / ComfyUI names (bare keys): the inverse of
    diffusers' convert_flux2_transformer_checkpoint_to_diffusers."""
    ren = [("x_embedder.", "img_in."), ("context_embedder.", "txt_in."),
           ("time_guidance_embed.timestep_embedder.linear_1.", "time_in.in_layer."),
           ("time_guidance_embed.timestep_embedder.linear_2.", "time_in.out_layer."),
           ("time_guidance_embed.guidance_embedder.linear_1.", "guidance_in.in_layer."),
           ("time_guidance_embed.guidance_embedder.linear_2.", "guidance_in.out_layer."),
           ("double_stream_modulation_img.linear.", "double_stream_modulation_img.lin."),
           ("double_stream_modulation_txt.linear.", "double_stream_modulation_txt.lin."),
           ("single_stream_modulation.linear.", "single_stream_modulation.lin."), ("proj_out.", "final_layer.linear.")]
    dbl = {"attn.norm_q.weight": "img_attn.norm.query_norm.scale", "attn.norm_k.weight": "img_attn.norm.key_norm.scale",
           "attn.to_out.0.weight": "img_attn.proj.weight", "ff.linear_in.weight": "img_mlp.0.weight",
           "ff.linear_out.weight": "img_mlp.2.weight", "attn.norm_added_q.weight": "txt_attn.norm.query_norm.scale",
           "attn.norm_added_k.weight": "txt_attn.norm.key_norm.scale", "attn.to_add_out.weight": "txt_attn.proj.weight",
           "ff_context.linear_in.weight": "txt_mlp.0.weight", "ff_context.linear_out.weight": "txt_mlp.2.weight"}
    sgl = {"attn.to_qkv_mlp_proj.weight": "linear1.weight", "attn.to_out.weight": "linear2.weight",
           "attn.norm_q.weight": "norm.query_norm.scale", "attn.norm_k.weight": "norm.key_norm.scale"}
    out = {}
    for k, v in sd.items():
        if k.startswith("transformer_blocks."):
            _, n, rest = k.split(".", 2)
            if rest in ("attn.to_q.weight", "attn.add_q_proj.weight"):
                names = ("to_q", "to_k", "to_v") if "to_q" in rest else ("add_q_proj", "add_k_proj", "add_v_proj")
                fused = torch.cat([sd[f"transformer_blocks.{n}.attn.{m}.weight"] for m in names], 0)
                out[f"double_blocks.{n}.{'img' if 'to_q' in rest else 'txt'}_attn.qkv.weight"] = fused
            elif rest in ("attn.to_k.weight", "attn.to_v.weight", "attn.add_k_proj.weight", "attn.add_v_proj.weight"):
                continue
            else:
                out[f"double_blocks.{n}.{dbl[rest]}"] = v
        elif k.startswith("single_transformer_blocks."):
            _, n, rest = k.split(".", 2)
            out[f"single_blocks.{n}.{sgl[rest]}"] = v
        elif k.startswith("norm_out.linear."):
            scale, shift = v.chunk(2, 0)  # diffusers (scale, shift) -> BFL (shift, scale)
            out[k.replace("norm_out.linear.", "final_layer.adaLN_modulation.1.")] = torch.cat([shift, scale], 0)
        else:
            nk = k
            for a, b in ren:
                if nk.startswith(a):
                    nk = b + nk[len(a):]
                    break
            else:
                raise KeyError(f"no BFL name for transformer key {k}")
            out[nk] = v
    return out


def vae_to_bfl(vae):
    """AutoencoderKLFlux2 state dict -> the BFL flux2 ae.safetensors layout: ldm names (ldm_convert), the quant
    convs inside encoder/decoder (diffusers scripts/convert_flux2_to_diffusers.py DIFFUSERS_VAE_TO_FLUX2_MAPPING),
    bn.running_mean / bn.running_var (num_batches_tracked dropped)."""
    sd = {k: v for k, v in vae.state_dict().items() if not k.startswith("bn.")}
    out = {}
    for k, v in ldm_convert.vae_to_ldm(sd, dict(vae.config)).items():
        k = k[len(ldm_convert.VAE_PREFIX):]
        if k.startswith("quant_conv."):
            k = "encoder." + k
        elif k.startswith("post_quant_conv."):
            k = "decoder." + k
        out[k] = v
    out["bn.running_mean"] = vae.bn.running_mean
    out["bn.running_var"] = vae.bn.running_var
    return out


def image_to_png(arr01, path):
    """[H, W, 3] float in [0, 1] -> PNG with diffusers' numpy_to_pil rounding ((x * 255).round())."""
    Image.fromarray((arr01 * 255).round().astype("uint8")).save(path)


def procedural_image(w, h, variant=0):
    """A deterministic photo-like RGB image (uint8 [h, w, 3]): sky gradient, sun, hills with a ridge line,
    a house, grass texture from smoothed value noise, mild vignetting."""
    rng = np.random.default_rng(1234 + variant)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    u, v = x / w, y / h
    img = np.zeros((h, w, 3))
    sky_top = np.array([0.25, 0.45, 0.85]) if variant != 1 else np.array([0.85, 0.45, 0.25])
    sky_bot = np.array([0.75, 0.85, 0.95])
    img[:] = sky_top * (1 - v[..., None]) + sky_bot * v[..., None]
    # sun with a soft halo
    d = np.hypot(u - 0.75, v - 0.22)
    img += (np.exp(-(d / 0.05) ** 2) * 0.8 + np.exp(-(d / 0.2) ** 2) * 0.15)[..., None] * np.array([1.0, 0.9, 0.6])

    def value_noise(scale):
        gh, gw = int(h / scale) + 2, int(w / scale) + 2
        g = rng.random((gh, gw))
        fy, fx = y / scale, x / scale
        y0, x0 = np.floor(fy).astype(int), np.floor(fx).astype(int)
        ty, tx = fy - y0, fx - x0
        ty, tx = ty * ty * (3 - 2 * ty), tx * tx * (3 - 2 * tx)
        a, b = g[y0, x0], g[y0, x0 + 1]
        c, e = g[y0 + 1, x0], g[y0 + 1, x0 + 1]
        return (a * (1 - tx) + b * tx) * (1 - ty) + (c * (1 - tx) + e * tx) * ty

    tex = 0.5 * value_noise(24) + 0.3 * value_noise(8) + 0.2 * value_noise(3)
    ridge = 0.55 + 0.08 * np.sin(u * 7.0 + variant) + 0.04 * np.sin(u * 19.0) + 0.03 * (value_noise(16)[0:1, :] - 0.5)
    hill = v > ridge
    grass = np.stack([0.20 + 0.25 * tex, 0.45 + 0.3 * tex, 0.15 + 0.1 * tex], -1) * (0.7 + 0.5 * (v - ridge))[..., None]
    img = np.where(hill[..., None], grass, img)
    # a house: wall, roof, window
    wall = (u > 0.18) & (u < 0.38) & (v > 0.5) & (v < 0.75)
    img = np.where(wall[..., None], np.array([0.8, 0.7, 0.55]) * (0.85 + 0.15 * tex)[..., None], img)
    roof = (v > 0.38) & (v <= 0.5) & (np.abs(u - 0.28) < (v - 0.38) * 1.1)
    img = np.where(roof[..., None], np.array([0.55, 0.15, 0.12]) * (0.9 + 0.2 * tex)[..., None], img)
    win = (u > 0.24) & (u < 0.30) & (v > 0.56) & (v < 0.64)
    img = np.where(win[..., None], np.array([0.15, 0.2, 0.3]), img)
    img *= (1.0 - 0.25 * ((u - 0.5) ** 2 + (v - 0.5) ** 2))[..., None]
    img += (rng.random((h, w, 3)) - 0.5) * 0.02  # sensor noise
    return (np.clip(img, 0, 1) * 255).round().astype(np.uint8)


def easel_flags(c):
    f = [f'-p "{c["prompt"]}"', f'-W {c["width"]}', f'-H {c["height"]}', f'--steps {c["steps"]}',
         f'--cfg-scale {c["cfg_scale"]}', f'-s {c["seed"]}', "--sampling-method euler", "--scheduler flux2",
         "--rng cpu"]
    for r in c["ref_images"]:
        f.append(f"-r {r}")
    return " ".join(f)


def run_case(pipe, case, out, dump_hidden):
    from diffusers.pipelines.flux2.pipeline_flux2_klein import compute_empirical_mu

    name, prompt, seed, W, H, steps, g, refs = case
    tok, te = pipe.tokenizer, pipe.text_encoder
    cfg_active = g > 1.0 and not pipe.config.is_distilled
    t = {}
    info = {}
    for key, text in (("cond", prompt), ("uncond", "")):
        if key == "uncond" and not cfg_active:
            continue
        templ = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                        add_generation_prompt=True, enable_thinking=False)
        enc = tok(templ, return_tensors="pt", padding="max_length", truncation=True, max_length=512)
        mask = enc.attention_mask
        with torch.no_grad():
            emb = pipe._get_qwen3_prompt_embeds(te, tok, text, dtype=torch.float32, device=torch.device("cpu"))
            hs = te(input_ids=enc.input_ids, attention_mask=mask, output_hidden_states=True,
                    use_cache=False).hidden_states
        t[key] = emb[0].float().clone()
        t[key + "_input_ids"] = enc.input_ids[0].to(torch.int32)
        t[key + "_attention_mask"] = mask[0].to(torch.int32)
        real = mask[0].bool()
        info[key + "_template"] = templ
        info[key + "_ids"] = [int(x) for x in enc.input_ids[0][real]]
        info[key + "_real_tokens"] = int(real.sum())
        info[key + "_pad_id"] = int(enc.input_ids[0][-1])
        if dump_hidden and key == "cond":
            hd = {f"hidden_states.{i}": h[0][real].float().contiguous() for i, h in enumerate(hs)}
            hd["input_ids"] = enc.input_ids[0][real].to(torch.int32)
            save_file(hd, os.path.join(out, "te_hidden_states.safetensors"))

    steps_lat = []

    def cb(p, i, ts, kw):
        steps_lat.append(kw["latents"].detach().float().clone())
        return kw

    first = {}

    def hook(mod, args, kwargs, output):
        if not first:
            first["x"] = kwargs["hidden_states"].detach().float().clone()
            first["t"] = torch.as_tensor(kwargs["timestep"], dtype=torch.float32).reshape(-1).clone()
            first["img_ids"] = kwargs["img_ids"].detach().float().clone()
            first["txt_ids"] = kwargs["txt_ids"].detach().float().clone()
            first["ctx"] = kwargs["encoder_hidden_states"].detach().float().clone()
            first["out"] = output[0].detach().float().clone()

    dec_in = {}

    def vae_hook(mod, args, kwargs):
        if "z" not in dec_in:
            z = args[0] if args else kwargs["z"]
            dec_in["z"] = z.detach().float().clone()

    ref_imgs = [Image.open(os.path.join(out, r)).convert("RGB") for r in refs]
    h = pipe.transformer.register_forward_hook(hook, with_kwargs=True)
    orig_decode = pipe.vae.decode

    def decode_spy(z, *a, **k):
        vae_hook(None, (z,), {})
        return orig_decode(z, *a, **k)

    pipe.vae.decode = decode_spy
    gen = torch.Generator("cpu").manual_seed(seed)
    with torch.no_grad():
        img = pipe(image=ref_imgs or None, prompt=prompt, height=H, width=W, num_inference_steps=steps,
                   guidance_scale=g, generator=gen, output_type="np", callback_on_step_end=cb).images
    h.remove()
    del pipe.vae.decode  # the class method again
    sched = pipe.scheduler
    lh, lw = H // 16, W // 16
    t["noise"] = torch.randn((1, 128, lh, lw), generator=torch.Generator("cpu").manual_seed(seed),
                             dtype=torch.float32)
    t["step_latents"] = torch.cat(steps_lat, 0)
    t["final_latent"] = steps_lat[-1][0].reshape(lh, lw, 128).permute(2, 0, 1)[None].contiguous()
    t["vae_latent"] = dec_in["z"]
    t["image"] = torch.from_numpy(np.ascontiguousarray(img)).permute(0, 3, 1, 2).float()
    t["dit0_x"], t["dit0_t"], t["dit0_out"] = first["x"], first["t"], first["out"]
    t["dit0_img_ids"], t["dit0_txt_ids"] = first["img_ids"], first["txt_ids"]  # (encoder_hidden_states = cond / uncond)
    n_img = lh * lw
    if refs:
        t["ref_latents"] = first["x"][:, n_img:].clone()  # own storage: save_file refuses shared memory
    t["sigmas"] = sched.sigmas.float().cpu()
    t["timesteps"] = sched.timesteps.float().cpu()
    save_file({k: v.contiguous().clone() for k, v in t.items()}, os.path.join(out, f"case_{name}.safetensors"))
    image_to_png(img[0], os.path.join(out, f"case_{name}.png"))
    mu = compute_empirical_mu(image_seq_len=n_img, num_steps=steps)
    c = {"name": name, "prompt": prompt, "negative_prompt": "", "seed": seed, "width": W, "height": H,
         "steps": steps, "diffusers_guidance_scale": g, "cfg_active": cfg_active,
         # diffusers: pred = neg + g*(pos - neg) when g > 1 (not distilled): easel --cfg-scale g
         "cfg_scale": g if cfg_active else 1.0, "sampling_method": "euler", "scheduler": "flux2", "rng": "cpu",
         "ref_images": refs, "ref_sizes": [list(im.size) for im in ref_imgs],
         "png": f"case_{name}.png", "tensors": f"case_{name}.safetensors", "latent_shape": [128, lh, lw],
         "image_seq_len": n_img, "dit_seq_len": int(first["x"].shape[1]), "mu": mu,
         "sigmas": [float(x) for x in sched.sigmas], "timesteps": [float(x) for x in sched.timesteps],
         "dit_calls_per_step": 2 if cfg_active else 1, **info}
    c["easel_args"] = "generate -m diffusers " + easel_flags(c)
    c["easel_args_single_files"] = ("generate --diffusion-model klein_tiny_transformer.safetensors "
                                    "--llm diffusers/text_encoder/model.safetensors --vae klein_tiny_vae.safetensors "
                                    + easel_flags(c))
    return c, img


# ---------------------------------------------------------------- TAEF2 (madebyollin/taesd taesd.py architecture)
def taesd_conv(n_in, n_out, **kw):
    return torch.nn.Conv2d(n_in, n_out, 3, padding=1, **kw)


class TaeClamp(torch.nn.Module):
    def forward(self, x):
        return torch.tanh(x / 3) * 3


class TaeBlock(torch.nn.Module):
    def __init__(self, n_in, n_out, pool=False):
        super().__init__()
        nn = torch.nn
        self.conv = nn.Sequential(taesd_conv(n_in, n_out), nn.ReLU(), taesd_conv(n_out, n_out), nn.ReLU(),
                                  taesd_conv(n_out, n_out))
        self.skip = nn.Conv2d(n_in, n_out, 1, bias=False) if n_in != n_out else nn.Identity()
        self.fuse = nn.ReLU()
        self.pool = None
        if pool:  # TAEF2 "midblock GN": 1x1 C->4C, GroupNorm(4, 4C), ReLU, 1x1 4C->C, no biases
            self.pool = nn.Sequential(nn.Conv2d(n_in, 4 * n_in, 1, bias=False), nn.GroupNorm(4, 4 * n_in),
                                      nn.ReLU(), nn.Conv2d(4 * n_in, n_in, 1, bias=False))

    def forward(self, x):
        if self.pool is not None:
            x = x + self.pool(x)
        return self.fuse(self.conv(x) + self.skip(x))


def taef2_encoder(lc=32):
    B = TaeBlock
    return torch.nn.Sequential(
        taesd_conv(3, 64), B(64, 64),
        taesd_conv(64, 64, stride=2, bias=False), B(64, 64), B(64, 64), B(64, 64),
        taesd_conv(64, 64, stride=2, bias=False), B(64, 64), B(64, 64), B(64, 64),
        taesd_conv(64, 64, stride=2, bias=False), B(64, 64, True), B(64, 64, True), B(64, 64, True),
        taesd_conv(64, lc))


def taef2_decoder(lc=32):
    B, nn = TaeBlock, torch.nn
    return nn.Sequential(
        TaeClamp(), taesd_conv(lc, 64), nn.ReLU(),
        B(64, 64, True), B(64, 64, True), B(64, 64, True), nn.Upsample(scale_factor=2), taesd_conv(64, 64, bias=False),
        B(64, 64), B(64, 64), B(64, 64), nn.Upsample(scale_factor=2), taesd_conv(64, 64, bias=False),
        B(64, 64), B(64, 64), B(64, 64), nn.Upsample(scale_factor=2), taesd_conv(64, 64, bias=False),
        B(64, 64), taesd_conv(64, 3))


def taef2_check(out, enc_path, dec_path):
    enc, dec = taef2_encoder(), taef2_decoder()
    enc.load_state_dict({k: v.float() for k, v in load_file(enc_path).items()}, strict=True)
    dec.load_state_dict({k: v.float() for k, v in load_file(dec_path).items()}, strict=True)
    enc.eval()
    dec.eval()
    png = os.path.join(out, "taef2_test_image.png")
    Image.fromarray(procedural_image(256, 192, 0)).save(png)
    x = torch.from_numpy(np.asarray(Image.open(png).convert("RGB"), dtype=np.float32) / 255.0).permute(2, 0, 1)[None]
    with torch.no_grad():
        lat = enc(x)  # taesd.py: images in [0, 1] -> raw latents
        y = dec(lat).clamp(0, 1)
    mse = float(((y - x) ** 2).mean())
    y8 = (y * 255).round() / 255
    mse8 = float(((y8 - x) ** 2).mean())
    res = {"image": "taef2_test_image.png", "size": [256, 192], "psnr_db": 10 * math.log10(1 / mse),
           "psnr_uint8_db": 10 * math.log10(1 / mse8), "latent_shape": list(lat.shape),
           "latent_abs_max": float(lat.abs().max()), "latent_mean": float(lat.mean()), "latent_std": float(lat.std()),
           "note": "PSNR over [0,1] RGB, decoded clamped to [0,1]; weights = tests/data/reference/"
                   "autoencoder_tiny_taef2_{encoder,decoder}.safetensors (fp16) run in float32 on the CPU; "
                   "architecture madebyollin/taesd taesd.py Encoder/Decoder(use_midblock_gn=True)"}
    save_file({"latents": lat.contiguous()}, os.path.join(out, "taef2_check.safetensors"))
    with open(os.path.join(out, "taef2_check.json"), "w") as f:
        json.dump(res, f, indent=1)
    print("taef2:", res)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tok-gz", required=True, help="gzipped Qwen3 tokenizer.json")
    ap.add_argument("--tok-config", required=True, help="Qwen3 tokenizer_config.json")
    ap.add_argument("--taef2-dir", required=True, help="folder with autoencoder_tiny_taef2_{encoder,decoder}.safetensors")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=2468)
    a = ap.parse_args()
    t0 = time.time()
    torch.set_num_threads(8)
    os.makedirs(a.out, exist_ok=True)

    try:
        taef2_check(a.out, os.path.join(a.taef2_dir, "autoencoder_tiny_taef2_encoder.safetensors"),
                    os.path.join(a.taef2_dir, "autoencoder_tiny_taef2_decoder.safetensors"))
    except Exception as e:  # noqa: BLE001
        print("taef2 check failed:", type(e).__name__, e)

    from diffusers import (AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline,
                           Flux2Transformer2DModel)
    from transformers import AutoTokenizer

    tok_dir = "/tmp/klein_tok"
    os.makedirs(tok_dir, exist_ok=True)
    with gzip.open(a.tok_gz, "rb") as f, open(os.path.join(tok_dir, "tokenizer.json"), "wb") as g:
        g.write(f.read())
    shutil.copy(a.tok_config, os.path.join(tok_dir, "tokenizer_config.json"))
    tok = AutoTokenizer.from_pretrained(tok_dir)
    te, dit, vae = build_models(a.seed)
    pipe = Flux2KleinPipeline(scheduler=FlowMatchEulerDiscreteScheduler(**SCHED_CFG), vae=vae, text_encoder=te,
                              tokenizer=tok, transformer=dit, is_distilled=False)
    pipe.set_progress_bar_config(disable=True)

    # reference images of the edit case (72x64 is centre-cropped to 64x64 by the pipeline)
    Image.fromarray(procedural_image(72, 64, 1)).save(os.path.join(a.out, "ref0.png"))
    Image.fromarray(procedural_image(64, 96, 2)).save(os.path.join(a.out, "ref1.png"))

    cases = []
    imgs = {}
    for i, case in enumerate(CASES):
        c, img = run_case(pipe, case, a.out, dump_hidden=(i == 0))
        cases.append(c)
        imgs[c["name"]] = img
        print(f"case {c['name']}: {c['cond_real_tokens']} tokens, done ({time.time() - t0:.1f}s)")

    # (i) diffusers folder, f16 weights (exact: the weights are f16-rounded)
    ddir = os.path.join(a.out, "diffusers")
    pipe.to(torch.float16)
    pipe.save_pretrained(ddir, safe_serialization=True)
    pipe.to(torch.float32)
    tdir = os.path.join(ddir, "tokenizer")
    saved_tok = sorted(os.listdir(tdir))
    for fn in saved_tok:
        if fn not in ("tokenizer_config.json", "chat_template.jinja"):
            os.remove(os.path.join(tdir, fn))
    # (ii) single files, BFL layouts, f16
    bfl = {k: v.half().contiguous() for k, v in dit_to_bfl(dit.state_dict()).items()}
    save_file(bfl, os.path.join(a.out, "klein_tiny_transformer.safetensors"),
              metadata={"format": "pt", "easel_note": "tiny random FLUX.2 klein transformer, BFL layout (f16)"})
    vsd = {k: v.half().contiguous() for k, v in vae_to_bfl(vae).items()}
    save_file(vsd, os.path.join(a.out, "klein_tiny_vae.safetensors"),
              metadata={"format": "pt", "easel_note": "tiny random FLUX.2 VAE, BFL ae.safetensors layout (f16)"})

    checks = {"saved_tokenizer_files": saved_tok}
    # (iii) the saved folder reproduces the CFG case (tokenizer restored from the carried files)
    try:
        shutil.copy(os.path.join(tok_dir, "tokenizer.json"), os.path.join(tdir, "tokenizer.json"))
        p2 = Flux2KleinPipeline.from_pretrained(ddir, torch_dtype=torch.float32)
        os.remove(os.path.join(tdir, "tokenizer.json"))
        p2.set_progress_bar_config(disable=True)
        n, pr, sd, W, H, st, g, refs = CASES[1]
        with torch.no_grad():
            im = p2(prompt=pr, height=H, width=W, num_inference_steps=st, guidance_scale=g,
                    generator=torch.Generator("cpu").manual_seed(sd), output_type="np").images
        checks["folder_reload_max_abs_diff_case1"] = float(np.abs(im - imgs[n]).max())
        checks["folder_is_distilled"] = bool(p2.config.is_distilled)
    except Exception as e:  # noqa: BLE001
        checks["folder_reload_error"] = f"{type(e).__name__}: {e}"[:500]
    # (iv) diffusers' own single-file converter on our BFL-layout transformer
    try:
        from diffusers.loaders.single_file_utils import convert_flux2_transformer_checkpoint_to_diffusers
        conv = convert_flux2_transformer_checkpoint_to_diffusers(
            {k: v.float() for k, v in load_file(os.path.join(a.out, "klein_tiny_transformer.safetensors")).items()})
        ref = dit.state_dict()
        checks["single_file_transformer_keys_equal"] = set(conv) == set(ref)
        checks["single_file_transformer_max_abs_diff"] = max(float((conv[k] - ref[k]).abs().max()) for k in ref)
    except Exception as e:  # noqa: BLE001
        checks["single_file_transformer_error"] = f"{type(e).__name__}: {e}"[:500]
    try:
        m = Flux2Transformer2DModel.from_single_file(os.path.join(a.out, "klein_tiny_transformer.safetensors"),
                                                     config=os.path.join(ddir, "transformer"),
                                                     local_files_only=True, torch_dtype=torch.float32)
        ref = dit.state_dict()
        checks["from_single_file_transformer_max_abs_diff"] = max(
            float((m.state_dict()[k].float() - ref[k]).abs().max()) for k in ref)
    except Exception as e:  # noqa: BLE001
        checks["from_single_file_transformer_error"] = f"{type(e).__name__}: {e}"[:300]
    # (v) the BFL VAE file maps back onto the diffusers VAE (names as scripts/convert_flux2_to_diffusers.py)
    try:
        back = {}
        for k, v in load_file(os.path.join(a.out, "klein_tiny_vae.safetensors")).items():
            kk = k.replace("encoder.quant_conv.", "quant_conv.").replace("decoder.post_quant_conv.", "post_quant_conv.")
            back[kk] = v
        inv = ldm_convert.vae_to_ldm({k: v for k, v in vae.state_dict().items() if not k.startswith("bn.")},
                                     dict(vae.config))
        checks["vae_bfl_keys"] = len(back)
        checks["vae_bfl_roundtrip_max_abs_diff"] = max(
            float((back[k[len(ldm_convert.VAE_PREFIX):]].float() - v.reshape(back[k[len(ldm_convert.VAE_PREFIX):]].shape)
                   ).abs().max()) for k, v in inv.items())
    except Exception as e:  # noqa: BLE001
        checks["vae_bfl_error"] = f"{type(e).__name__}: {e}"[:300]
    print("checks:", checks)

    import diffusers
    import transformers

    meta = {"generator": "tools/reference/make_klein_pipeline.py", "seed": a.seed, "torch": torch.__version__,
            "diffusers": diffusers.__version__, "transformers": transformers.__version__, "device": "cpu float32",
            "weights": "f16-rounded, run in float32", "checks": checks,
            "single_files": {"diffusion_model": "klein_tiny_transformer.safetensors",
                             "vae": "klein_tiny_vae.safetensors", "llm": "diffusers/text_encoder/model.safetensors"},
            "text_encoder_config": TE_CFG,
            "transformer_config": {k: v for k, v in dict(dit.config).items() if not k.startswith("_")},
            "vae_config": {k: v for k, v in dict(vae.config).items() if not k.startswith("_")},
            "vae_bn_eps": VAE_CFG["batch_norm_eps"], "scheduler_config": SCHED_CFG, "max_sequence_length": 512,
            "text_encoder_out_layers": [9, 18, 27], "is_distilled": False,
            "text_encoder_output": "hidden_states 9, 18, 27 of all 512 tokens (padded, attention mask), stacked "
                                   "per token along the feature axis: [512, 3 x hidden]",
            "cfg_mapping": "diffusers guidance_scale g > 1 (not distilled) -> CFG with the negative prompt \"\" and "
                           "easel --cfg-scale g; g <= 1 -> --cfg-scale 1",
            "cases": cases}
    with open(os.path.join(a.out, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1, ensure_ascii=False, default=str)
    print(f"klein pipeline: done in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
