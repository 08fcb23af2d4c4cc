"""Reference trajectories for every easel sampler and scheduler (issue 26).

    python3 tools/reference/sampler_refs.py --out OUT [--kdiff .kdiff] [--diffusers .diffusers]
        [--demo models/demo/easel-demo-shapes.safetensors] [--zimage tests/data/reference/zimage_tiny/diffusers/transformer]

Writes OUT/samplers.json and OUT/samplers.safetensors (about 1.5 MB; they go to tests/data/reference/samplers/),
read by tests/unit/sampling_reference_test.cpp.

References (docs/sampling.md names one per method):
  * k-diffusion's own functions (crowsonkb/k-diffusion k_diffusion/sampling.py, loaded from --kdiff without
    its package __init__, whose imports need torchvision; torchsde / torchdiffeq are stubbed when absent:
    every stochastic sampler gets a noise_sampler, so no Brownian tree is made): euler, euler_a, heun, dpm2,
    dpm2_a, lms, dpm++2s_a, dpm++2s (eta 0), dpm++_sde, dpm++2m, dpm++2m_sde(_bt) on eps/v models.
  * diffusers' schedulers (--diffusers): uni_pc (UniPCMultistepScheduler), deis (DEISMultistepScheduler), ddim
    and ddim_trailing (DDIMScheduler), tcd (TCDScheduler), dpm++2m on flow models (DPMSolverMultistepScheduler
    use_flow_sigmas), and the discrete / lcm / ddim timesteps.
  * transcriptions in this file, marked "ComfyUI" or "sd.cpp", of the methods only those define
    (comfyanonymous/ComfyUI comfy/k_diffusion/sampling.py, comfy/samplers.py, comfy_extras/nodes_align_your_steps.py,
    nodes_gits.py; leejet/stable-diffusion.cpp src/runtime/denoiser.hpp): the flow (CONST) forms of euler_a,
    dpm2_a, dpm++_sde, dpm++2m_sde; lcm, ipndm, ipndm_v, res_multistep, er_sde, euler_cfg_pp, euler_a_cfg_pp;
    dpm++2mv2, res_2s (sd.cpp); the ays, gits, sgm_uniform, simple, kl_optimal, beta, smoothstep, ddim_uniform
    schedules.

Model functions:
  * analytic (also in the C++ test): with i the flat element index and t the network timestep,
      F_cond(x_in, t)   = 0.5 tanh(x_in) + 0.1 t/1000 + 0.05 sin(i)
      F_uncond(x_in, t) = 0.4 tanh(x_in) - 0.05 t/1000 + 0.03 cos(i)
    as the eps, v or flow-velocity prediction of an SD1.5-table eps model ("eps"), the same table with v
    ("v"), and a rectified-flow model with shift 3 ("flow"); CFG 3 (F = F_u + 3 (F_c - F_u)).
  * the bundled demo model (SD1.x v-prediction, zero terminal SNR; diffusers UNet2DConditionModel built as
    tools/reference/dpm_check.py does) on a [1, 4, 4, 4] latent, random context [1, 77, 128], CFG 5;
  * the tiny Z-Image transformer of tests/data/reference/zimage_tiny (flow, shift 3; ZImagePipeline's call:
    timestep (1000 - t)/1000, velocity = -output) on a [1, 16, 4, 4] latent, random cap feats [8, 12], CFG 3.
  The real networks are recorded per evaluation (F_cond, F_uncond): the C++ test replays them.

Noise: every stochastic term comes from noise_sampler(sigma, sigma_next), here torch.randn(float32) on a
generator seeded per case; the draws are recorded with their sigma pair and easel replays them
(Sampler::set_noise_source). diffusers' TCD / DDIM noise is recorded the same way (randn_tensor patched,
DDIM's variance_noise).

Latents are stored in easel's form: x = x0 + sigma noise for eps/v models (diffusers' VP samples divided by
alpha = 1/sqrt(sigma^2 + 1)), x itself for flow models. k-diffusion runs in float64 from float32 starts.
"""

import argparse
import importlib.util
import json
import math
import os
import sys
import types

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
F64 = torch.float64

# ---------------------------------------------------------------------------------------------------------
# imports of the references


