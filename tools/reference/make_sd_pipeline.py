"""Tiny complete Stable Diffusion 1.x pipeline (random, seeded weights) and reference generations.

Runs on the GPU machine with diffusers' source on PYTHONPATH (the models run on the CPU in float32,
so the numbers do not depend on TF32/cuDNN choices). Writes into --out:
  diffusers/                 StableDiffusionPipeline.save_pretrained (safetensors, f16 weights)
  sd_tiny.safetensors        the same weights as one original-layout (ldm) checkpoint, f16
  cases.json                 every case: prompt, negative, seed, size, steps, sampler, scheduler, cfg,
                             easel / sd-cli flags, the scheduler's sigmas and timesteps, file names
  case_<name>.png            final image
  case_<name>.safetensors    float32 tensors: noise, init_latent, final_latent, step_latents, cond, uncond,
                             input_ids, uncond_ids, unet0_sample/unet0_timestep/unet0_out (first UNet call,
                             CFG batch [uncond, cond]), image (float, [1, 3, H, W] in [0, 1]),
                             rng_draw_<k> (every randn_tensor draw, in order), and for img2img/inpaint
                             init_image ([-1, 1]), mask, image_latents.

All weights are rounded to f16 and the reference runs use those f16-rounded values in float32.
The single file is checked by converting it back with our inverse mapping (bit-exact) and, when it
works offline, by diffusers' own StableDiffusionPipeline.from_single_file(config=diffusers/).
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ldm_convert  # noqa: E402
from dump_clip_tokens import load_hf_tokenizer, write_tokenizer_files  # noqa: E402

SCHED_BASE = dict(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                  prediction_type="epsilon", timestep_spacing="linspace", steps_offset=1)


def build_models(seed):
    """Tiny SD1.x-convention models: CLIP text (width 64, 1 head of 64, quick_gelu, 77 positions,
    vocab 49408), UNet (block_out_channels (32, 64), 8 heads, cross_attention_dim 64, 32 groups),
    AutoencoderKL (block_out_channels (32, 32, 64, 64) -> spatial factor 8, 4 latent channels)."""
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(seed)
    te_cfg = CLIPTextConfig(vocab_size=49408, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                            num_attention_heads=1, max_position_embeddings=77, hidden_act="quick_gelu",
                            layer_norm_eps=1e-5, projection_dim=64, bos_token_id=49406, eos_token_id=49407,
                            pad_token_id=49407)
    te = CLIPTextModel(te_cfg)
    torch.manual_seed(seed + 1)
    unet = UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4, layers_per_block=2,
                                block_out_channels=(32, 64),
                                down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
                                cross_attention_dim=64, attention_head_dim=8, norm_num_groups=32)
    torch.manual_seed(seed + 2)
    vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
                        up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(32, 32, 64, 64),
                        layers_per_block=2, latent_channels=4, norm_num_groups=32, sample_size=64,
                        scaling_factor=0.18215)
    with torch.no_grad():
        for m in (te, unet, vae):
            for p in m.parameters():
                p.copy_(p.half().float())
            m.eval()
    return te, unet, vae


def make_scheduler(kind, karras, base_config=None):
    from diffusers import DPMSolverMultistepScheduler, EulerDiscreteScheduler

    if kind == "euler":
        return EulerDiscreteScheduler(**SCHED_BASE, use_karras_sigmas=karras, interpolation_type="linear")
    if kind == "dpm++2m":
        return DPMSolverMultistepScheduler(**SCHED_BASE, algorithm_type="dpmsolver++", solver_order=2,
                                           solver_type="midpoint", lower_order_final=True,
                                           use_karras_sigmas=karras, final_sigmas_type="zero")
    raise ValueError(kind)


class RngRecorder:
    """Wraps diffusers' randn_tensor in the pipeline and VAE modules to record every draw in order."""

    def __init__(self):
        import diffusers.models.autoencoders.vae as vae_mod
        import diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion as p0
        import diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion_img2img as p1
        import diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion_inpaint as p2

        self.draws = []
        self.mods = [vae_mod, p0, p1, p2]
        orig = vae_mod.randn_tensor

        def wrapped(*a, **k):
            t = orig(*a, **k)
            self.draws.append(t.detach().float().cpu().clone())
            return t

        for m in self.mods:
            m.randn_tensor = wrapped


def image_to_png(img01, path):
    """[1, 3, H, W] in [0, 1] -> PNG with diffusers' rounding ((x * 255).round())."""
    arr = (img01[0].permute(1, 2, 0).cpu().numpy() * 255).round().astype("uint8")
    Image.fromarray(arr).save(path)


