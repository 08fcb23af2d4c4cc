"""Tiny complete Z-Image(-Turbo) pipeline (random, seeded weights) and reference generations.

Runs on the GPU machine with diffusers' source on PYTHONPATH; every model runs on the CPU in
float32 (weights rounded to f16 values first), so the numbers do not depend on TF32/cuDNN.

Components (diffusers' ZImagePipeline: scheduler, vae, text_encoder, tokenizer, transformer):
  tokenizer     the real Qwen3 tokenizer (tokenizer.json + tokenizer_config.json, carried gzipped)
  text_encoder  Qwen3ForCausalLM, real vocabulary (151936), hidden 12, 3 layers, 2 q heads / 1 kv
                head, head_dim 16 (heads*head_dim != hidden as in Qwen3-4B), tied embeddings (so the
                saved keys are model.* exactly as ComfyUI's qwen_3_4b.safetensors)
  transformer   ZImageTransformer2DModel dim 32, 2 layers, 1 refiner layer, 2 heads, cap_feat_dim 12,
                axes_dims (4, 6, 6) (= Z-Image's (32, 48, 48) scaled to head_dim 16)
  vae           AutoencoderKL FLUX.1-style: 16 latent channels, no quant convs, 4 levels of 32 channels
                (factor 8), 32 groups (FLUX.1's count: a single file carries no config),
                scaling_factor 0.3611, shift_factor 0.1159
  scheduler     FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0,
                use_dynamic_shifting=False), as Z-Image-Turbo's scheduler_config.json

Writes into --out:
  diffusers/                          ZImagePipeline.save_pretrained, f16 weights; tokenizer/ holds only
                                      tokenizer_config.json (+ chat template), not the 11 MB tokenizer.json
  zimage_tiny_transformer.safetensors the transformer in the original (Tongyi / ComfyUI) layout, f16:
                                      x_embedder, final_layer, attention.qkv (fused), attention.out,
                                      attention.q_norm / k_norm (diffusers' single-file converter inverted)
  zimage_tiny_vae.safetensors         the VAE in the original (BFL ae.safetensors / ldm) layout, f16
  (te single file: diffusers/text_encoder/model.safetensors itself; its keys are the ComfyUI ones)
  cases.json                          every case: prompt, negative, seed, size, steps, guidance, easel flags,
                                      templated prompt, token ids, sigmas, timesteps
  case_<name>.png                     final image (uint8 as diffusers' numpy_to_pil: (x*255).round())
  case_<name>.safetensors             float32: noise, cond (hidden_states[-2] of the real tokens), uncond (CFG
                                      cases), input_ids, dit0_x / dit0_t / dit0_out (first transformer call,
                                      model convention: t = (1000 - timestep)/1000, output NOT negated),
                                      step_latents, final_latent, image ([1, 3, H, W] in [0, 1])
  img2img_init.png                    the deterministic 64x64 init image of the img2img cases
  case_<name>.png / .safetensors      img2img cases too (cases.json "img2img_cases"): ZImageImg2ImgPipeline with
                                      --strength; tensors as above plus init_image ([-1, 1]), posterior_mean,
                                      posterior_std, posterior_eps (the generator's first draw), image_latents
                                      ((z - shift) * scale), noise (second draw), init_latent (scale_noise)
  te_hidden_states.safetensors        for the first case: every hidden_states[i] of the text encoder over the
                                      real tokens (i = 0..layers), to debug encoder parity
"""

import argparse
import gzip
import json
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

TE_CFG = dict(vocab_size=151936, hidden_size=12, intermediate_size=32, num_hidden_layers=3, num_attention_heads=2,
              num_key_value_heads=1, head_dim=16, hidden_act="silu", max_position_embeddings=40960,
              rms_norm_eps=1e-6, rope_theta=1000000.0, attention_bias=False, tie_word_embeddings=True,
              initializer_range=0.1, bos_token_id=151643, eos_token_id=151645)
DIT_CFG = dict(all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, dim=32, n_layers=2, n_refiner_layers=1,
               n_heads=2, n_kv_heads=2, norm_eps=1e-5, qk_norm=True, cap_feat_dim=12, rope_theta=256.0,
               t_scale=1000.0, axes_dims=[4, 6, 6], axes_lens=[1024, 512, 512])
