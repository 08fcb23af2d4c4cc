"""diffusers' samplers on the bundled demo model (tryout finding F19): does DPM-Solver++(2M) with Karras
sigmas at 10-12 steps, or Heun with exponential sigmas at 6 steps, also draw noise in diffusers?

  PYTHONPATH=<diffusers source> python3 tools/reference/dpm_check.py --model models/demo/easel-demo-shapes.safetensors \
      --tok tests/data/reference/sd_tiny/diffusers/tokenizer --out OUT

Builds diffusers' StableDiffusionPipeline from the single file exactly as tools/demo-model/train.py's
--resume path does (ldm_convert.ldm_to_components, the file's f16 values in float32, UNet config from the
file's unet_config metadata), runs it on the CPU in float32 with the initial noise of
torch.Generator("cpu").manual_seed(seed) (what `easel generate --rng cpu -s seed` draws), and writes for
every case OUT/<name>.png, OUT/<name>.safetensors (noise, sigmas, timesteps, step_latents: the latent
after every scheduler step, step_x0: the scheduler's x0 prediction of every step) and a line in
OUT/summary.json (scheduler config, per-step sigma / |latent| / |x0| RMS, train.analyse() of the image and
check() against the prompt). Latent forms: DPMSolverMultistepScheduler keeps VP samples
(alpha * x, alpha = 1/sqrt(sigma^2 + 1)); Euler/Heun keep k-diffusion's x = x0 + sigma * noise.

Second use, numpy only (no torch): `python3 tools/reference/dpm_check.py --emit-cpp DIR` prints the C++
arrays of tests/unit/sampling_dpm_zsnr_test.cpp from DIR/dpm_karras_10.safetensors and DIR/heun_exp_6.safetensors
(the outputs of a run): for 12 latent elements (flat index 341*k), the initial noise, every step's x0
prediction and every step's latent.
"""

import argparse
import json
import os
import struct
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "demo-model"))
torch = ldm_convert = train = None  # imported by load_heavy(): --emit-cpp runs with numpy alone


def load_heavy():
    global torch, ldm_convert, train
    import torch
    import ldm_convert
    import train

P_CROSS = "a small cyan cross at the bottom, brown background"
P_RING = "a large green ring on the right, grey background"
BASE = dict(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
            prediction_type="v_prediction", timestep_spacing="linspace", steps_offset=1)

# name, scheduler kind, scheduler options, prompt, steps
CASES = [
    ("dpm_karras_10", "dpm", dict(use_karras_sigmas=True), P_CROSS, 10),
    ("dpm_karras_12", "dpm", dict(use_karras_sigmas=True), P_CROSS, 12),
    ("dpm_karras_20", "dpm", dict(use_karras_sigmas=True), P_CROSS, 20),
    ("dpm_discrete_10", "dpm", dict(), P_CROSS, 10),
    ("euler_karras_10", "euler", dict(use_karras_sigmas=True), P_CROSS, 10),
    ("euler_discrete_10", "euler", dict(), P_CROSS, 10),
    ("heun_exp_6", "heun", dict(use_exponential_sigmas=True), P_RING, 6),
    ("heun_discrete_6", "heun", dict(), P_RING, 6),
    ("euler_exp_6", "euler", dict(use_exponential_sigmas=True), P_RING, 6),
    ("heun_exp_10", "heun", dict(use_exponential_sigmas=True), P_RING, 10),
    ("dpm_karras_10_ring", "dpm", dict(use_karras_sigmas=True), P_RING, 10),
]


