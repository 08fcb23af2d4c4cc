"""diffusers' two-pass equivalent of easel's hires fix (pipeline/hires.h) on the tiny SD1.x pipeline.

For each case, on the CPU in float32, with the f16-rounded weights of tests/data/reference/sd_tiny/diffusers:
  1. StableDiffusionPipeline txt2img at W x H, `steps` Euler discrete steps, output_type="latent"
     (the latent in diffusion space, as easel's first pass leaves it), generator CPU manual_seed(seed);
  2. A1111's latent upscale: torch.nn.functional.interpolate(latent, size=(H2 // 8, W2 // 8), mode,
     antialias) (A1111 shared.latent_upscale_modes: "Latent" = bilinear, "Latent (bicubic antialiased)"
     = bicubic + antialias);
  3. StableDiffusionImg2ImgPipeline with that latent as `image` (4 channels: used as the init latent, no
     VAE encode, no posterior draw) at strength s, num_inference_steps = int(N / s) (N = hires steps),
     a fresh generator CPU manual_seed(seed): its only draw is the noise at the new size, the first draw
     of that seed, exactly as easel's second pass. diffusers' get_timesteps runs the last
     int(int(N / s) * s) = N steps, easel's hires_schedule runs the last N of int(N / min(s, 0.999));
     the cases pick N and s where both are exact in binary (asserted below).
  Same prompts, CFG scale and scheduler (EulerDiscreteScheduler, linspace spacing, linear sigma
  interpolation: cases.json's config) in both passes.

Writes into OUT_DIR:
  hires_<name>.png             final image, (x * 255).round() of diffusers' [0, 1] output
  hires_<name>.safetensors     float32: lowres_latent [1,4,h,w] (pass 1 final latent), lowres_step_latents,
                               upscaled_latent [1,4,h2,w2] (the img2img init latent), noise2 (pass 2's draw),
                               noised_latent (init + sigma * noise), step_latents2 [N,4,h2,w2],
                               final_latent, image [1,3,H2,W2] in [0,1], sigmas1/timesteps1, sigmas2/timesteps2
                               (the full pass-2 schedule; the run used [t_start:])
  hires_cases.json             per case: prompts, seed, sizes, steps, strength, t_start, upscaler names,
                               easel_args (the equivalent easel command line), versions, self-checks

Run from the repository root (diffusers' source on PYTHONPATH, offline):
    python3 tools/reference/hires_diffusers_reference.py OUT_DIR
"""
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors.torch import save_file

REF = os.path.join("tests", "data", "reference", "sd_tiny")

# name, prompt, negative, seed, W, H, steps, cfg, hires upscaler (A1111 name), (mode, antialias), scale,
# hires steps (0: steps), strength
CASES = [
    ("latent_bilinear_s0", "a photo of a cat", "", 0, 64, 64, 6, 7.5, "Latent", ("bilinear", False), 2.0, 4, 0.5),
    ("latent_bicubic_aa_s1", "a small red circle on the left, blue background", "blurry, low quality", 1, 64, 64, 6, 7.5,
     "Latent (bicubic antialiased)", ("bicubic", True), 1.5, 0, 0.75),
]


def to_png(img01, path):
    arr = (img01[0].permute(1, 2, 0).cpu().numpy() * 255).round().astype("uint8")
    Image.fromarray(arr).save(path)