VAE_CFG = dict(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
               up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(32, 32, 32, 32), layers_per_block=2,
               act_fn="silu", latent_channels=16, norm_num_groups=32, sample_size=64, scaling_factor=0.3611,
               shift_factor=0.1159, use_quant_conv=False, use_post_quant_conv=False, mid_block_add_attention=True)
SCHED_CFG = dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=False)

CASES = [
    # name, prompt, negative, seed, W, H, steps, guidance_scale (diffusers)
    ("cat_s0_64", "a photo of a cat", "", 0, 64, 64, 8, 0.0),
    ("circle_s1_96x64", "a small red circle on the left, blue background", "", 1, 96, 64, 4, 0.0),
    ("cjk_s3_64", "一只可爱的猫，坐在窗边。", "", 3, 64, 64, 8, 0.0),
    ("cfg_neg_s2_64", "a photo of a cat", "blurry, low quality", 2, 64, 64, 6, 2.0),
]

IMG2IMG_CASES = [
    # name, prompt, negative, seed, steps, guidance_scale (diffusers), strength; size = the init image (64x64)
    ("img2img_s5_64", "a photo of a cat", "", 5, 8, 0.0, 0.6),
    ("img2img_cfg_neg_s6_64", "a small red circle on the left, blue background", "blurry, low quality", 6, 6, 2.0,
     0.75),
]


def make_init_image(out):
    """Deterministic 64x64 init image: red disc on a blue background with a green bar (as make_sd_pipeline.py)."""
    yy, xx = np.mgrid[0:64, 0:64]
    img = np.zeros((64, 64, 3), np.uint8)
    img[...] = (40, 60, 200)
    img[(xx - 24) ** 2 + (yy - 30) ** 2 < 14 ** 2] = (220, 30, 30)
    img[50:56, 8:56] = (30, 200, 60)
    Image.fromarray(img).save(os.path.join(out, "img2img_init.png"))
    return "img2img_init.png"


class RngRecorder:
    """Wraps diffusers' randn_tensor in the img2img pipeline and the VAE module: records every draw in order."""

    def __init__(self):
        import diffusers.models.autoencoders.vae as vae_mod
        import diffusers.pipelines.z_image.pipeline_z_image_img2img as p1

        self.draws = []
        orig = vae_mod.randn_tensor

        def wrapped(*a, **k):
            t = orig(*a, **k)
            self.draws.append(t.detach().float().cpu().clone())
            return t

        for m in (vae_mod, p1):
            m.randn_tensor = wrapped