def sd_cli_flags(c):
    f = [f'-p "{c["prompt"]}"']
    if c["negative_prompt"]:
        f.append(f'-n "{c["negative_prompt"]}"')
    f += [f'-W {c["width"]}', f'-H {c["height"]}', f'--steps {c["steps"]}', f'--cfg-scale {c["cfg_scale"]}',
          f'-s {c["seed"]}', f'--sampling-method {c["sampling_method"]}', f'--scheduler {c["scheduler"]}', "--rng cpu"]
    if c["mode"] == "img2img":
        f += [f'-i {c["init_image"]}', f'--strength {c["strength"]}']
    if c["mode"] == "inpaint":
        f += [f'-i {c["init_image"]}', f'--mask {c["mask_image"]}', f'--strength {c["strength"]}']
    return " ".join(f)


CASES = [
    # name, mode, prompt, negative, seed, W, H, steps, sampler, karras, cfg
    ("euler_discrete_a_s0", "txt2img", "a photo of a cat", "", 0, 64, 64, 10, "euler", False, 7.5),
    ("euler_karras_b_s1_neg", "txt2img", "a small red circle on the left, blue background",
     "blurry, low quality", 1, 64, 64, 12, "euler", True, 7.5),
    ("dpmpp2m_discrete_a_s1", "txt2img", "a photo of a cat", "", 1, 64, 64, 10, "dpm++2m", False, 7.5),
    ("dpmpp2m_karras_b_s0_cfg1", "txt2img", "a small red circle on the left, blue background", "", 0, 64, 64, 15,
     "dpm++2m", True, 1.0),
    ("euler_discrete_a_s0_96x64", "txt2img", "a photo of a cat", "", 0, 96, 64, 20, "euler", False, 7.5),
    ("img2img_euler_discrete_s2", "img2img", "a photo of a cat", "", 2, 64, 64, 10, "euler", False, 7.5),
    ("inpaint_euler_discrete_s3", "inpaint", "a small red circle on the left, blue background", "", 3, 64, 64, 10,
     "euler", False, 7.5),
]


def make_init_images(out):
    """A simple 64x64 init image (red disc on a blue background, green bar) and a centre-square mask."""
    yy, xx = np.mgrid[0:64, 0:64]
    img = np.zeros((64, 64, 3), np.uint8)
    img[...] = (40, 60, 200)
    img[(xx - 24) ** 2 + (yy - 30) ** 2 < 14 ** 2] = (220, 30, 30)
    img[50:56, 8:56] = (30, 200, 60)
    Image.fromarray(img).save(os.path.join(out, "case_init_image.png"))
    mask = np.zeros((64, 64), np.uint8)
    mask[16:48, 24:56] = 255
    Image.fromarray(mask).save(os.path.join(out, "case_mask.png"))
    return "case_init_image.png", "case_mask.png"