def make_scheduler(kind, opts):
    from diffusers import DPMSolverMultistepScheduler, EulerDiscreteScheduler, HeunDiscreteScheduler

    if kind == "dpm":
        return DPMSolverMultistepScheduler(**BASE, rescale_betas_zero_snr=True, algorithm_type="dpmsolver++",
                                           solver_order=2, final_sigmas_type="zero", lower_order_final=True, **opts)
    if kind == "euler":
        return EulerDiscreteScheduler(**BASE, rescale_betas_zero_snr=True, **opts)
    # HeunDiscreteScheduler has no rescale_betas_zero_snr: the same betas (rescale_zero_terminal_snr) given as
    # trained_betas, and alphas_cumprod[-1] = 2**-24 as the other schedulers set it (else sigma_max = inf).
    from diffusers.schedulers.scheduling_euler_discrete import rescale_zero_terminal_snr

    betas = torch.linspace(BASE["beta_start"] ** 0.5, BASE["beta_end"] ** 0.5, 1000, dtype=torch.float32) ** 2
    s = HeunDiscreteScheduler(**{k: v for k, v in BASE.items()}, trained_betas=rescale_zero_terminal_snr(betas).tolist(),
                              **opts)
    s.alphas_cumprod[-1] = 2 ** -24
    s.set_timesteps(1000)
    return s


def load_pipe(model, tok_dir):
    from diffusers import AutoencoderKL, EulerDiscreteScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from safetensors.torch import load_file
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    with open(model, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        meta = json.loads(f.read(n))["__metadata__"]
    unet = UNet2DConditionModel(**json.loads(meta["unet_config"]))
    te = CLIPTextModel(CLIPTextConfig(**train.TE_CFG))
    vae = AutoencoderKL(**train.VAE_CFG)
    ldm = ldm_convert.fix_te_keys({k: v for k, v in load_file(model).items() if k not in ("v_pred", "ztsnr")})
    comps = ldm_convert.ldm_to_components(ldm, unet, vae, te)
    for name, m in (("unet", unet), ("vae", vae), ("text_encoder", te)):
        missing, unexpected = m.load_state_dict({k: v.float() for k, v in comps[name].items()}, strict=False)
        assert not unexpected and all(k.endswith("position_ids") for k in missing), (name, missing, unexpected)
    tok = CLIPTokenizer.from_pretrained(tok_dir, model_max_length=77)
    p = StableDiffusionPipeline(vae=vae.eval(), text_encoder=te.eval(), tokenizer=tok, unet=unet.eval(),
                                scheduler=EulerDiscreteScheduler(**BASE, rescale_betas_zero_snr=True),
                                safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    p.set_progress_bar_config(disable=True)
    return p.to("cpu")


def rms(t):
    return float(t.float().pow(2).mean().sqrt())


def run_case(pipe, name, kind, opts, prompt, steps, seed, cfg, out):
    from PIL import Image
    from safetensors.torch import save_file

    sched = make_scheduler(kind, opts)
    pipe.scheduler = sched
    lat, x0s = [], []
    orig_step = sched.step

    def step(*a, **k):
        rd = k.get("return_dict", True)
        k["return_dict"] = True
        o = orig_step(*a, **k)
        lat.append(o.prev_sample.detach().float().clone())
        if kind == "dpm":
            x0s.append(sched.model_outputs[-1].detach().float().clone())
        elif getattr(o, "pred_original_sample", None) is not None:
            x0s.append(o.pred_original_sample.detach().float().clone())
        return o if rd else (o.prev_sample,)

    sched.step = step
    t0 = time.time()
    with torch.no_grad():
        img = pipe(prompt=prompt, num_inference_steps=steps, guidance_scale=cfg, height=256, width=256,
                   generator=torch.Generator("cpu").manual_seed(seed), output_type="pt").images
    noise = torch.randn((1, 4, 32, 32), generator=torch.Generator("cpu").manual_seed(seed))
    res = train.analyse(img[0].float())
    chk = train.check(train.parse_prompt(prompt), res)
    tensors = {"noise": noise, "sigmas": sched.sigmas.float(), "timesteps": sched.timesteps.float(),
               "step_latents": torch.cat(lat)}
    if x0s:
        tensors["step_x0"] = torch.cat(x0s)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out, name + ".safetensors"))
    arr = (img[0].permute(1, 2, 0).numpy() * 255).round().astype("uint8")
    Image.fromarray(arr).save(os.path.join(out, name + ".png"))
    rec = {"name": name, "scheduler": type(sched).__name__,
           "config": {k: v for k, v in dict(sched.config).items() if not k.startswith("_") and k != "trained_betas"},
           "prompt": prompt, "seed": seed, "steps": steps, "cfg_scale": cfg,
           "latent_form": "vp (alpha * x)" if kind == "dpm" else "ve (x0 + sigma * noise)",
           "sigmas": [float(s) for s in sched.sigmas], "timesteps": [float(t) for t in sched.timesteps],
           "rms_latent": [rms(t) for t in lat], "rms_x0": [rms(t) for t in x0s],
           "analysis": dict(zip(["bg", "colour", "cx", "cy", "area"], res)), "check": chk,
           "all_checks_pass": all(chk.values()), "seconds": round(time.time() - t0, 2)}
    print(json.dumps({k: rec[k] for k in ("name", "steps", "analysis", "all_checks_pass", "seconds")}), flush=True)
    return rec