def run_img2img_case(pipe, rec, case, out, init_name):
    """One ZImageImg2ImgPipeline run (CPU generator): latents = scale_noise((z - shift) * scale, t0, noise)."""
    name, prompt, neg, seed, steps, g, strength = case
    init = Image.open(os.path.join(out, init_name)).convert("RGB")
    W, H = init.size
    t = {}
    steps_lat = []

    def cb(p, i, ts, kw):
        steps_lat.append(kw["latents"].detach().float().clone())
        return kw

    first = {}

    def hook(mod, args, kwargs, output):
        if not first:
            first["x"] = torch.stack([x.detach().float() for x in args[0]], 0).clone()
            first["t"] = torch.as_tensor(args[1], dtype=torch.float32).reshape(-1).clone()
            first["out"] = torch.stack([o.detach().float() for o in output[0]], 0).clone()

    h = pipe.transformer.register_forward_hook(hook, with_kwargs=True)
    t["init_image"] = pipe.image_processor.preprocess(init).float()
    with torch.no_grad():
        post = pipe.vae.encode(t["init_image"]).latent_dist
    t["posterior_mean"], t["posterior_std"] = post.mean.float(), post.std.float()
    rec.draws.clear()
    gen = torch.Generator("cpu").manual_seed(seed)
    with torch.no_grad():
        img = pipe(prompt=prompt, image=init, strength=strength, negative_prompt=neg or None, height=H, width=W,
                   num_inference_steps=steps, guidance_scale=g, generator=gen, output_type="np",
                   callback_on_step_end=cb).images
    h.remove()
    draws = list(rec.draws)
    assert len(draws) == 2, f"expected 2 draws (posterior, noise), got {len(draws)}"
    sched = pipe.scheduler
    vc = pipe.vae.config
    t["posterior_eps"], t["noise"] = draws[0], draws[1]
    z = t["posterior_mean"] + t["posterior_std"] * draws[0]
    t["image_latents"] = (z - vc.shift_factor) * vc.scaling_factor
    t_start = steps - len(steps_lat)
    sigma0 = float(sched.sigmas[t_start])
    t["init_latent"] = sigma0 * draws[1] + (1.0 - sigma0) * t["image_latents"]
    t["step_latents"] = torch.cat(steps_lat, 0)
    t["final_latent"] = steps_lat[-1]
    t["image"] = torch.from_numpy(np.ascontiguousarray(img)).permute(0, 3, 1, 2).float()
    t["dit0_x"], t["dit0_t"], t["dit0_out"] = first["x"], first["t"], first["out"]
    t["sigmas"] = sched.sigmas.float().cpu()
    t["timesteps"] = sched.timesteps.float().cpu()
    # check: the first transformer input is the scale_noise latent (model input = latents as they are)
    x0_diff = float((first["x"][0].reshape(-1) - t["init_latent"][0].reshape(-1)).abs().max())
    save_file({k: v.contiguous() for k, v in t.items()}, os.path.join(out, f"case_{name}.safetensors"))
    image_to_png(img[0], os.path.join(out, f"case_{name}.png"))
    c = {"name": name, "mode": "img2img", "prompt": prompt, "negative_prompt": neg, "seed": seed, "width": W,
         "height": H, "steps": steps, "strength": strength, "init_image": init_name, "t_start": t_start,
         "steps_run": len(steps_lat), "sigma_start": sigma0, "diffusers_guidance_scale": g, "cfg_active": g > 0,
         "cfg_scale": (1.0 + g) if g > 0 else 1.0, "sampling_method": "euler", "scheduler": "discrete",
         "rng": "cpu", "png": f"case_{name}.png", "tensors": f"case_{name}.safetensors",
         "rng_draws": [list(d.shape) for d in draws], "dit0_x_vs_init_latent_max_abs_diff": x0_diff,
         "sigmas": [float(x) for x in sched.sigmas], "timesteps": [float(x) for x in sched.timesteps]}
    flags = easel_flags(c) + f' -i {init_name} --strength {strength}'
    c["easel_args"] = "generate -m diffusers " + flags
    c["easel_args_single_files"] = ("generate --diffusion-model zimage_tiny_transformer.safetensors "
                                    "--llm diffusers/text_encoder/model.safetensors --vae zimage_tiny_vae.safetensors "
                                    + flags)
    return c


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
    from diffusers import AutoencoderKL, ZImageTransformer2DModel
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = dict(TE_CFG)
    theta = cfg.pop("rope_theta")
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}  # transformers 5 form
    te = Qwen3ForCausalLM(Qwen3Config(**cfg))
    te.set_attn_implementation("eager")
    torch.manual_seed(seed + 1)
    dit = ZImageTransformer2DModel(**DIT_CFG)
    # zero-initialised parameters (pad tokens, adaLN) would hide mapping bugs: give them random values
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed + 3)
        for n, p in dit.named_parameters():
            if float(p.abs().max()) == 0.0:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    torch.manual_seed(seed + 2)
    vae = AutoencoderKL(**VAE_CFG)
    return round_f16(te), round_f16(dit), round_f16(vae)


def dit_to_original(sd):
    """diffusers ZImageTransformer2DModel state dict -> original Z-Image (Tongyi / ComfyUI) names: the inverse of
    diffusers' convert_z_image_transformer_checkpoint_to_diffusers (to_q/k/v fused into qkv along dim 0)."""
    out = {}
    for k, v in sd.items():
        if ".attention.to_k." in k or ".attention.to_v." in k:
            continue
        if ".attention.to_q." in k:
            q, kk, vv = (sd[k.replace("to_q", n)] for n in ("to_q", "to_k", "to_v"))
            out[k.replace(".attention.to_q.", ".attention.qkv.")] = torch.cat([q, kk, vv], 0)
            continue
        nk = (k.replace("all_final_layer.2-1.", "final_layer.").replace("all_x_embedder.2-1.", "x_embedder.")
              .replace(".attention.to_out.0.", ".attention.out.").replace(".attention.norm_k.", ".attention.k_norm.")
              .replace(".attention.norm_q.", ".attention.q_norm."))
        out[nk] = v
    return out


def image_to_png(arr01, path):
    """[H, W, 3] float in [0, 1] -> PNG with diffusers' numpy_to_pil rounding ((x * 255).round())."""
    Image.fromarray((arr01 * 255).round().astype("uint8")).save(path)