def run_case(pipes, rec, case, out, init_name, mask_name):
    name, mode, prompt, neg, seed, W, H, steps, sampler, karras, cfg = case
    pipe = pipes[mode]
    pipe.scheduler = make_scheduler(sampler, karras)
    do_cfg = cfg > 1.0
    t = {}
    with torch.no_grad():
        cond, uncond = pipe.encode_prompt(prompt, "cpu", 1, True, negative_prompt=neg or None)
    t["cond"], t["uncond"] = cond, uncond
    tok = pipe.tokenizer
    t["input_ids"] = torch.tensor(tok(prompt, padding="max_length", max_length=77, truncation=True)["input_ids"])
    t["uncond_ids"] = torch.tensor(tok(neg, padding="max_length", max_length=77, truncation=True)["input_ids"])

    steps_lat = []

    def cb(p, i, ts, kw):
        steps_lat.append(kw["latents"].detach().float().clone())
        return kw

    first = {}

    def hook(mod, args, kwargs, output):
        if not first:
            first["sample"] = args[0].detach().float().clone()
            ts = args[1]
            first["timestep"] = torch.as_tensor(ts, dtype=torch.float32).reshape(-1).clone()
            o = output[0] if isinstance(output, tuple) else output.sample
            first["out"] = o.detach().float().clone()

    h = pipe.unet.register_forward_hook(hook, with_kwargs=True)
    rec.draws.clear()
    gen = torch.Generator("cpu").manual_seed(seed)
    kwargs = dict(prompt=prompt, negative_prompt=neg or None, num_inference_steps=steps, guidance_scale=cfg,
                  generator=gen, output_type="pt", callback_on_step_end=cb)
    strength = None
    if mode == "txt2img":
        kwargs.update(height=H, width=W)
    else:
        init = Image.open(os.path.join(out, init_name)).convert("RGB")
        kwargs["image"] = init
        strength = 0.6 if mode == "img2img" else 1.0
        kwargs["strength"] = strength
        t["init_image"] = pipe.image_processor.preprocess(init).float()
        with torch.no_grad():
            post = pipe.vae.encode(t["init_image"]).latent_dist
        t["posterior_mean"], t["posterior_std"] = post.mean, post.std
        if mode == "inpaint":
            mask = Image.open(os.path.join(out, mask_name)).convert("L")
            kwargs["mask_image"] = mask
            kwargs.update(height=H, width=W)
            t["mask"] = pipe.mask_processor.preprocess(mask, height=H, width=W).float()
    rec.draws.clear()
    with torch.no_grad():
        img = pipe(**kwargs).images
    h.remove()
    sched = pipe.scheduler
    draws = list(rec.draws)
    for k, d in enumerate(draws):
        t[f"rng_draw_{k}"] = d
    # the initial noise drawn from the CPU generator for the latent
    shape = (1, 4, H // 8, W // 8)
    ref_gen = torch.Generator("cpu").manual_seed(seed)
    # txt2img: draws = [noise]; img2img: [posterior eps of init image, noise];
    # inpaint (4-channel UNet): [posterior eps of init image, noise, posterior eps of masked image]
    t["noise"] = torch.randn(shape, generator=ref_gen, dtype=torch.float32) if mode == "txt2img" else draws[1].clone()
    t["init_noise_sigma"] = torch.tensor([float(sched.init_noise_sigma)])
    t["step_latents"] = torch.cat(steps_lat, 0)
    t["final_latent"] = steps_lat[-1]
    t["image"] = img.float()
    t["unet0_sample"], t["unet0_timestep"], t["unet0_out"] = first["sample"], first["timestep"], first["out"]
    t["sigmas"] = sched.sigmas.float().cpu()
    t["timesteps"] = sched.timesteps.float().cpu()
    if mode == "txt2img":
        assert torch.equal(draws[0], t["noise"]), "pipeline noise differs from torch.randn(seed)"
        t["init_latent"] = t["noise"] * float(sched.init_noise_sigma)
    save_file({k: v.contiguous() for k, v in t.items()}, os.path.join(out, f"case_{name}.safetensors"))
    image_to_png(img, os.path.join(out, f"case_{name}.png"))
    c = {"name": name, "mode": mode, "prompt": prompt, "negative_prompt": neg, "seed": seed, "width": W,
         "height": H, "steps": steps, "sampling_method": sampler, "scheduler": "karras" if karras else "discrete",
         "cfg_scale": cfg, "cfg_active": do_cfg, "rng": "cpu", "png": f"case_{name}.png",
         "tensors": f"case_{name}.safetensors", "diffusers_scheduler": type(sched).__name__,
         "diffusers_scheduler_config": {k: v for k, v in dict(sched.config).items() if not k.startswith("_")},
         "sigmas": [float(x) for x in sched.sigmas], "timesteps": [float(x) for x in sched.timesteps],
         "init_noise_sigma": float(sched.init_noise_sigma), "rng_draws": [list(d.shape) for d in draws],
         "unet_calls_per_step": 1, "unet_batch": 2 if do_cfg else 1}
    if strength is not None:
        c["strength"] = strength
        c["init_image"] = init_name
        c["steps_run"] = len(steps_lat)
        c["t_start"] = steps - len(steps_lat)  # the run used sigmas[t_start:] / timesteps[t_start:]
    if mode == "inpaint":
        c["mask_image"] = mask_name
    c["easel_args"] = "generate -m sd_tiny.safetensors " + sd_cli_flags(c)
    c["sd_cli_args"] = "-m sd_tiny.safetensors " + sd_cli_flags(c)
    return c, img


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gz", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    t0 = time.time()
    torch.set_num_threads(8)
    from diffusers import (StableDiffusionImg2ImgPipeline, StableDiffusionInpaintPipeline,
                           StableDiffusionPipeline)

    os.makedirs(a.out, exist_ok=True)
    tok_dir = os.path.join(a.out, "_tok")
    write_tokenizer_files(a.gz, tok_dir)
    tok = load_hf_tokenizer(tok_dir)
    te, unet, vae = build_models(a.seed)
    comps = dict(vae=vae, text_encoder=te, tokenizer=tok, unet=unet, scheduler=make_scheduler("euler", False),
                 safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    pipe = StableDiffusionPipeline(**comps)
    pipe.set_progress_bar_config(disable=True)
    pipes = {"txt2img": pipe,
             "img2img": StableDiffusionImg2ImgPipeline(**comps),
             "inpaint": StableDiffusionInpaintPipeline(**comps)}
    for p in pipes.values():
        p.set_progress_bar_config(disable=True)

    # (i) diffusers folder, f16 weights (exact: the weights are f16-rounded)
    ddir = os.path.join(a.out, "diffusers")
    pipe.to(torch.float16)
    pipe.save_pretrained(ddir, safe_serialization=True)
    pipe.to(torch.float32)
    # (ii) single-file ldm checkpoint, f16
    ldm = ldm_convert.pipeline_to_ldm(unet, vae, te, dtype=torch.float16)
    single = os.path.join(a.out, "sd_tiny.safetensors")
    save_file(ldm, single, metadata={"format": "pt", "easel_note": "tiny random SD1.x-layout test model (f16)"})
    # self-check: our inverse mapping restores every tensor bit for bit
    back = ldm_convert.ldm_to_components(ldm, unet, vae, te)
    nmis = 0
    for name, m in (("unet", unet), ("vae", vae), ("text_encoder", te)):
        ref = {k: v for k, v in m.state_dict().items() if not k.endswith("position_ids")}
        assert set(ref) == set(back[name]), f"{name}: key sets differ"
        for k, v in ref.items():
            if not torch.equal(v.float(), back[name][k].float()):
                nmis += 1
    print(f"ldm single file: {len(ldm)} tensors, inverse-mapping mismatches: {nmis}")
    assert nmis == 0

    init_name, mask_name = make_init_images(a.out)
    rec = RngRecorder()
    cases = []
    first_img = None
    for case in CASES:
        c, img = run_case(pipes, rec, case, a.out, init_name, mask_name)
        if first_img is None:
            first_img = img
        cases.append(c)
        print(f"case {c['name']}: done ({time.time() - t0:.1f}s)")

    # diffusers' own single-file loader with our folder's config, offline
    single_check = {}
    try:
        sf = StableDiffusionPipeline.from_single_file(single, config=ddir, local_files_only=True,
                                                      safety_checker=None, torch_dtype=torch.float32)
        diffs = {}
        for name, m in (("unet", unet), ("vae", vae), ("text_encoder", te)):
            msd = getattr(sf, name).state_dict()
            worst = 0.0
            for k, v in m.state_dict().items():
                if k.endswith("position_ids"):
                    continue
                worst = max(worst, float((msd[k].float() - v.float()).abs().max()))
            diffs[name] = worst
        sf.scheduler = make_scheduler("euler", False)
        sf.set_progress_bar_config(disable=True)
        c0 = CASES[0]
        with torch.no_grad():
            img = sf(prompt=c0[2], num_inference_steps=c0[7], guidance_scale=c0[10], height=c0[6], width=c0[5],
                     generator=torch.Generator("cpu").manual_seed(c0[4]), output_type="pt").images
        single_check = {"ok": True, "weight_max_abs_diff": diffs,
                        "case0_image_max_abs_diff": float((img.float() - first_img.float()).abs().max())}
    except Exception as e:  # noqa: BLE001
        single_check = {"ok": False, "error": f"{type(e).__name__}: {e}"[:500]}
    print("from_single_file check:", single_check)

    import diffusers
    import transformers

    meta = {"generator": "tools/reference/make_sd_pipeline.py", "seed": a.seed, "torch": torch.__version__,
            "diffusers": diffusers.__version__, "transformers": transformers.__version__, "device": "cpu float32",
            "weights": "f16-rounded, run in float32", "single_file": "sd_tiny.safetensors",
            "single_file_check": single_check, "ldm_tensors": len(ldm),
            "text_encoder_config": {k: v for k, v in te.config.to_dict().items()
                                    if k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                             "num_attention_heads", "max_position_embeddings", "hidden_act",
                                             "layer_norm_eps")},
            "unet_config": {k: v for k, v in dict(unet.config).items() if not k.startswith("_")},
            "vae_config": {k: v for k, v in dict(vae.config).items() if not k.startswith("_")},
            "vae_scale_factor": 8, "clip_skip": 1, "text_encoder_output": "last_hidden_state (final layer norm)",
            "cases": cases}
    def finite(o):
        # strict JSON: non-finite floats (scheduler configs hold -inf) become strings
        if isinstance(o, float) and o != o: return "NaN"
        if isinstance(o, float) and o in (float("inf"), float("-inf")): return "Infinity" if o > 0 else "-Infinity"
        if isinstance(o, dict): return {k: finite(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)): return [finite(v) for v in o]
        return o
    with open(os.path.join(a.out, "cases.json"), "w") as f:
        json.dump(finite(meta), f, indent=1, default=str, allow_nan=False)
    import shutil

    shutil.rmtree(tok_dir)
    print(f"sd pipeline: done in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