def load_kdiffusion(root):
    """k_diffusion/sampling.py without the package __init__ (its imports need torchvision, clean-fid ...)."""
    kdir = os.path.join(root, "k_diffusion")
    pkg = types.ModuleType("k_diffusion")
    pkg.__path__ = [kdir]
    utils = types.ModuleType("k_diffusion.utils")

    def append_dims(x, target_dims):
        return x[(...,) + (None,) * (target_dims - x.ndim)]

    utils.append_dims = append_dims
    pkg.utils = utils
    sys.modules["k_diffusion"] = pkg
    sys.modules["k_diffusion.utils"] = utils
    stubs = []
    for name in ("torchsde", "torchdiffeq"):
        try:
            __import__(name)
        except ImportError:
            m = types.ModuleType(name)
            m.BrownianTree = None
            m.odeint = None
            sys.modules[name] = m
            stubs.append(name)
    try:
        import tqdm.auto  # noqa: F401
    except ImportError:
        tq = types.ModuleType("tqdm")
        tqa = types.ModuleType("tqdm.auto")
        tqa.trange = lambda *a, **k: range(*a)
        tqa.tqdm = lambda *a, **k: a[0] if a else None
        sys.modules["tqdm"], sys.modules["tqdm.auto"] = tq, tqa
    spec = importlib.util.spec_from_file_location("k_diffusion.sampling", os.path.join(kdir, "sampling.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules["k_diffusion.sampling"] = mod
    spec.loader.exec_module(mod)
    for name in stubs:  # gone again: diffusers' package probes (importlib find_spec) must not see them
        del sys.modules[name]
    return mod


KD = None  # k_diffusion.sampling


# ---------------------------------------------------------------------------------------------------------
# the models' noise processes (what easel's ModelSampling holds)


class DiscreteMS:
    """SD1.x scaled_linear table (optionally zero terminal SNR) as diffusers' EulerDiscreteScheduler makes it."""

    def __init__(self, prediction, zsnr=False):
        from diffusers import EulerDiscreteScheduler

        s = EulerDiscreteScheduler(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012,
                                   beta_schedule="scaled_linear", rescale_betas_zero_snr=zsnr)
        ac = s.alphas_cumprod.to(torch.float32)
        self.table = (((1 - ac) / ac) ** 0.5).numpy().astype(np.float32)  # ascending, t = 0..999
        self.log_table = np.log(self.table)  # float32, as easel's log_sigmas
        self.prediction = prediction
        self.zsnr = zsnr
        self.flow = False
        self.T = 1000

    def sigma_to_t(self, sigma):
        # diffusers _sigma_to_t / k-diffusion DiscreteSchedule.sigma_to_t, in float64 on the float32 log table
        ls = math.log(max(float(sigma), 1e-10))
        low = 0
        for i in range(self.T):
            if float(self.log_table[i]) <= ls:
                low = i
        low = min(low, self.T - 2)
        lo, hi = float(self.log_table[low]), float(self.log_table[low + 1])
        w = min(max((lo - ls) / (lo - hi), 0.0), 1.0)
        return (1 - w) * low + w * (low + 1)

    def t_to_sigma(self, t):
        t = min(max(float(t), 0.0), self.T - 1.0)
        lo, hi = math.floor(t), math.ceil(t)
        w = t - lo
        return math.exp((1 - w) * float(self.log_table[lo]) + w * float(self.log_table[hi]))

    def scalings(self, s):  # c_skip, c_out, c_in
        if self.prediction == "eps":
            return 1.0, -s, 1.0 / math.sqrt(s * s + 1)
        return 1.0 / (s * s + 1), -s / math.sqrt(s * s + 1), 1.0 / math.sqrt(s * s + 1)

    @property
    def sigma_min(self):
        return float(self.table[0])

    @property
    def sigma_max(self):
        return float(self.table[-1])


class FlowMS:
    """Rectified flow with a static shift (ComfyUI ModelSamplingDiscreteFlow, diffusers FlowMatch)."""

    def __init__(self, shift=3.0):
        self.shift = shift
        self.flow = True
        self.T = 1000
        self.prediction = "flow"
        self.table = np.array([self.shift_of((i + 1) / 1000) for i in range(1000)], dtype=np.float32)

    def shift_of(self, s):
        return self.shift * s / (1 + (self.shift - 1) * s)

    def sigma_to_t(self, sigma):
        return float(sigma) * self.T

    def t_to_sigma(self, t):
        return self.shift_of(float(t) / self.T)

    def scalings(self, s):
        return 1.0, -s, 1.0

    @property
    def sigma_min(self):
        return float(self.table[0])

    @property
    def sigma_max(self):
        return float(self.table[-1])


# ---------------------------------------------------------------------------------------------------------
# networks


class AnalyticNet:
    """The analytic model of the C++ test (see the module docstring)."""

    def __call__(self, x_in, t, branch):
        n = x_in.numel()
        i = torch.arange(n, dtype=F64).reshape(x_in.shape)
        x = x_in.to(F64)
        if branch == "cond":
            return 0.5 * torch.tanh(x) + 0.1 * t / 1000.0 + 0.05 * torch.sin(i)
        return 0.4 * torch.tanh(x) - 0.05 * t / 1000.0 + 0.03 * torch.cos(i)


class RecordingNet:
    """A real network; every evaluation's outputs are recorded for the C++ replay."""

    def __init__(self, fn):
        self.fn = fn
        self.records = []  # (t, F_cond, F_uncond) per D evaluation

    def __call__(self, x_in, t, branch):
        with torch.no_grad():
            out = self.fn(x_in.to(torch.float32), float(t), branch).to(torch.float32)
        if branch == "cond":
            self.records.append([float(t), out.clone(), None])
        else:
            self.records[-1][2] = out.clone()
        return out.to(F64)


def demo_net(model_path):
    sys.path.insert(0, HERE)
    sys.path.insert(0, os.path.join(HERE, "..", "demo-model"))
    import struct

    import ldm_convert
    import train
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from safetensors.torch import load_file
    from transformers import CLIPTextConfig, CLIPTextModel

    with open(model_path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        meta = json.loads(f.read(n))["__metadata__"]
    unet = UNet2DConditionModel(**json.loads(meta["unet_config"]))
    te = CLIPTextModel(CLIPTextConfig(**train.TE_CFG))
    vae = AutoencoderKL(**train.VAE_CFG)
    ldm = ldm_convert.fix_te_keys({k: v for k, v in load_file(model_path).items() if k not in ("v_pred", "ztsnr")})
    comps = ldm_convert.ldm_to_components(ldm, unet, vae, te)
    unet.load_state_dict({k: v.float() for k, v in comps["unet"].items()})
    unet.eval()
    g = torch.Generator().manual_seed(7)
    ctx = {"cond": torch.randn((1, 77, 128), generator=g), "uncond": torch.randn((1, 77, 128), generator=g)}

    def fn(x_in, t, branch):
        return unet(x_in, torch.tensor([t], dtype=torch.float32), encoder_hidden_states=ctx[branch]).sample

    return fn


def zimage_net(transformer_dir):
    from diffusers import ZImageTransformer2DModel

    dit = ZImageTransformer2DModel.from_pretrained(transformer_dir, torch_dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(11)
    cap = {"cond": torch.randn((8, 12), generator=g), "uncond": torch.randn((8, 12), generator=g)}

    def fn(x_in, t, branch):
        # ZImagePipeline: latents [B, C, H, W] -> list of [C, 1, H, W]; timestep (1000 - t)/1000; velocity = -out
        ts = torch.tensor([(1000.0 - t) / 1000.0], dtype=torch.float32)
        out = dit([x_in[0].unsqueeze(1)], ts, [cap[branch]], return_dict=False)[0]
        return -out[0].squeeze(1).unsqueeze(0)

    return fn


class Denoiser:
    """k-diffusion's D(x; sigma) with CFG over a network F (easel's Denoiser)."""

    def __init__(self, ms, net, cfg):
        self.ms, self.net, self.cfg = ms, net, cfg
        self.evals = []  # (sigma, t)

    def both(self, x, sigma, t=None, want_uncond=False):
        s = float(sigma)
        if t is None:
            t = self.ms.sigma_to_t(s)
        c_skip, c_out, c_in = self.ms.scalings(s)
        x_in = x * c_in
        self.evals.append((s, float(t)))
        fc = self.net(x_in, t, "cond")
        fu = self.net(x_in, t, "uncond") if (self.cfg != 1 or want_uncond) else None
        f = fu + self.cfg * (fc - fu) if self.cfg != 1 else fc
        d = c_skip * x + c_out * f
        du = c_skip * x + c_out * fu if fu is not None else None
        return d, du

    def __call__(self, x, sigma, **kw):
        s = sigma.reshape(-1)[0] if torch.is_tensor(sigma) else sigma
        return self.both(x, s)[0]


class NoiseSampler:
    def __init__(self, seed, shape, dtype):
        self.g = torch.Generator().manual_seed(seed)
        self.shape, self.dtype = shape, dtype
        self.calls, self.draws = [], []

    def __call__(self, sigma, sigma_next):
        z = torch.randn(self.shape, generator=self.g, dtype=torch.float32)
        self.calls.append([float(sigma), float(sigma_next)])
        self.draws.append(z.clone())
        return z.to(self.dtype)


# ---------------------------------------------------------------------------------------------------------
# transcriptions (ComfyUI comfy/k_diffusion/sampling.py; sd.cpp src/runtime/denoiser.hpp)


def lam_fn(ms):  # ComfyUI sigma_to_half_log_snr
    if ms.flow:
        return lambda s: math.log((1 - s) / s)
    return lambda s: -math.log(s)


def sig_of_lam(ms):  # ComfyUI half_log_snr_to_sigma
    if ms.flow:
        return lambda l: 1.0 / (1.0 + math.exp(l))
    return lambda l: math.exp(-l)


def offset_first(sigmas, ms):  # ComfyUI offset_first_sigma_for_snr (percent_to_sigma(1e-4))
    s = [float(v) for v in sigmas]
    if ms.flow and len(s) > 1 and s[0] >= 1:
        s[0] = ms.shift_of(1.0 - 1e-4)
    return s


def anc(s, sn, eta):  # k-diffusion get_ancestral_step
    if not eta:
        return sn, 0.0
    up = min(sn, eta * (sn ** 2 * (s ** 2 - sn ** 2) / s ** 2) ** 0.5)
    return (sn ** 2 - up ** 2) ** 0.5, up


def anc_flow(s, sn, eta):  # sd.cpp get_ancestral_step_flow (= ComfyUI _RF renoise): down, up, alpha_scale
    if eta <= 0 or s <= 0 or sn <= 0:
        return sn, 0.0, 1.0
    eta = min(eta, 1.0)
    down = min(max(sn * (1 + (sn / s - 1) * eta), 0.0), sn)
    if 1 - down <= 0:
        return sn, 0.0, 1.0
    a = (1 - sn) / (1 - down)
    term = min(max((down / sn) * a, -1.0), 1.0)
    return down, sn * math.sqrt(max(1 - term * term, 0.0)), a


def t_euler_a_rf(den, x, sig, cb, eta, ns):  # ComfyUI sample_euler_ancestral_RF
    for i in range(len(sig) - 1):
        s, sn = sig[i], sig[i + 1]
        d_ = den(x, s)
        cb(x)
        if sn == 0:
            x = d_
        else:
            down = sn * (1 + (sn / s - 1) * eta)
            a_n, a_d = 1 - sn, 1 - down
            renoise = (sn ** 2 - down ** 2 * a_n ** 2 / a_d ** 2) ** 0.5
            r = down / s
            x = r * x + (1 - r) * d_
            if eta > 0:
                x = (a_n / a_d) * x + ns(s, sn) * renoise
    return x


def t_dpm2_a_rf(den, x, sig, cb, eta, ns):  # ComfyUI sample_dpm_2_ancestral_RF
    for i in range(len(sig) - 1):
        s, sn = sig[i], sig[i + 1]
        d_ = den(x, s)
        down = sn * (1 + (sn / s - 1) * eta)
        a_n, a_d = 1 - sn, 1 - down
        renoise = max(sn ** 2 - down ** 2 * a_n ** 2 / a_d ** 2, 0.0) ** 0.5
        cb(x)
        d = (x - d_) / s
        if down == 0:
            x = x + d * (down - s)
        else:
            mid = math.exp(math.log(s) + 0.5 * (math.log(down) - math.log(s)))
            x2 = x + d * (mid - s)
            d2 = (x2 - den(x2, mid)) / mid
            x = x + d2 * (down - s)
            x = (a_n / a_d) * x + ns(s, sn) * renoise
    return x


def t_dpmpp_sde(den, x, sig0, cb, eta, ns, ms, r=0.5):  # ComfyUI sample_dpmpp_sde
    sig = offset_first(sig0, ms)
    lam, sfn = lam_fn(ms), sig_of_lam(ms)
    for i in range(len(sig) - 1):
        s, sn = sig[i], sig[i + 1]
        d_ = den(x, s)
        cb(x)
        if sn == 0:
            x = d_
            continue
        ls, lt = lam(s), lam(sn)
        h = lt - ls
        ls1 = ls + r * h
        fac = 1 / (2 * r)
        s1 = sfn(ls1)
        a_s, a_s1, a_t = s * math.exp(ls), s1 * math.exp(ls1), sn * math.exp(lt)
        sd, su = anc(math.exp(-ls), math.exp(-ls1), eta)
        h_ = -math.log(sd) - ls
        x2 = (a_s1 / a_s) * math.exp(-h_) * x - a_s1 * math.expm1(-h_) * d_
        if eta > 0:
            x2 = x2 + a_s1 * ns(s, s1) * su
        d2 = den(x2, s1)
        sd, su = anc(math.exp(-ls), math.exp(-lt), eta)
        h_ = -math.log(sd) - ls
        dd = (1 - fac) * d_ + fac * d2
        x = (a_t / a_s) * math.exp(-h_) * x - a_t * math.expm1(-h_) * dd
        if eta > 0:
            x = x + a_t * ns(s, sn) * su
    return x


def t_dpmpp_2m_sde(den, x, sig0, cb, eta, ns, ms):  # ComfyUI sample_dpmpp_2m_sde (midpoint)
    sig = offset_first(sig0, ms)
    lam = lam_fn(ms)
    old, h_last = None, None
    h = None
    for i in range(len(sig) - 1):
        s, sn = sig[i], sig[i + 1]
        d_ = den(x, s)
        cb(x)
        if sn == 0:
            x = d_
        else:
            ls, lt = lam(s), lam(sn)
            h = lt - ls
            h_eta = h * (eta + 1)
            a_t = sn * math.exp(lt)
            x = sn / s * math.exp(-h * eta) * x + a_t * (-math.expm1(-h_eta)) * d_
            if old is not None:
                rr = h_last / h
                x = x + 0.5 * a_t * (-math.expm1(-h_eta)) * (1 / rr) * (d_ - old)
            if eta > 0:
                x = x + ns(s, sn) * sn * math.sqrt(-math.expm1(-2 * h * eta))
        old = d_
        h_last = h
    return x


def t_dpmpp_2m_v2(den, x, sig, cb):  # sd.cpp sample_dpmpp_2m_v2
    old = None
    for i in range(len(sig) - 1):
        s, sn = sig[i], sig[i + 1]
        d_ = den(x, s)
        cb(x)
        if sn == 0:
            x = d_
        else:
            t, tn = -math.log(s), -math.log(sn)
            h, a = tn - t, sn / s
            if i == 0:
                x = a * x - (math.exp(-h) - 1) * d_
            else:
                h_last = t + math.log(sig[i - 1])
                h_min, h_max = min(h_last, h), max(h_last, h)
                rr = h_max / h_min
                b = math.exp(-(h_max + h_min) / 2) - 1
                x = a * x - b * ((1 + 1 / (2 * rr)) * d_ - (1 / (2 * rr)) * old)
        old = d_
    return x


def t_lcm(den, x, sig, cb, ns, ms):  # ComfyUI sample_lcm (s_noise 1)
    for i in range(len(sig) - 1):
        d_ = den(x, sig[i])
        cb(x)
        x = d_
        sn = sig[i + 1]
        if sn > 0:
            z = ns(sig[i], sn)
            x = (1 - sn) * x + sn * z if ms.flow else x + sn * z  # model_sampling.noise_scaling
    return x


def t_ipndm(den, x, sig, cb, variable):  # ComfyUI sample_ipndm / sample_ipndm_v (max_order 4)
    buf = []
    for i in range(len(sig) - 1):
        tc, tn = sig[i], sig[i + 1]
        d_ = den(x, tc)
        cb(x)
        dc = (x - d_) / tc
        order = min(4, i + 1)
        if tn == 0:
            xn = d_
        elif order == 1:
            xn = x + (tn - tc) * dc
        elif not variable:
            if order == 2:
                xn = x + (tn - tc) * (3 * dc - buf[-1]) / 2
            elif order == 3:
                xn = x + (tn - tc) * (23 * dc - 16 * buf[-1] + 5 * buf[-2]) / 12
            else:
                xn = x + (tn - tc) * (55 * dc - 59 * buf[-1] + 37 * buf[-2] - 9 * buf[-3]) / 24
        else:
            hn, hn1 = tn - tc, tc - sig[i - 1]
            if order == 2:
                c1, c2 = (2 + hn / hn1) / 2, -(hn / hn1) / 2
                xn = x + (tn - tc) * (c1 * dc + c2 * buf[-1])
            elif order == 3:
                hn2 = sig[i - 1] - sig[i - 2]
                temp = (1 - hn / (3 * (hn + hn1)) * (hn * (hn + hn1)) / (hn1 * (hn1 + hn2))) / 2
                c1 = (2 + hn / hn1) / 2 + temp
                c2 = -(hn / hn1) / 2 - (1 + hn1 / hn2) * temp
                c3 = temp * hn1 / hn2
                xn = x + (tn - tc) * (c1 * dc + c2 * buf[-1] + c3 * buf[-2])
            else:
                hn2, hn3 = sig[i - 1] - sig[i - 2], sig[i - 2] - sig[i - 3]
                t1 = (1 - hn / (3 * (hn + hn1)) * (hn * (hn + hn1)) / (hn1 * (hn1 + hn2))) / 2
                t2 = ((1 - hn / (3 * (hn + hn1))) / 2 + (1 - hn / (2 * (hn + hn1))) * hn / (6 * (hn + hn1 + hn2))) \
                    * (hn * (hn + hn1) * (hn + hn1 + hn2)) / (hn1 * (hn1 + hn2) * (hn1 + hn2 + hn3))
                q = hn1 * (hn1 + hn2) / (hn2 * (hn2 + hn3))
                c1 = (2 + hn / hn1) / 2 + t1 + t2
                c2 = -(hn / hn1) / 2 - (1 + hn1 / hn2) * t1 - (1 + hn1 / hn2 + q) * t2
                c3 = t1 * hn1 / hn2 + (hn1 / hn2 + q * (1 + hn2 / hn3)) * t2
                c4 = -t2 * q * hn1 / hn2
                xn = x + (tn - tc) * (c1 * dc + c2 * buf[-1] + c3 * buf[-2] + c4 * buf[-3])
        if len(buf) == 3:
            buf = buf[1:]
        buf.append(dc)
        x = xn
    return x


def t_res_multistep(den, x, sig, cb, eta, ns, ms):  # ComfyUI res_multistep (ancestral noise on flow: sd.cpp)
    old, old_down = None, None
    for i in range(len(sig) - 1):
        s, sn = sig[i], sig[i + 1]
        d_ = den(x, s)
        down, up, ascale = anc_flow(s, sn, eta) if ms.flow else (*anc(s, sn, eta), 1.0)
        cb(x)
        if down == 0 or old is None:
            x = x + (x - d_) / s * (down - s)
        else:
            t, t_old, t_next, t_prev = -math.log(s), -math.log(old_down), -math.log(down), -math.log(sig[i - 1])
            h = t_next - t
            c2 = (t_prev - t_old) / h
            p1 = math.expm1(-h) / -h
            p2 = (p1 - 1) / -h
            b1, b2 = p1 - p2 / c2, p2 / c2
            x = math.exp(-h) * x + h * (b1 * d_ + b2 * old)
        if sn > 0:
            z = ns(s, sn)
            if ms.flow and up > 0:
                x = x * ascale
            x = x + z * up
        old, old_down = d_, down
    return x


def t_res_2s(den, x, sig, cb, eta, ns, ms):  # sd.cpp sample_res_2s
    def phi1(t):
        return 1 + t * 0.5 + t * t / 6 if abs(t) < 1e-6 else math.expm1(t) / t

    def phi2(t):
        return 0.5 + t / 6 + t * t / 24 if abs(t) < 1e-6 else (phi1(t) - 1) / t

    for i in range(len(sig) - 1):
        s, sn = sig[i], sig[i + 1]
        d_ = den(x, s)
        cb(x)
        down, up, ascale = anc_flow(s, sn, eta) if ms.flow else (*anc(s, sn, eta), 1.0)
        x0 = x
        if down == 0:
            x = d_
        else:
            c2 = 0.5
            t, tn = -math.log(s), -math.log(down)
            h = tn - t
            a21 = c2 * phi1(-h * c2)
            b2 = phi2(-h) / c2
            b1 = phi1(-h) - b2
            sc2 = math.exp(-(t + h * c2))
            e1 = d_ - x0
            x2 = x0 + e1 * (h * a21)
            e2 = den(x2, sc2) - x0
            x = x0 + h * (b1 * e1 + b2 * e2)
        if sn > 0 and up > 0:
            z = ns(s, sn)
            if ms.flow:
                x = x * ascale
            x = x + z * up
    return x


def t_er_sde(den, x, sig0, cb, eta, ns, ms):  # ComfyUI sample_er_sde (s_noise = eta, as sd.cpp maps --eta)
    sig = offset_first(sig0, ms)
    lam = lam_fn(ms)
    er = [math.exp(-lam(v)) if v > 0 else 0.0 for v in sig]

    def scaler(v):
        return v * (math.exp(v ** 0.3) + 10.0)

    old, old_d = None, None
    for i in range(len(sig) - 1):
        s, sn = sig[i], sig[i + 1]
        d_ = den(x, s)
        cb(x)
        stage = min(3, i + 1)
        if sn == 0:
            x = d_
        else:
            ls, lt = er[i], er[i + 1]
            a_s, a_t = s / ls, sn / lt
            r = scaler(lt) / scaler(ls)
            x = (a_t / a_s) * r * x + a_t * (1 - r) * d_
            if stage >= 2:
                dt = lt - ls
                step = -dt / 200.0
                pos = [lt + p * step for p in range(200)]
                S = sum(1 / scaler(v) for v in pos) * step
                dd = (d_ - old) / (ls - er[i - 1])
                x = x + a_t * (dt + S * scaler(lt)) * dd
                if stage >= 3:
                    Su = sum((v - ls) / scaler(v) for v in pos) * step
                    du = (dd - old_d) / ((ls - er[i - 2]) / 2)
                    x = x + a_t * ((dt ** 2) / 2 + Su * scaler(lt)) * du
                old_d = dd
            if eta > 0:
                q = lt ** 2 - ls ** 2 * r ** 2
                x = x + a_t * ns(s, sn) * eta * (math.sqrt(q) if q > 0 else 0.0)
        old = d_
    return x


def t_euler_cfg_pp(den, x, sig, cb, eta, ns, ms):  # ComfyUI sample_euler_ancestral_cfg_pp / sample_euler_cfg_pp
    for i in range(len(sig) - 1):
        s, sn = sig[i], sig[i + 1]
        d_, du = den.both(x, s, want_uncond=True)
        cb(x)
        if sn == 0:
            x = d_
            continue
        a_s, a_t = (1 - s, 1 - sn) if ms.flow else (1.0, 1.0)
        d = (x - a_s * du) / s
        down, up = anc(s / a_s if a_s else math.inf, sn / a_t, eta)  # torch: s / 0 = inf at flow sigma 1
        down = a_t * down
        x = a_t * d_ + down * d
        if eta > 0:
            x = x + a_t * ns(s, sn) * up
    return x


# ---------------------------------------------------------------------------------------------------------
# diffusers scheduler runs (VP samples; returned in easel's form)


# ---------------------------------------------------------------------------------------------------------
# cases

SHAPE_ANALYTIC = (1, 4, 4, 4)
STEPS = 8


def karras(ms, n):
    return [float(v) for v in KD.get_sigmas_karras(n, ms.sigma_min, ms.sigma_max)]


def flow_pipeline_sigmas(ms, n):
    base = np.linspace(1.0, 1.0 / n, n).astype(np.float32)
    return [float(np.float32(ms.shift_of(float(b)))) for b in base] + [0.0]


class Out:
    def __init__(self):
        self.tensors = {}
        self.schedules = []
        self.samplers = []

    def add(self, name, t):
        assert name not in self.tensors, name
        self.tensors[name] = t.detach().to(torch.float32).contiguous().reshape(-1).clone()


def as_f32_start(x):
    return x.to(torch.float32).to(F64)


def kd_case(out, name, model, ms, net, cfg, sampler, sigmas, seed, eta, reference, shape=SHAPE_ANALYTIC):
    """One sampler case run by a k-diffusion function or a transcription over sigmas (float64)."""
    den = Denoiser(ms, net, cfg)
    g = torch.Generator().manual_seed(seed)
    noise0 = torch.randn(shape, generator=g, dtype=torch.float32)
    x = as_f32_start(noise0.to(F64) * sigmas[0])
    x_init = x.clone()
    ns = NoiseSampler(seed + 1000, shape, F64)
    xs = []
    sig_t = torch.tensor(sigmas, dtype=F64)

    def cb(d):
        xs.append((d["x"] if isinstance(d, dict) else d).clone())

    kd = dict(callback=cb, disable=True)
    fl = ms.flow
    if sampler == "euler":
        x = KD.sample_euler(den, x, sig_t, **kd)
    elif sampler == "euler_a":
        x = t_euler_a_rf(den, x, sigmas, cb, eta, ns) if fl else KD.sample_euler_ancestral(den, x, sig_t, eta=eta, noise_sampler=ns, **kd)
    elif sampler == "heun":
        x = KD.sample_heun(den, x, sig_t, **kd)
    elif sampler == "dpm2":
        x = KD.sample_dpm_2(den, x, sig_t, **kd)
    elif sampler == "dpm2_a":
        x = t_dpm2_a_rf(den, x, sigmas, cb, eta, ns) if fl else KD.sample_dpm_2_ancestral(den, x, sig_t, eta=eta, noise_sampler=ns, **kd)
    elif sampler == "lms":
        x = KD.sample_lms(den, x, sig_t, **kd)
    elif sampler in ("dpm++2s_a", "dpm++2s"):
        x = KD.sample_dpmpp_2s_ancestral(den, x, sig_t, eta=eta, noise_sampler=ns, **kd)
    elif sampler == "dpm++_sde":
        x = t_dpmpp_sde(den, x, sigmas, cb, eta, ns, ms) if fl else KD.sample_dpmpp_sde(den, x, sig_t, eta=eta, noise_sampler=ns, **kd)
    elif sampler == "dpm++2m":
        x = KD.sample_dpmpp_2m(den, x, sig_t, **kd)
    elif sampler in ("dpm++2m_sde", "dpm++2m_sde_bt"):
        x = t_dpmpp_2m_sde(den, x, sigmas, cb, eta, ns, ms) if fl else KD.sample_dpmpp_2m_sde(den, x, sig_t, eta=eta, noise_sampler=ns, **kd)
    elif sampler == "dpm++2mv2":
        x = t_dpmpp_2m_v2(den, x, sigmas, cb)
    elif sampler == "lcm":
        x = t_lcm(den, x, sigmas, cb, ns, ms)
    elif sampler in ("ipndm", "ipndm_v"):
        x = t_ipndm(den, x, sigmas, cb, sampler == "ipndm_v")
    elif sampler == "res_multistep":
        x = t_res_multistep(den, x, sigmas, cb, eta, ns, ms)
    elif sampler == "res_2s":
        x = t_res_2s(den, x, sigmas, cb, eta, ns, ms)
    elif sampler == "er_sde":
        x = t_er_sde(den, x, sigmas, cb, eta, ns, ms)
    elif sampler in ("euler_cfg_pp", "euler_a_cfg_pp"):
        x = t_euler_cfg_pp(den, x, sigmas, cb, eta if sampler == "euler_a_cfg_pp" else 0.0, ns, ms)
    else:
        raise ValueError(sampler)
    xs.append(x)
    x_steps = torch.stack(xs[1:])
    assert len(x_steps) == len(sigmas) - 1, (name, len(x_steps))
    record(out, name, model, ms, sampler, sigmas, [ms.sigma_to_t(s) for s in sigmas[:-1]], cfg, eta, x_init, x_steps, ns,
           den, net, reference, shape)


def record(out, name, model, ms, sampler, sigmas, timesteps, cfg, eta, x_init, x_steps, ns, den, net, reference, shape):
    out.add(name + ".x_init", x_init)
    out.add(name + ".x_steps", x_steps)
    case = {"name": name, "model": model, "sampler": sampler, "cfg_scale": cfg, "eta": eta, "shape": list(shape),
            "sigmas": [float(s) for s in sigmas], "timesteps": [float(t) for t in timesteps],
            "noise_calls": ns.calls if ns is not None else [], "evals": [list(e) for e in den.evals],
            "reference": reference, "replay": isinstance(net, RecordingNet)}
    if ns is not None and ns.draws:
        out.add(name + ".noise", torch.stack(ns.draws))
    if isinstance(net, RecordingNet):
        out.add(name + ".f_cond", torch.stack([r[1] for r in net.records]))
        out.add(name + ".f_uncond", torch.stack([r[2] for r in net.records]))
        net.records.clear()
    out.samplers.append(case)


def diffusers_case(out, name, model, ms, net, cfg, sampler, n, seed, eta, shape=SHAPE_ANALYTIC, karras_sigmas=False):
    """uni_pc, deis, ddim, ddim_trailing, tcd, dpm++2m (flow) by diffusers' schedulers."""
    from diffusers import (DDIMScheduler, DEISMultistepScheduler, DPMSolverMultistepScheduler, TCDScheduler,
                           UniPCMultistepScheduler)
    from diffusers.schedulers import scheduling_tcd

    base = dict(num_train_timesteps=1000)
    zsnr = not ms.flow and ms.zsnr
    if not ms.flow:
        base.update(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                    prediction_type="v_prediction" if ms.prediction == "v" else "epsilon")
        if zsnr:
            base["rescale_betas_zero_snr"] = True
    den = Denoiser(ms, net, cfg)
    ns = NoiseSampler(seed + 1000, shape, torch.float32)
    tcd = False
    if sampler == "uni_pc":
        if ms.flow:
            sched = UniPCMultistepScheduler(num_train_timesteps=1000, use_flow_sigmas=True, flow_shift=ms.shift,
                                            prediction_type="flow_prediction")
        else:
            sched = UniPCMultistepScheduler(**base, use_karras_sigmas=karras_sigmas)
        reference = "diffusers UniPCMultistepScheduler (bh2, order 2)"
    elif sampler == "deis":
        if ms.flow:
            sched = DEISMultistepScheduler(num_train_timesteps=1000, use_flow_sigmas=True, flow_shift=ms.shift,
                                           prediction_type="flow_prediction")
        elif zsnr:
            # DEISMultistepScheduler has no rescale_betas_zero_snr: the rescaled betas given as trained_betas
            from diffusers.schedulers.scheduling_euler_discrete import rescale_zero_terminal_snr

            betas = torch.linspace(0.00085 ** 0.5, 0.012 ** 0.5, 1000, dtype=torch.float32) ** 2
            b = {k: v for k, v in base.items() if k != "rescale_betas_zero_snr"}
            sched = DEISMultistepScheduler(**b, trained_betas=rescale_zero_terminal_snr(betas).tolist(),
                                           use_karras_sigmas=karras_sigmas)
        else:
            sched = DEISMultistepScheduler(**base, use_karras_sigmas=karras_sigmas)
        reference = "diffusers DEISMultistepScheduler (order 2)"
    elif sampler == "dpm++2m":
        sched = DPMSolverMultistepScheduler(num_train_timesteps=1000, use_flow_sigmas=True, flow_shift=ms.shift,
                                            prediction_type="flow_prediction", algorithm_type="dpmsolver++",
                                            solver_order=2, final_sigmas_type="zero")
        reference = "diffusers DPMSolverMultistepScheduler (use_flow_sigmas)"
    elif sampler in ("ddim", "ddim_trailing"):
        sched = DDIMScheduler(**base, set_alpha_to_one=False, steps_offset=1, clip_sample=False,
                              timestep_spacing="leading" if sampler == "ddim" else "trailing")
        reference = "diffusers DDIMScheduler (" + ("leading" if sampler == "ddim" else "trailing") + ")"
    elif sampler == "tcd":
        sched = TCDScheduler(**base, set_alpha_to_one=False, steps_offset=1, clip_sample=False)
        reference = "diffusers TCDScheduler"
        tcd = True
    else:
        raise ValueError(sampler)
    if zsnr:
        # alphas_cumprod[-1] = 2**-24 as EulerDiscrete / UniPC / DPMSolver set it (DDIM, TCD and DEIS keep 0,
        # an infinite sigma): the table easel's zero-terminal-SNR model uses
        sched.alphas_cumprod[-1] = 2 ** -24
    sched.set_timesteps(n)
    table = [float(v) for v in ms.table]
    ts = [float(t) for t in sched.timesteps]
    is_ddim = sampler in ("ddim", "ddim_trailing")
    if is_ddim or tcd:
        ratio = 1000 // n
        sig = [table[int(t)] for t in ts]
        if is_ddim:
            prev = int(ts[-1]) - ratio
            sig.append(table[prev] if prev >= 0 else table[0])
        else:
            sig.append(0.0)  # TCD's last step lands on the VP sample at t = 0 (alpha_prev = 1 in easel's terms)
    else:
        sig = [float(s) for s in sched.sigmas]
    # patch TCD's noise draw to record it
    orig_randn = scheduling_tcd.randn_tensor
    step_i = [0]
    if tcd:
        def rec_randn(shape_, generator=None, device=None, dtype=None, **k):
            return ns(sig[step_i[0]], sig[step_i[0] + 1]).to(dtype or torch.float32)
        scheduling_tcd.randn_tensor = rec_randn
    g = torch.Generator().manual_seed(seed)
    noise0 = torch.randn(shape, generator=g, dtype=torch.float32)
    lat = noise0 * sched.init_noise_sigma
    alpha = (lambda s: 1.0) if ms.flow else (lambda s: 1.0 / math.sqrt(s * s + 1.0))
    x_init = lat.to(F64) / alpha(sig[0])
    xs = []
    try:
        for i, t in enumerate(sched.timesteps):
            step_i[0] = i
            tt = float(t)
            den.evals.append((sig[i], tt))
            x_in = lat.to(F64)
            fc = net(x_in, tt, "cond")
            fu = net(x_in, tt, "uncond")
            mo = (fu + cfg * (fc - fu)).to(torch.float32)
            kw = {}
            if is_ddim:
                kw["eta"] = eta
                if eta > 0:
                    kw["variance_noise"] = ns(sig[i], sig[i + 1])
            if tcd:
                kw["eta"] = eta
            lat = sched.step(mo, t, lat, **kw).prev_sample
            xs.append(lat.to(F64) / alpha(sig[i + 1]))
    finally:
        scheduling_tcd.randn_tensor = orig_randn
    record(out, name, model, ms, sampler, sig, ts, cfg, eta, x_init, torch.stack(xs), ns, den, net, reference, shape)


# sampler -> default eta (easel's) and whether it has a flow form / comes from diffusers
SAMPLERS = [
    ("euler", 0.0, True), ("euler_a", 1.0, True), ("heun", 0.0, True), ("dpm2", 0.0, True), ("dpm2_a", 1.0, True),
    ("lms", 0.0, True), ("dpm++2s_a", 1.0, False), ("dpm++2s", 0.0, False), ("dpm++_sde", 1.0, True),
    ("dpm++2m", 0.0, True), ("dpm++2m_sde", 1.0, True), ("dpm++2m_sde_bt", 1.0, True), ("dpm++2mv2", 0.0, True),
    ("lcm", 0.0, True), ("ipndm", 0.0, True), ("ipndm_v", 0.0, True), ("res_multistep", 0.0, True),
    ("res_2s", 0.0, True), ("er_sde", 1.0, True), ("euler_cfg_pp", 0.0, True), ("euler_a_cfg_pp", 1.0, True),
    ("uni_pc", 0.0, True), ("deis", 0.0, True), ("ddim", 0.0, False), ("ddim_trailing", 0.0, False), ("tcd", 0.0, False),
]
DIFFUSERS = {"uni_pc", "deis", "ddim", "ddim_trailing", "tcd"}
KREF = {"euler": "k-diffusion sample_euler", "euler_a": "k-diffusion sample_euler_ancestral",
        "heun": "k-diffusion sample_heun", "dpm2": "k-diffusion sample_dpm_2",
        "dpm2_a": "k-diffusion sample_dpm_2_ancestral", "lms": "k-diffusion sample_lms",
        "dpm++2s_a": "k-diffusion sample_dpmpp_2s_ancestral", "dpm++2s": "k-diffusion sample_dpmpp_2s_ancestral eta 0",
        "dpm++_sde": "k-diffusion sample_dpmpp_sde", "dpm++2m": "k-diffusion sample_dpmpp_2m",
        "dpm++2m_sde": "k-diffusion sample_dpmpp_2m_sde", "dpm++2m_sde_bt": "k-diffusion sample_dpmpp_2m_sde",
        "dpm++2mv2": "sd.cpp sample_dpmpp_2m_v2 (transcribed)", "lcm": "ComfyUI sample_lcm (transcribed)",
        "ipndm": "ComfyUI sample_ipndm (transcribed)", "ipndm_v": "ComfyUI sample_ipndm_v (transcribed)",
        "res_multistep": "ComfyUI res_multistep (transcribed)", "res_2s": "sd.cpp sample_res_2s (transcribed)",
        "er_sde": "ComfyUI sample_er_sde (transcribed)", "euler_cfg_pp": "ComfyUI sample_euler_cfg_pp (transcribed)",
        "euler_a_cfg_pp": "ComfyUI sample_euler_ancestral_cfg_pp (transcribed)"}
FLOW_REF = {"euler_a": "ComfyUI sample_euler_ancestral_RF (transcribed)",
            "dpm2_a": "ComfyUI sample_dpm_2_ancestral_RF (transcribed)",
            "dpm++_sde": "ComfyUI sample_dpmpp_sde, CONST (transcribed)",
            "dpm++2m_sde": "ComfyUI sample_dpmpp_2m_sde, CONST (transcribed)",
            "dpm++2m_sde_bt": "ComfyUI sample_dpmpp_2m_sde, CONST (transcribed)"}


def sampler_cases(out, model, ms, net, cfg, n, shape, seed0, only=None, extras=True):
    for k, (sampler, eta, has_flow) in enumerate(SAMPLERS):
        if only is not None and sampler not in only:
            continue
        if ms.flow and not has_flow:
            continue
        name = f"{model}.{sampler}"
        seed = seed0 + k
        if sampler in DIFFUSERS or (ms.flow and sampler == "dpm++2m"):
            diffusers_case(out, name, model, ms, net, cfg, sampler, n, seed, eta, shape)
            continue
        if sampler == "lcm" and not ms.flow:
            sig = lcm_sigmas(ms, n)
        else:
            sig = flow_pipeline_sigmas(ms, n) if ms.flow else karras(ms, n)
        ref = FLOW_REF.get(sampler, KREF[sampler]) if ms.flow else KREF[sampler]
        kd_case(out, name, model, ms, net, cfg, sampler, sig, seed, eta, ref, shape)
    # extra settings: eta given (0 for an ancestral method, > 0 for DDIM / TCD / res_multistep), karras for uni_pc / deis
    if extras:
        extra = [("euler_a.eta0", "euler_a", 0.0), ("dpm++2m_sde.eta05", "dpm++2m_sde", 0.5)]
        if not ms.flow:
            extra += [("res_multistep.eta1", "res_multistep", 1.0), ("dpm++_sde.eta05", "dpm++_sde", 0.5)]
        for tag, sampler, eta in extra:
            sig = flow_pipeline_sigmas(ms, n) if ms.flow else karras(ms, n)
            kd_case(out, f"{model}.{tag}", model, ms, net, cfg, sampler, sig, seed0 + 97 + len(tag), eta,
                    (FLOW_REF.get(sampler, KREF[sampler]) if ms.flow else KREF[sampler]), shape)
        if not ms.flow:
            diffusers_case(out, f"{model}.ddim.eta05", model, ms, net, cfg, "ddim", n, seed0 + 60, 0.5, shape)
            diffusers_case(out, f"{model}.tcd.eta03", model, ms, net, cfg, "tcd", n, seed0 + 61, 0.3, shape)
            diffusers_case(out, f"{model}.uni_pc.karras", model, ms, net, cfg, "uni_pc", n, seed0 + 62, 0.0, shape,
                           karras_sigmas=True)
            diffusers_case(out, f"{model}.deis.karras", model, ms, net, cfg, "deis", n, seed0 + 63, 0.0, shape,
                           karras_sigmas=True)
            diffusers_case(out, f"{model}.uni_pc.15", model, ms, net, cfg, "uni_pc", 15, seed0 + 64, 0.0, shape)
            diffusers_case(out, f"{model}.deis.15", model, ms, net, cfg, "deis", 15, seed0 + 65, 0.0, shape)


# ---------------------------------------------------------------------------------------------------------
# schedules


def lcm_timesteps(n):
    from diffusers import LCMScheduler

    s = LCMScheduler(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                     original_inference_steps=50)
    s.set_timesteps(n)
    return [int(t) for t in s.timesteps]


def lcm_sigmas(ms, n):
    return [float(ms.table[t]) for t in lcm_timesteps(n)] + [0.0]


def loglinear_interp(t_steps, num_steps):  # ComfyUI nodes_align_your_steps.loglinear_interp
    xs = np.linspace(0, 1, len(t_steps))
    ys = np.log(t_steps[::-1])
    new_xs = np.linspace(0, 1, num_steps)
    new_ys = np.interp(new_xs, xs, ys)
    return np.exp(new_ys)[::-1].copy()


AYS = {"SD1": [14.6146412293, 6.4745760956, 3.8636745985, 2.6946151520, 1.8841921177, 1.3943805092, 0.9642583904,
               0.6523686016, 0.3977456272, 0.1515232662, 0.0291671582]}
GITS_20 = [14.61464119, 7.49001646, 4.65472794, 3.07277966, 2.19988537, 1.61558151, 1.24153244, 0.95350921, 0.74807048,
           0.59516323, 0.50118381, 0.41087446, 0.34370604, 0.29807833, 0.25053367, 0.22545385, 0.19894916, 0.17026083,
           0.13792117, 0.09824532, 0.02916753]
GITS_8 = [14.61464119, 5.85520077, 2.45070267, 1.36964464, 0.80330700, 0.45573691, 0.25053367, 0.09824532, 0.02916753]


def schedule_sigmas(ms, kind, n):
    """The reference sigmas of a scheduler (float32 values), or None where it does not apply."""
    table = ms.table
    T = 1000
    f32 = lambda v: [float(np.float32(x)) for x in v]  # noqa: E731
    if kind == "discrete":
        if ms.flow:
            return None
        from diffusers import EulerDiscreteScheduler

        s = EulerDiscreteScheduler(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012,
                                   beta_schedule="scaled_linear", rescale_betas_zero_snr=ms.zsnr)
        s.set_timesteps(n)
        return [float(v) for v in s.sigmas]
    if kind == "karras":
        return [float(v) for v in KD.get_sigmas_karras(n, ms.sigma_min, ms.sigma_max)]
    if kind == "exponential":
        return [float(v) for v in KD.get_sigmas_exponential(n, ms.sigma_min, ms.sigma_max)]
    if kind == "sgm_uniform":  # ComfyUI normal_scheduler(sgm=True); model_sampling.timestep = nearest t
        start = T - 1 if not ms.flow else ms.sigma_max * T
        end = 0 if not ms.flow else ms.sigma_min * T
        ts = torch.linspace(start, end, n + 1)[:-1]
        return f32([ms.t_to_sigma(float(t)) for t in ts] + [0.0])
    if kind == "simple":  # ComfyUI simple_scheduler
        ss = len(table) / n
        return f32([float(table[-(1 + int(x * ss))]) for x in range(n)] + [0.0])
    if kind == "ays":
        if ms.flow:
            return None
        lv = AYS["SD1"][:]
        if n + 1 != len(lv):
            lv = list(loglinear_interp(lv, n + 1))
        lv[-1] = 0.0
        return f32(lv)
    if kind == "gits":
        if ms.flow:
            return None
        lv = (GITS_8[:] if n == 8 else list(loglinear_interp(GITS_20, n + 1)) if n > 20 else None)
        if lv is None:
            return None
        lv[-1] = 0.0
        return f32(lv)
    if kind == "kl_optimal":  # ComfyUI kl_optimal_scheduler
        adj = torch.arange(n, dtype=torch.float).div_(n - 1)
        sig = adj.new_zeros(n + 1)
        sig[:-1] = (adj * math.atan(ms.sigma_min) + (1 - adj) * math.atan(ms.sigma_max)).tan_()
        return [float(v) for v in sig]
    if kind == "beta":  # ComfyUI beta_scheduler
        import scipy.stats

        ts = 1 - np.linspace(0, 1, n, endpoint=False)
        ts = np.rint(scipy.stats.beta.ppf(ts, 0.6, 0.6) * (len(table) - 1))
        sigs, last = [], -1
        for t in ts:
            if t != last:
                sigs.append(float(table[int(t)]))
            last = t
        return f32(sigs + [0.0])
    if kind == "smoothstep":  # sd.cpp SmoothStepScheduler (float; t_to_sigma of an integer t is table[t])
        out = []
        for i in range(n):
            u = np.float32(1.0) - np.float32(i) / np.float32(n)
            sm = u * u * (np.float32(3.0) - np.float32(2.0) * u)
            out.append(float(table[int(math.floor(float(sm * np.float32(T - 1)) + 0.5))]))  # std::round
        return f32(out + [0.0])
    if kind == "ddim_uniform":  # ComfyUI ddim_scheduler
        ss = max(len(table) // n, 1)
        sigs, x = [], 1
        while x < len(table):
            sigs.append(float(table[x]))
            x += ss
        return f32(sigs[::-1] + [0.0])
    if kind == "lcm":
        return None if ms.flow else f32(lcm_sigmas(ms, n))
    raise ValueError(kind)


SCHEDULE_REFS = {"discrete": "diffusers EulerDiscreteScheduler (linspace)", "karras": "k-diffusion get_sigmas_karras",
                 "exponential": "k-diffusion get_sigmas_exponential",
                 "sgm_uniform": "ComfyUI normal_scheduler(sgm=True) (transcribed)",
                 "simple": "ComfyUI simple_scheduler (transcribed)",
                 "ays": "ComfyUI AlignYourStepsScheduler SD1 (transcribed)",
                 "gits": "ComfyUI GITSScheduler coeff 1.20 (transcribed)",
                 "kl_optimal": "ComfyUI kl_optimal_scheduler (transcribed)",
                 "beta": "ComfyUI beta_scheduler 0.6/0.6 with scipy.stats.beta.ppf (transcribed)",
                 "smoothstep": "sd.cpp SmoothStepScheduler (transcribed)",
                 "ddim_uniform": "ComfyUI ddim_scheduler (transcribed)", "lcm": "diffusers LCMScheduler timesteps"}


def schedule_cases(out, models):
    for model, ms in models:
        for kind in SCHEDULE_REFS:
            for n in (8, 10, 25):
                sig = schedule_sigmas(ms, kind, n)
                if sig is None:
                    continue
                out.schedules.append({"name": f"{model}.{kind}.{n}", "model": model, "scheduler": kind, "steps": n,
                                      "sigmas": sig, "reference": SCHEDULE_REFS[kind]})
        if not ms.flow:
            from diffusers import DDIMScheduler

            for n in (8, 10, 25):
                s = DDIMScheduler(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012,
                                  beta_schedule="scaled_linear", set_alpha_to_one=False, steps_offset=1,
                                  timestep_spacing="leading", rescale_betas_zero_snr=ms.zsnr)
                s.set_timesteps(n)
                ts = [int(t) for t in s.timesteps]
                prev = ts[-1] - 1000 // n
                sig = [float(ms.table[t]) for t in ts] + [float(ms.table[prev if prev >= 0 else 0])]
                out.schedules.append({"name": f"{model}.ddim.{n}", "model": model, "scheduler": "ddim", "steps": n,
                                      "sigmas": sig, "timesteps": [float(t) for t in ts],
                                      "reference": "diffusers DDIMScheduler (leading, steps_offset 1)"})
            for n in (4, 8):
                out.schedules.append({"name": f"{model}.lcm_t.{n}", "model": model, "scheduler": "lcm", "steps": n,
                                      "sigmas": lcm_sigmas(ms, n), "timesteps": [float(t) for t in lcm_timesteps(n)],
                                      "reference": "diffusers LCMScheduler timesteps (original 50)"})


# ---------------------------------------------------------------------------------------------------------


def main():
    global KD
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--kdiff", default=os.path.join(ROOT, ".kdiff"), help="k-diffusion source (the folder holding k_diffusion/)")
    ap.add_argument("--diffusers", default=os.path.join(ROOT, ".diffusers"), help="diffusers source (the folder holding diffusers/)")
    ap.add_argument("--demo", default=os.path.join(ROOT, "models", "demo", "easel-demo-shapes.safetensors"))
    ap.add_argument("--zimage", default=os.path.join(ROOT, "tests", "data", "reference", "zimage_tiny", "diffusers", "transformer"))
    ap.add_argument("--no-models", action="store_true", help="analytic cases only (no demo model / Z-Image)")
    a = ap.parse_args()
    for p in (a.diffusers, os.path.join(a.diffusers, "src")):
        if os.path.isdir(os.path.join(p, "diffusers")):
            sys.path.insert(0, p)
    kd_root = a.kdiff if os.path.isdir(os.path.join(a.kdiff, "k_diffusion")) else os.path.join(a.kdiff, "src")
    KD = load_kdiffusion(kd_root)
    import diffusers
    from safetensors.torch import save_file

    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
    os.makedirs(a.out, exist_ok=True)
    out = Out()
    eps, v, vz, flow = DiscreteMS("eps"), DiscreteMS("v"), DiscreteMS("v", zsnr=True), FlowMS(3.0)
    schedule_cases(out, [("sd15", eps), ("zsnr", vz), ("flow3", flow)])
    an = AnalyticNet()
    sampler_cases(out, "eps", eps, an, 3.0, STEPS, SHAPE_ANALYTIC, 100)
    sampler_cases(out, "v", v, an, 3.0, STEPS, SHAPE_ANALYTIC, 200)
    sampler_cases(out, "flow", flow, an, 3.0, STEPS, SHAPE_ANALYTIC, 300)
    if not a.no_models:
        sampler_cases(out, "demo", vz, RecordingNet(demo_net(a.demo)), 5.0, STEPS, (1, 4, 4, 4), 400, extras=False)
        sampler_cases(out, "zimage", flow, RecordingNet(zimage_net(a.zimage)), 3.0, 6, (1, 16, 4, 4), 500, extras=False)
    meta = {"version": 1, "torch": torch.__version__, "diffusers": diffusers.__version__,
            "analytic": "F_cond = 0.5 tanh(x_in) + 0.1 t/1000 + 0.05 sin(i); F_uncond = 0.4 tanh(x_in) - 0.05 t/1000 + 0.03 cos(i)",
            "models": {"eps": "SD1.5 table, eps", "v": "SD1.5 table, v", "flow": "flow shift 3",
                       "demo": "easel-demo-shapes (v, zero terminal SNR), replayed", "zimage": "zimage_tiny transformer (flow shift 3), replayed"},
            "schedules": out.schedules, "samplers": out.samplers}
    with open(os.path.join(a.out, "samplers.json"), "w") as f:
        json.dump(meta, f, separators=(",", ":"))
    save_file(out.tensors, os.path.join(a.out, "samplers.safetensors"))
    size = sum(t.numel() * 4 for t in out.tensors.values())
    print(f"{len(out.schedules)} schedules, {len(out.samplers)} sampler cases, {size / 1e6:.2f} MB of tensors")


if __name__ == "__main__":
    main()