def easel_flags(c):
    f = [f'-p "{c["prompt"]}"']
    if c["negative_prompt"]:
        f.append(f'-n "{c["negative_prompt"]}"')
    f += [f'-W {c["width"]}', f'-H {c["height"]}', f'--steps {c["steps"]}', f'--cfg-scale {c["cfg_scale"]}',
          f'-s {c["seed"]}', "--sampling-method euler", "--scheduler discrete", "--rng cpu"]
    return " ".join(f)


def run_case(pipe, case, out, dump_hidden):
    name, prompt, neg, seed, W, H, steps, g = case
    tok, te = pipe.tokenizer, pipe.text_encoder
    t = {}
    info = {}
    for key, text in (("cond", prompt), ("uncond", neg)):
        if key == "uncond" and not g > 0:
            continue
        templ = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                        add_generation_prompt=True, enable_thinking=True)
        enc = tok([templ], padding="max_length", max_length=512, truncation=True, return_tensors="pt")
        mask = enc.attention_mask.bool()
        ids = enc.input_ids[mask]
        with torch.no_grad():
            hs = te(input_ids=enc.input_ids, attention_mask=mask, output_hidden_states=True).hidden_states
        t[key] = hs[-2][0][mask[0]].float().clone()
        t[key + "_ids"] = ids.to(torch.int32)
        info[key + "_template"] = templ
        info[key + "_ids"] = [int(x) for x in ids]
        if dump_hidden and key == "cond":
            hd = {f"hidden_states.{i}": h[0][mask[0]].float().contiguous() for i, h in enumerate(hs)}
            hd["input_ids"] = ids.to(torch.int32)
            # the same ids without padding / mask (causal attention: must give the same real-token states)
            with torch.no_grad():
                hs2 = te(input_ids=ids[None], output_hidden_states=True).hidden_states
            info["unpadded_vs_padded_max_abs_diff"] = float((hs2[-2][0] - t[key]).abs().max())
            save_file(hd, os.path.join(out, "te_hidden_states.safetensors"))

    steps_lat = []

    def cb(p, i, ts, kw):
        steps_lat.append(kw["latents"].detach().float().clone())
        return kw

    first = {}

    def hook(mod, args, kwargs, output):
        if not first:
            first["x"] = torch.stack([x.detach().float() for x in args[0]], 0).clone()
            first["t"] = torch.as_tensor(args[1], dtype=torch.float32).reshape(-1).clone()
            first["out"] = torch.stack([o.detach().float() for o in output[0]], 0).clone()

    h = pipe.transformer.register_forward_hook(hook, with_kwargs=True)
    gen = torch.Generator("cpu").manual_seed(seed)
    with torch.no_grad():
        img = pipe(prompt=prompt, negative_prompt=neg or None, height=H, width=W, num_inference_steps=steps,
                   guidance_scale=g, generator=gen, output_type="np", callback_on_step_end=cb).images
    h.remove()
    sched = pipe.scheduler
    lh, lw = 2 * (H // 16), 2 * (W // 16)
    t["noise"] = torch.randn((1, 16, lh, lw), generator=torch.Generator("cpu").manual_seed(seed), dtype=torch.float32)
    t["step_latents"] = torch.cat(steps_lat, 0)
    t["final_latent"] = steps_lat[-1]
    t["image"] = torch.from_numpy(np.ascontiguousarray(img)).permute(0, 3, 1, 2).float()
    t["dit0_x"], t["dit0_t"], t["dit0_out"] = first["x"], first["t"], first["out"]
    t["sigmas"] = sched.sigmas.float().cpu()
    t["timesteps"] = sched.timesteps.float().cpu()
    save_file({k: v.contiguous() for k, v in t.items()}, os.path.join(out, f"case_{name}.safetensors"))
    image_to_png(img[0], os.path.join(out, f"case_{name}.png"))
    c = {"name": name, "prompt": prompt, "negative_prompt": neg, "seed": seed, "width": W, "height": H,
         "steps": steps, "diffusers_guidance_scale": g, "cfg_active": g > 0,
         # diffusers: pred = pos + g*(pos - neg) = neg + (1+g)*(pos - neg); CFG runs whenever g > 0
         "cfg_scale": (1.0 + g) if g > 0 else 1.0, "sampling_method": "euler", "scheduler": "discrete",
         "rng": "cpu", "png": f"case_{name}.png", "tensors": f"case_{name}.safetensors",
         "latent_shape": [16, lh, lw], "sigmas": [float(x) for x in sched.sigmas],
         "timesteps": [float(x) for x in sched.timesteps], "dit_calls_per_step": 1,
         "dit_batch": 2 if g > 0 else 1, **info}
    c["easel_args"] = "generate -m diffusers " + easel_flags(c)
    c["easel_args_single_files"] = ("generate --diffusion-model zimage_tiny_transformer.safetensors "
                                    "--llm diffusers/text_encoder/model.safetensors --vae zimage_tiny_vae.safetensors "
                                    + easel_flags(c))
    return c, img


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tok-gz", required=True, help="gzipped Qwen3 tokenizer.json")
    ap.add_argument("--tok-config", required=True, help="Qwen3 tokenizer_config.json")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=4321)
    a = ap.parse_args()
    t0 = time.time()
    torch.set_num_threads(8)
    from diffusers import (AutoencoderKL, FlowMatchEulerDiscreteScheduler, ZImagePipeline,
                           ZImageTransformer2DModel)
    from transformers import AutoTokenizer

    os.makedirs(a.out, exist_ok=True)
    tok_dir = "/tmp/zimage_tok"
    os.makedirs(tok_dir, exist_ok=True)
    with gzip.open(a.tok_gz, "rb") as f, open(os.path.join(tok_dir, "tokenizer.json"), "wb") as g:
        g.write(f.read())
    shutil.copy(a.tok_config, os.path.join(tok_dir, "tokenizer_config.json"))
    tok = AutoTokenizer.from_pretrained(tok_dir)
    te, dit, vae = build_models(a.seed)
    pipe = ZImagePipeline(scheduler=FlowMatchEulerDiscreteScheduler(**SCHED_CFG), vae=vae, text_encoder=te,
                          tokenizer=tok, transformer=dit)
    pipe.set_progress_bar_config(disable=True)

    cases = []
    imgs = {}
    for i, case in enumerate(CASES):
        c, img = run_case(pipe, case, a.out, dump_hidden=(i == 0))
        cases.append(c)
        imgs[c["name"]] = img
        print(f"case {c['name']}: {len(c['cond_ids'])} tokens, done ({time.time() - t0:.1f}s)")

    from diffusers import ZImageImg2ImgPipeline

    i2i = ZImageImg2ImgPipeline(scheduler=FlowMatchEulerDiscreteScheduler(**SCHED_CFG), vae=vae, text_encoder=te,
                                tokenizer=tok, transformer=dit)
    i2i.set_progress_bar_config(disable=True)
    rec = RngRecorder()
    init_name = make_init_image(a.out)
    img2img_cases = []
    for case in IMG2IMG_CASES:
        try:
            c = run_img2img_case(i2i, rec, case, a.out, init_name)
            img2img_cases.append(c)
            print(f"img2img case {c['name']}: t_start {c['t_start']}, done ({time.time() - t0:.1f}s)")
        except Exception as e:  # noqa: BLE001
            import traceback
            traceback.print_exc()
            print(f"img2img case {case[0]} FAILED: {type(e).__name__}: {e}")

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
    # (ii) single files, original layouts, f16
    orig = {k: v.half().contiguous() for k, v in dit_to_original(dit.state_dict()).items()}
    save_file(orig, os.path.join(a.out, "zimage_tiny_transformer.safetensors"),
              metadata={"format": "pt", "easel_note": "tiny random Z-Image transformer, original layout (f16)"})
    vsd = {k[len(ldm_convert.VAE_PREFIX):]: v.half().contiguous()
           for k, v in ldm_convert.vae_to_ldm(vae.state_dict(), dict(vae.config)).items()}
    save_file(vsd, os.path.join(a.out, "zimage_tiny_vae.safetensors"),
              metadata={"format": "pt", "easel_note": "tiny random FLUX-style VAE, ae.safetensors layout (f16)"})

    checks = {"saved_tokenizer_files": saved_tok}
    # (iii) the saved folder reproduces case 0 (tokenizer restored from the carried files)
    try:
        for fn in ("tokenizer.json",):
            shutil.copy(os.path.join(tok_dir, fn), os.path.join(tdir, fn))
        p2 = ZImagePipeline.from_pretrained(ddir, torch_dtype=torch.float32)
        os.remove(os.path.join(tdir, "tokenizer.json"))
        p2.set_progress_bar_config(disable=True)
        n, pr, ng, sd, W, H, st, g = CASES[3]
        with torch.no_grad():
            im = p2(prompt=pr, negative_prompt=ng or None, height=H, width=W, num_inference_steps=st,
                    guidance_scale=g, generator=torch.Generator("cpu").manual_seed(sd), output_type="np").images
        checks["folder_reload_max_abs_diff_case3"] = float(np.abs(im - imgs[n]).max())
    except Exception as e:  # noqa: BLE001
        checks["folder_reload_error"] = f"{type(e).__name__}: {e}"[:500]
    # (iv) diffusers' own single-file converter on our original-layout transformer
    try:
        from diffusers.loaders.single_file_utils import convert_z_image_transformer_checkpoint_to_diffusers
        conv = convert_z_image_transformer_checkpoint_to_diffusers(
            {k: v.float() for k, v in load_file(os.path.join(a.out, "zimage_tiny_transformer.safetensors")).items()})
        ref = dit.state_dict()
        checks["single_file_transformer_keys_equal"] = set(conv) == set(ref)
        checks["single_file_transformer_max_abs_diff"] = max(float((conv[k] - ref[k]).abs().max()) for k in ref)
    except Exception as e:  # noqa: BLE001
        checks["single_file_transformer_error"] = f"{type(e).__name__}: {e}"[:500]
    try:
        m = ZImageTransformer2DModel.from_single_file(os.path.join(a.out, "zimage_tiny_transformer.safetensors"),
                                                      config=os.path.join(ddir, "transformer"),
                                                      local_files_only=True, torch_dtype=torch.float32)
        ref = dit.state_dict()
        checks["from_single_file_transformer_max_abs_diff"] = max(
            float((m.state_dict()[k].float() - ref[k]).abs().max()) for k in ref)
    except Exception as e:  # noqa: BLE001
        checks["from_single_file_transformer_error"] = f"{type(e).__name__}: {e}"[:300]
    try:
        m = AutoencoderKL.from_single_file(os.path.join(a.out, "zimage_tiny_vae.safetensors"),
                                           config=os.path.join(ddir, "vae"), local_files_only=True,
                                           torch_dtype=torch.float32)
        ref = vae.state_dict()
        checks["from_single_file_vae_max_abs_diff"] = max(
            float((m.state_dict()[k].float() - ref[k]).abs().max()) for k in ref)
    except Exception as e:  # noqa: BLE001
        checks["from_single_file_vae_error"] = f"{type(e).__name__}: {e}"[:300]
    print("checks:", checks)

    import diffusers
    import transformers

    meta = {"generator": "tools/reference/make_zimage_pipeline.py", "seed": a.seed, "torch": torch.__version__,
            "diffusers": diffusers.__version__, "transformers": transformers.__version__, "device": "cpu float32",
            "weights": "f16-rounded, run in float32", "checks": checks,
            "single_files": {"diffusion_model": "zimage_tiny_transformer.safetensors",
                             "vae": "zimage_tiny_vae.safetensors", "llm": "diffusers/text_encoder/model.safetensors"},
            "text_encoder_config": TE_CFG, "transformer_config": {k: v for k, v in dict(dit.config).items()
                                                                  if not k.startswith("_")},
            "vae_config": {k: v for k, v in dict(vae.config).items() if not k.startswith("_")},
            "scheduler_config": SCHED_CFG, "vae_scale_factor": 8, "max_sequence_length": 512,
            "text_encoder_output": "hidden_states[-2] of the unmasked tokens",
            "cfg_mapping": "diffusers guidance_scale g > 0 -> CFG with easel --cfg-scale 1+g; g = 0 -> --cfg-scale 1",
            "cases": cases, "img2img_cases": img2img_cases,
            "img2img_note": "ZImageImg2ImgPipeline: init image preprocessed to [-1, 1], posterior sample "
                            "(first generator draw), (z - shift) * scale, noise (second draw), "
                            "scale_noise = sigma_start * noise + (1 - sigma_start) * image_latents, "
                            "t_start = int(steps - steps * strength), euler over sigmas[t_start:]"}
    with open(os.path.join(a.out, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1, ensure_ascii=False, default=str)
    print(f"zimage pipeline: done in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
