"""The ComfyUI / sd.cpp transcriptions of sampler_refs.py run on one scalar latent with plain Python
floats (no torch: runs anywhere), for tests/unit/sampling_methods_test.cpp (SamplingTranscriptions).

    python3 tools/reference/sampler_refs_scalar.py          # prints the C++ table

Model: eps (sigmas 14.6 ... 0) or flow (shift 3, sigmas 1 ... 0) with F_cond = 0.5 tanh(x_in) + 0.05,
F_uncond = 0.4 tanh(x_in) + 0.03 (no timestep), CFG 3; x = 1.3 sigma_0; noise z_k = sin(k) for the k-th draw.
"""

import math
import os
import sys
import types

for _name in ("torch", "numpy"):  # sampler_refs imports them; the transcriptions use plain floats only
    if _name not in sys.modules:
        _m = types.ModuleType(_name)
        _m.float64, _m.float32 = "f64", "f32"
        sys.modules[_name] = _m
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sampler_refs as R  # noqa: E402


class VE:
    flow = False

    def scalings(self, s):
        return 1.0, -s, 1.0 / math.sqrt(s * s + 1)


class FL:
    flow = True
    shift = 3.0

    def shift_of(self, s):
        return self.shift * s / (1 + (self.shift - 1) * s)

    def scalings(self, s):
        return 1.0, -s, 1.0


class Den:
    def __init__(self, ms, cfg=3.0):
        self.ms, self.cfg = ms, cfg

    def both(self, x, s, t=None, want_uncond=False):
        c_skip, c_out, c_in = self.ms.scalings(s)
        xi = x * c_in
        fc = 0.5 * math.tanh(xi) + 0.05
        fu = 0.4 * math.tanh(xi) + 0.03
        f = fu + self.cfg * (fc - fu)
        return c_skip * x + c_out * f, c_skip * x + c_out * fu

    def __call__(self, x, s):
        return self.both(x, s)[0]


class NS:
    def __init__(self):
        self.k = 0

    def __call__(self, a, b):
        self.k += 1
        return math.sin(self.k)


VE_SIG = [14.6, 6.1, 2.9, 1.4, 0.7, 0.31, 0.12, 0.03, 0.0]
FL_SIG = [1.0, 0.94, 0.85, 0.72, 0.55, 0.36, 0.17, 0.05, 0.0]

CASES = [  # easel name, flow, eta, run
    ("euler_a", True, 1.0, lambda d, x, s, cb: R.t_euler_a_rf(d, x, s, cb, 1.0, NS())),
    ("dpm2_a", True, 1.0, lambda d, x, s, cb: R.t_dpm2_a_rf(d, x, s, cb, 1.0, NS())),
    ("dpm++_sde", False, 1.0, lambda d, x, s, cb: R.t_dpmpp_sde(d, x, s, cb, 1.0, NS(), VE())),
    ("dpm++_sde", True, 1.0, lambda d, x, s, cb: R.t_dpmpp_sde(d, x, s, cb, 1.0, NS(), FL())),
    ("dpm++2m_sde", False, 1.0, lambda d, x, s, cb: R.t_dpmpp_2m_sde(d, x, s, cb, 1.0, NS(), VE())),
    ("dpm++2m_sde", True, 1.0, lambda d, x, s, cb: R.t_dpmpp_2m_sde(d, x, s, cb, 1.0, NS(), FL())),
    ("dpm++2mv2", False, 0.0, lambda d, x, s, cb: R.t_dpmpp_2m_v2(d, x, s, cb)),
    ("dpm++2mv2", True, 0.0, lambda d, x, s, cb: R.t_dpmpp_2m_v2(d, x, s, cb)),
    ("lcm", False, 0.0, lambda d, x, s, cb: R.t_lcm(d, x, s, cb, NS(), VE())),
    ("lcm", True, 0.0, lambda d, x, s, cb: R.t_lcm(d, x, s, cb, NS(), FL())),
    ("ipndm", False, 0.0, lambda d, x, s, cb: R.t_ipndm(d, x, s, cb, False)),
    ("ipndm_v", False, 0.0, lambda d, x, s, cb: R.t_ipndm(d, x, s, cb, True)),
    ("ipndm_v", True, 0.0, lambda d, x, s, cb: R.t_ipndm(d, x, s, cb, True)),
    ("res_multistep", False, 0.0, lambda d, x, s, cb: R.t_res_multistep(d, x, s, cb, 0.0, NS(), VE())),
    ("res_multistep", True, 0.0, lambda d, x, s, cb: R.t_res_multistep(d, x, s, cb, 0.0, NS(), FL())),
    ("res_multistep", False, 1.0, lambda d, x, s, cb: R.t_res_multistep(d, x, s, cb, 1.0, NS(), VE())),
    ("res_multistep", True, 1.0, lambda d, x, s, cb: R.t_res_multistep(d, x, s, cb, 1.0, NS(), FL())),
    ("res_2s", False, 0.0, lambda d, x, s, cb: R.t_res_2s(d, x, s, cb, 0.0, NS(), VE())),
    ("res_2s", True, 1.0, lambda d, x, s, cb: R.t_res_2s(d, x, s, cb, 1.0, NS(), FL())),
    ("er_sde", False, 1.0, lambda d, x, s, cb: R.t_er_sde(d, x, s, cb, 1.0, NS(), VE())),
    ("er_sde", True, 1.0, lambda d, x, s, cb: R.t_er_sde(d, x, s, cb, 1.0, NS(), FL())),
    ("euler_cfg_pp", False, 0.0, lambda d, x, s, cb: R.t_euler_cfg_pp(d, x, s, cb, 0.0, NS(), VE())),
    ("euler_cfg_pp", True, 0.0, lambda d, x, s, cb: R.t_euler_cfg_pp(d, x, s, cb, 0.0, NS(), FL())),
    ("euler_a_cfg_pp", False, 1.0, lambda d, x, s, cb: R.t_euler_cfg_pp(d, x, s, cb, 1.0, NS(), VE())),
    ("euler_a_cfg_pp", True, 1.0, lambda d, x, s, cb: R.t_euler_cfg_pp(d, x, s, cb, 1.0, NS(), FL())),
]


def main():
    print("// tools/reference/sampler_refs_scalar.py: {method, flow, eta, x after each of the 8 steps}")
    for name, flow, eta, fn in CASES:
        ms = FL() if flow else VE()
        sig = FL_SIG if flow else VE_SIG
        xs = []
        x = fn(Den(ms), 1.3 * sig[0], sig, xs.append)
        xs = xs[1:] + [x]
        vals = ", ".join(f"{v:.9g}" for v in xs)
        print(f'    {{"{name}", {"true" if flow else "false"}, {eta:.1f}f, {{{vals}}}}},')


if __name__ == "__main__":
    main()
