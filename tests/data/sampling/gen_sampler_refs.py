"""Reference trajectories of diffusers schedulers for easel's samplers (heun, dpm2, euler_a with
torch's generator, v-prediction euler, ddim trailing eta 0 / 1, flow DPM++ 2M).

Run on the GPU machine with diffusers' source on PYTHONPATH (see tools/reference/README.md):
    source tools/reference/device_setup.sh
    python3 tests/data/sampling/gen_sampler_refs.py --out $OUT
Writes sampler_refs.safetensors and sampler_refs.json. For every case <name>:
    <name>.x_init      (1,4,8,8)   starting sample (randn(seed 4242) * init_noise_sigma)
    <name>.x_steps     (n,1,4,8,8) the sample after each full step (Heun / KDPM2: after the
                                  second-order sub-step; the last step is first order)
    <name>.sigmas      (n+1,)      the step sigmas (without Heun/KDPM2's repeated entries)
    <name>.timesteps   (n,)        the timestep fed to the model at the start of each step
Toy model: eps (or v, or flow velocity) = tanh(x_in)*0.5 + 0.1*t/1000 with
x_in = scheduler.scale_model_input(x, t). Stochastic steps draw from the same CPU generator
that made x_init (torch.Generator().manual_seed(4242)).
"""

import argparse
import json

import torch
from safetensors.torch import save_file

import diffusers
from diffusers import (DDIMScheduler, DPMSolverMultistepScheduler, EulerAncestralDiscreteScheduler,
                       EulerDiscreteScheduler, HeunDiscreteScheduler, KDPM2DiscreteScheduler)

SD15 = dict(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
            steps_offset=1)


def toy(x_in, t):
    return torch.tanh(x_in) * 0.5 + 0.1 * (t / 1000.0)


def run(name, sched, steps, out, meta, eta=None):
    sched.set_timesteps(steps)
    gen = torch.Generator().manual_seed(4242)
    x = torch.randn((1, 4, 8, 8), generator=gen, dtype=torch.float32) * sched.init_noise_sigma
    x_init = x.clone()
    rows, ts_used = [], []
    two_stage = isinstance(sched, (HeunDiscreteScheduler, KDPM2DiscreteScheduler))
    for t in sched.timesteps:
        first = (not two_stage) or sched.state_in_first_order
        if first:
            ts_used.append(float(t))
        x_in = sched.scale_model_input(x, t)
        kw = {}
        if isinstance(sched, EulerAncestralDiscreteScheduler):
            kw["generator"] = gen
        if isinstance(sched, DDIMScheduler):
            kw["eta"] = eta
            kw["generator"] = gen
        x = sched.step(toy(x_in, t.to(torch.float32)), t, x, **kw).prev_sample
        if (not two_stage) or sched.state_in_first_order:
            rows.append(x.clone())
    if two_stage and len(rows) < steps:
        rows.append(x.clone())  # the final first-order step
    assert len(rows) == steps, (name, len(rows))
    if two_stage:
        vals = []
        for v in sched.sigmas.tolist():
            if not vals or v != vals[-1]:
                vals.append(v)
        sig = torch.tensor(vals[: steps + 1], dtype=torch.float32)
    elif isinstance(sched, DDIMScheduler):
        ac = sched.alphas_cumprod
        tl = [int(v) for v in sched.timesteps]
        prev = [v - 1000 // steps for v in tl]
        a = [ac[v] for v in tl] + [ac[prev[-1]] if prev[-1] >= 0 else sched.final_alpha_cumprod]
        sig = torch.tensor([float(((1 - v) / v) ** 0.5) for v in a], dtype=torch.float32)
    else:
        sig = sched.sigmas.to(torch.float32)
    out[f"{name}.x_init"] = x_init.contiguous()
    out[f"{name}.x_steps"] = torch.stack(rows).contiguous()
    out[f"{name}.sigmas"] = sig.contiguous()
    out[f"{name}.timesteps"] = torch.tensor(ts_used, dtype=torch.float32)
    meta[name] = {"class": type(sched).__name__, "config": {k: v for k, v in sched.config.items() if not k.startswith("_")},
                  "steps": steps, "eta": eta, "init_noise_sigma": float(sched.init_noise_sigma)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    out, meta = {}, {}
    run("heun_sd15", HeunDiscreteScheduler(**SD15), 10, out, meta)
    run("dpm2_sd15", KDPM2DiscreteScheduler(**SD15), 10, out, meta)
    run("euler_a_sd15", EulerAncestralDiscreteScheduler(**SD15), 20, out, meta)
    run("euler_v_sd15", EulerDiscreteScheduler(**SD15, prediction_type="v_prediction"), 20, out, meta)
    ddim = dict(SD15, timestep_spacing="trailing", set_alpha_to_one=False, clip_sample=False)
    run("ddim_trailing_eta0_sd15", DDIMScheduler(**ddim), 20, out, meta, eta=0.0)
    run("ddim_trailing_eta1_sd15", DDIMScheduler(**ddim), 20, out, meta, eta=1.0)
    run("dpmpp_2m_flow_shift3", DPMSolverMultistepScheduler(num_train_timesteps=1000, use_flow_sigmas=True, flow_shift=3.0,
                                                            prediction_type="flow_prediction"), 20, out, meta)
    save_file(out, f"{a.out}/sampler_refs.safetensors", metadata={"generator": "tests/data/sampling/gen_sampler_refs.py"})
    info = {"torch": torch.__version__, "diffusers": diffusers.__version__, "toy_model": "tanh(x_in)*0.5 + 0.1*t/1000",
            "cases": meta}
    with open(f"{a.out}/sampler_refs.json", "w") as f:
        json.dump(info, f, indent=1, default=str)
    print("ok", sorted(meta))


if __name__ == "__main__":
    main()