def easel_schedule(n, s):
    """easel hires_schedule (pipeline/hires.cpp): int(N / min(s, 0.999)) steps, the last N run."""
    sched = max(n, int(n / min(s, 0.999)))
    return sched, sched - n


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    t0 = time.time()
    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
    import diffusers
    import diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion as p_t2i
    import diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion_img2img as p_i2i
    import transformers
    from diffusers import EulerDiscreteScheduler, StableDiffusionImg2ImgPipeline, StableDiffusionPipeline

    with open(os.path.join(REF, "cases.json")) as f:
        meta = json.load(f)
    base_case = next(c for c in meta["cases"] if c["name"] == "euler_discrete_a_s0")
    assert base_case["diffusers_scheduler"] == "EulerDiscreteScheduler"
    sched_cfg = base_case["diffusers_scheduler_config"]

    t2i = StableDiffusionPipeline.from_pretrained(os.path.join(REF, "diffusers"), torch_dtype=torch.float32,
                                                  local_files_only=True, safety_checker=None,
                                                  requires_safety_checker=False)
    t2i.set_progress_bar_config(disable=True)

    # every randn_tensor draw of both pipelines, in order
    draws = []
    orig_randn = p_t2i.randn_tensor

    def rec(*a, **k):
        t = orig_randn(*a, **k)
        draws.append(t.detach().float().clone())
        return t

    p_t2i.randn_tensor = rec
    p_i2i.randn_tensor = rec

    def fresh_scheduler():
        return EulerDiscreteScheduler.from_config(sched_cfg)

    # self-check: the loaded folder reproduces the committed txt2img case (same weights, same scheduler)
    t2i.scheduler = fresh_scheduler()
    with torch.no_grad():
        img = t2i(prompt=base_case["prompt"], num_inference_steps=base_case["steps"], guidance_scale=base_case["cfg_scale"],
                  height=base_case["height"], width=base_case["width"],
                  generator=torch.Generator("cpu").manual_seed(base_case["seed"]), output_type="pt").images
    committed = np.asarray(Image.open(os.path.join(REF, base_case["png"])).convert("RGB"), np.float32) / 255.0
    self_check = float(np.abs(committed - img[0].permute(1, 2, 0).numpy()).max())
    print(f"self-check vs committed {base_case['png']}: max abs diff {self_check:.3g}")

    results = []
    for (name, prompt, neg, seed, W, H, steps, cfg, up_name, (mode, aa), scale, hires_steps, strength) in CASES:
        t = {}
        # ---- pass 1: txt2img, the latent out
        t2i.scheduler = fresh_scheduler()
        lat1 = []

        def cb(p, i, ts, kw, store=lat1):
            store.append(kw["latents"].detach().float().clone())
            return kw

        draws.clear()
        with torch.no_grad():
            lowres = t2i(prompt=prompt, negative_prompt=neg or None, num_inference_steps=steps, guidance_scale=cfg,
                         height=H, width=W, generator=torch.Generator("cpu").manual_seed(seed), output_type="latent",
                         callback_on_step_end=cb).images
        assert len(draws) == 1, f"pass 1 drew {len(draws)} times"
        t["lowres_latent"] = lowres.float().clone()
        t["lowres_step_latents"] = torch.cat(lat1, 0)
        t["sigmas1"] = t2i.scheduler.sigmas.float().cpu().clone()
        t["timesteps1"] = t2i.scheduler.timesteps.float().cpu().clone()
        assert torch.equal(t["lowres_latent"], lat1[-1])

        # ---- upscale: A1111 StableDiffusionProcessingTxt2Img (latent upscalers), target int(W * scale)
        W2, H2 = int(W * scale), int(H * scale)
        assert W2 % 8 == 0 and H2 % 8 == 0
        up = F.interpolate(lowres, size=(H2 // 8, W2 // 8), mode=mode, antialias=aa) if aa else \
            F.interpolate(lowres, size=(H2 // 8, W2 // 8), mode=mode)
        t["upscaled_latent"] = up.float().clone()

        # ---- pass 2: img2img on the latent, the last N of int(N / s) steps
        n_run = hires_steps if hires_steps > 0 else steps
        sched_steps, e_start = easel_schedule(n_run, strength)
        init_timestep = min(int(sched_steps * strength), sched_steps)  # diffusers get_timesteps
        d_start = max(sched_steps - init_timestep, 0)
        assert d_start == e_start and init_timestep == n_run, (name, sched_steps, d_start, e_start, init_timestep, n_run)

        i2i = StableDiffusionImg2ImgPipeline(**t2i.components)
        i2i.set_progress_bar_config(disable=True)
        i2i.scheduler = fresh_scheduler()
        lat2 = []

        def cb2(p, i, ts, kw, store=lat2):
            store.append(kw["latents"].detach().float().clone())
            return kw

        first = {}

        def hook(mod, args, kwargs, output):
            if not first:
                first["sample"] = args[0].detach().float().clone()

        h = i2i.unet.register_forward_hook(hook, with_kwargs=True)
        draws.clear()
        with torch.no_grad():
            img = i2i(prompt=prompt, negative_prompt=neg or None, image=up, strength=strength,
                      num_inference_steps=sched_steps, guidance_scale=cfg,
                      generator=torch.Generator("cpu").manual_seed(seed), output_type="pt",
                      callback_on_step_end=cb2).images
        h.remove()
        assert len(draws) == 1, f"pass 2 drew {len(draws)} times (expected only the noise)"
        noise_ref = torch.randn(up.shape, generator=torch.Generator("cpu").manual_seed(seed), dtype=torch.float32)
        assert torch.equal(draws[0], noise_ref), "pass 2 noise is not the first draw of the seed"
        sch = i2i.scheduler
        assert len(lat2) == n_run, (len(lat2), n_run)
        sig = sch.sigmas.float().cpu()
        t["noise2"] = draws[0].clone()
        t["noised_latent"] = (up + draws[0] * float(sig[d_start])).float()
        t["sigmas2"] = sig.clone()
        t["timesteps2"] = sch.timesteps.float().cpu().clone()
        t["step_latents2"] = torch.cat(lat2, 0)
        t["final_latent"] = lat2[-1]
        t["image"] = img.float()
        # the first UNet input is the noised latent scaled by 1 / sqrt(sigma^2 + 1) (CFG batch of 2)
        first_in_err = float((first["sample"][:1] - t["noised_latent"] / (float(sig[d_start]) ** 2 + 1) ** 0.5).abs().max())
        save_file({k: v.contiguous() for k, v in t.items()}, os.path.join(out, f"hires_{name}.safetensors"))
        to_png(img, os.path.join(out, f"hires_{name}.png"))
        args = [f'-p "{prompt}"']
        if neg:
            args.append(f'-n "{neg}"')
        args += [f"-W {W}", f"-H {H}", f"--steps {steps}", f"--cfg-scale {cfg}", f"-s {seed}", "--sampling-method euler",
                 "--scheduler discrete", "--rng cpu", "--hires", f'--hires-upscaler "{up_name}"', f"--hires-scale {scale:g}",
                 f"--hires-steps {hires_steps}", f"--hires-denoising-strength {strength:g}"]
        results.append({
            "name": name, "prompt": prompt, "negative_prompt": neg, "seed": seed, "width": W, "height": H, "steps": steps,
            "cfg_scale": cfg, "sampler": "euler", "scheduler": "discrete", "rng": "cpu",
            "hires_upscaler": up_name, "interpolate": {"mode": mode, "antialias": aa, "size": [H2 // 8, W2 // 8]},
            "hires_scale": scale, "hires_width": W2, "hires_height": H2, "hires_steps": hires_steps,
            "hires_denoising_strength": strength, "pass2_num_inference_steps": sched_steps, "pass2_t_start": d_start,
            "pass2_steps_run": n_run, "rng_draws_pass2": [list(up.shape)],
            "first_unet_input_vs_noised_latent_max_abs": first_in_err,
            "png": f"hires_{name}.png", "tensors": f"hires_{name}.safetensors",
            "easel_args": "generate -m sd_tiny.safetensors " + " ".join(args),
        })
        print(f"case {name}: {W}x{H} -> {W2}x{H2}, pass 2 {n_run} of {sched_steps} steps (t_start {d_start}), "
              f"first UNet input check {first_in_err:.3g} ({time.time() - t0:.1f}s)")

    info = {"generator": "tools/reference/hires_diffusers_reference.py", "torch": torch.__version__,
            "diffusers": diffusers.__version__, "transformers": transformers.__version__, "device": "cpu float32",
            "weights": "tests/data/reference/sd_tiny/diffusers (f16, run in float32)",
            "scheduler_config": sched_cfg, "self_check_case0_png_max_abs_diff": self_check, "cases": results}
    with open(os.path.join(out, "hires_cases.json"), "w") as f:
        json.dump(info, f, indent=1, default=str)
    print(f"done in {time.time() - t0:.1f}s; wrote {len(results)} cases to {out}")


if __name__ == "__main__":
    main()