def read_safetensors(path):
    import numpy as np

    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
        raw = f.read()
    return {k: np.frombuffer(raw[v["data_offsets"][0]:v["data_offsets"][1]], dtype=np.float32).reshape(v["shape"])
            for k, v in h.items() if k != "__metadata__"}


def emit_cpp(d):
    idx = [341 * k for k in range(12)]

    def arr(name, a):
        vals = ", ".join(f"{float(v):.9g}f" for v in a)
        return f"const std::vector<float> {name} = {{{vals}}};"

    print(f"// tools/reference/dpm_check.py --emit-cpp: elements {idx} of the [1, 4, 32, 32] latent")
    for case, tag in (("dpm_karras_10", "kDpm"), ("heun_exp_6", "kHeun")):
        t = read_safetensors(os.path.join(d, case + ".safetensors"))
        print(f"// {case}: sigmas {[float(x) for x in t['sigmas']]}")
        print(arr(tag + "Noise", t["noise"].reshape(-1)[idx]))
        x0 = t["step_x0"].reshape(len(t["step_x0"]), -1)[:, idx]
        lat = t["step_latents"].reshape(len(t["step_latents"]), -1)[:, idx]
        print(arr(tag + "X0", x0.reshape(-1)))
        print(arr(tag + "Latents", lat.reshape(-1)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--emit-cpp", metavar="DIR", help="print the C++ reference arrays from a run's outputs and exit")
    ap.add_argument("--model")
    ap.add_argument("--tok")
    ap.add_argument("--out")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--cfg", type=float, default=5.0)
    a = ap.parse_args()
    if a.emit_cpp:
        emit_cpp(a.emit_cpp)
        return
    if not (a.model and a.tok and a.out):
        ap.error("--model, --tok and --out are needed (or --emit-cpp DIR)")
    load_heavy()
    torch.set_num_threads(max(1, min(16, os.cpu_count() or 1)))
    os.makedirs(a.out, exist_ok=True)
    pipe = load_pipe(a.model, a.tok)
    import diffusers

    summary = {"model": a.model, "device": "cpu float32", "weights": "exactly the f16 values of the file",
               "diffusers": diffusers.__version__, "torch": torch.__version__, "cases": []}
    for name, kind, opts, prompt, steps in CASES:
        try:
            summary["cases"].append(run_case(pipe, name, kind, opts, prompt, steps, a.seed, a.cfg, a.out))
        except Exception as e:  # one failing case must not cost the others
            print(f"FAILED {name}: {type(e).__name__}: {e}", flush=True)
            summary["cases"].append({"name": name, "error": f"{type(e).__name__}: {e}"[:500]})
        with open(os.path.join(a.out, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1, default=str)


if __name__ == "__main__":
    main()
