"""Tiny complete FLUX.1 pipelines (dev and schnell; random, seeded weights) and reference generations.

Runs on the GPU machine with diffusers' source on PYTHONPATH; every model runs on the CPU in float32
(weights rounded to f16 values first), so the numbers do not depend on TF32/cuDNN.

Components (diffusers' FluxPipeline: scheduler, vae, text_encoder, tokenizer, text_encoder_2, tokenizer_2,
transformer):
  tokenizer       the real CLIP BPE tokenizer (tests/data/reference/sd_tiny/diffusers/tokenizer), 77 tokens
  text_encoder    CLIPTextModel (FluxPipeline uses pooler_output), real vocabulary 49408, hidden 8, 2 layers,
                  2 heads, quick_gelu (as CLIP-L); keys text_model.* (the ComfyUI clip_l layout)
  tokenizer_2     the real T5 tokenizer (models/tokenizers/t5/tokenizer.json.gz + its tokenizer_config.json),
                  padded to max_sequence_length 512 (FluxPipeline's default), no attention mask
  text_encoder_2  T5EncoderModel, real vocabulary 32128, d_model 16, d_kv 8, 2 heads, d_ff 32, 2 layers,
                  gated-gelu (T5 v1.1 as T5-XXL); keys shared.weight + encoder.* (the t5xxl file layout)
  transformer     FluxTransformer2DModel in_channels 64 (16 latent channels x 2x2 packing), 1 double block,
                  2 single blocks, 2 heads of 16, joint_attention_dim 16, pooled_projection_dim 8,
                  axes_dims_rope (4, 6, 6); dev: guidance_embeds=True, schnell: False (another seed)
  vae             AutoencoderKL FLUX.1-style (as make_zimage_pipeline.py): 16 latent channels, no quant convs,
                  4 levels of 32 channels, scaling_factor 0.3611, shift_factor 0.1159
  scheduler       FlowMatchEulerDiscreteScheduler; dev: FLUX.1-dev's scheduler_config (use_dynamic_shifting,
                  base/max shift 0.5/1.15 over 256..4096 tokens), schnell: FLUX.1-schnell's (shift 1, static)

Writes into --out:
  diffusers/                           the dev FluxPipeline.save_pretrained, f16 weights; tokenizer/ and
                                       tokenizer_2/ hold only tokenizer_config.json (easel ships the vocabularies)
  flux1_dev_tiny_transformer.safetensors     the dev DiT in the BFL / ComfyUI layout (img_in, double_blocks.N.
                                       img_attn.qkv fused, single_blocks.N.linear1 fused, final_layer with shift
                                       rows first), no prefix, f16
  flux1_schnell_tiny_transformer.safetensors the schnell DiT, same layout under "model.diffusion_model.", f16
  flux1_tiny_vae.safetensors           the VAE in the BFL ae.safetensors / ldm layout, f16
  (te single files: diffusers/text_encoder/model.safetensors = clip_l, diffusers/text_encoder_2/model.safetensors
   = t5xxl)
  cases.json                           every case: prompt, negative, seed, size, steps, guidance, true CFG,
                                       easel flags (folder and single files), token ids, sigmas, timesteps
  case_<name>.png                      final image (uint8 as diffusers' numpy_to_pil: (x*255).round())
  case_<name>.safetensors              float32: noise [1, 16, h, w] (the generator's first draw), cond (T5
                                       last_hidden_state [512, 16]), pooled (CLIP pooler_output [8]), t5_ids,
                                       clip_ids, uncond / uncond_pooled (true-CFG case), dit0_x (packed latent
                                       [1, L, 64]), dit0_t (timestep / 1000 as passed), dit0_guidance (dev),
                                       dit0_out (packed [1, L, 64], positive prompt), step_latents (unpacked
                                       [steps, 16, h, w]), final_latent [1, 16, h, w], image [1, 3, H, W] in [0, 1],
                                       sigmas, timesteps
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

CLIP_CFG = dict(vocab_size=49408, hidden_size=8, intermediate_size=16, projection_dim=8, num_hidden_layers=2,
                num_attention_heads=2, max_position_embeddings=77, hidden_act="quick_gelu", layer_norm_eps=1e-5,
                bos_token_id=49406, eos_token_id=49407, pad_token_id=49407, initializer_range=0.2)
T5_CFG = dict(vocab_size=32128, d_model=16, d_kv=8, d_ff=32, num_layers=2, num_heads=2,
              relative_attention_num_buckets=32, relative_attention_max_distance=128, dropout_rate=0.0,
              layer_norm_epsilon=1e-6, feed_forward_proj="gated-gelu", is_encoder_decoder=False, use_cache=False,
              pad_token_id=0, eos_token_id=1, initializer_factor=1.0)
DIT_CFG = dict(patch_size=1, in_channels=64, out_channels=None, num_layers=1, num_single_layers=2,
               attention_head_dim=16, num_attention_heads=2, joint_attention_dim=16, pooled_projection_dim=8,
               axes_dims_rope=(4, 6, 6))
VAE_CFG = dict(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
               up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(32, 32, 32, 32), layers_per_block=2,
               act_fn="silu", latent_channels=16, norm_num_groups=32, sample_size=64, scaling_factor=0.3611,
               shift_factor=0.1159, use_quant_conv=False, use_post_quant_conv=False, mid_block_add_attention=True)
# FLUX.1-dev / FLUX.1-schnell scheduler_config.json
SCHED_DEV = dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                 base_image_seq_len=256, max_image_seq_len=4096)
SCHED_SCHNELL = dict(num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=False, base_shift=0.5,
                     max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096)

CASES = [
    # name, variant, prompt, negative, seed, W, H, steps, guidance (dev's embedded guidance), true_cfg_scale
    ("dev_cat_s0_64", "dev", "a photo of a cat", "", 0, 64, 64, 4, 3.5, 1.0),
    ("dev_circle_s1_96x64", "dev", "a small red circle on the left, blue background", "", 1, 96, 64, 3, 5.0, 1.0),
    ("dev_truecfg_s2_64", "dev", "a photo of a cat", "blurry, low quality", 2, 64, 64, 3, 3.5, 2.0),
    ("schnell_cat_s3_64", "schnell", "a photo of a cat", "", 3, 64, 64, 4, None, 1.0),
    ("schnell_circle_s4_48x80", "schnell", "a small red circle on the left, blue background", "", 4, 48, 80, 2,
     None, 1.0),
]

DEV_FILE = "flux1_dev_tiny_transformer.safetensors"
SCHNELL_FILE = "flux1_schnell_tiny_transformer.safetensors"
VAE_FILE = "flux1_tiny_vae.safetensors"


def round_f16(m):
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(p.half().float())
        for b in m.buffers():
            if b.is_floating_point():
                b.copy_(b.half().float())
    m.eval()
    return m


def randomize_zeros(m, seed):
    """Zero-initialised parameters (adaLN, biases) would hide mapping bugs: give them random values."""
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed)
        for _, p in m.named_parameters():
            if float(p.abs().max()) == 0.0:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)


def build_models(seed):
    from diffusers import AutoencoderKL, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    torch.manual_seed(seed)
    clip = CLIPTextModel(CLIPTextConfig(**CLIP_CFG))
    torch.manual_seed(seed + 1)
    t5 = T5EncoderModel(T5Config(**T5_CFG))
    torch.manual_seed(seed + 2)
    dev = FluxTransformer2DModel(**DIT_CFG, guidance_embeds=True)
    randomize_zeros(dev, seed + 3)
    torch.manual_seed(seed + 4)
    schnell = FluxTransformer2DModel(**DIT_CFG, guidance_embeds=False)
    randomize_zeros(schnell, seed + 5)
    torch.manual_seed(seed + 6)
    vae = AutoencoderKL(**VAE_CFG)
    for m in (clip, t5):
        if hasattr(m, "set_attn_implementation"):
            m.set_attn_implementation("eager")
    return [round_f16(m) for m in (clip, t5, dev, schnell, vae)]


def dit_to_bfl(sd):
    """diffusers FluxTransformer2DModel state dict -> BFL / ComfyUI names: the inverse of diffusers'
    convert_flux_transformer_checkpoint_to_diffusers (qkv fused along dim 0, single-block linear1 = q|k|v|mlp,
    final_layer.adaLN_modulation.1 = shift rows then scale rows)."""
    sd = dict(sd)
    out = {}

    def mv(src, dst):
        out[dst] = sd.pop(src)

    for a, b in (("time_text_embed.timestep_embedder.linear_1", "time_in.in_layer"),
                 ("time_text_embed.timestep_embedder.linear_2", "time_in.out_layer"),
                 ("time_text_embed.text_embedder.linear_1", "vector_in.in_layer"),
                 ("time_text_embed.text_embedder.linear_2", "vector_in.out_layer"),
                 ("time_text_embed.guidance_embedder.linear_1", "guidance_in.in_layer"),
                 ("time_text_embed.guidance_embedder.linear_2", "guidance_in.out_layer"),
                 ("context_embedder", "txt_in"), ("x_embedder", "img_in"), ("proj_out", "final_layer.linear")):
        for s in ("weight", "bias"):
            if f"{a}.{s}" in sd:
                mv(f"{a}.{s}", f"{b}.{s}")
    for s in ("weight", "bias"):
        scale, shift = sd.pop(f"norm_out.linear.{s}").chunk(2, dim=0)
        out[f"final_layer.adaLN_modulation.1.{s}"] = torch.cat([shift, scale], 0)
    n_double = len({k.split(".")[1] for k in sd if k.startswith("transformer_blocks.")})
    n_single = len({k.split(".")[1] for k in sd if k.startswith("single_transformer_blocks.")})
    for i in range(n_double):
        p, q = f"transformer_blocks.{i}.", f"double_blocks.{i}."
        for s in ("weight", "bias"):
            mv(f"{p}norm1.linear.{s}", f"{q}img_mod.lin.{s}")
            mv(f"{p}norm1_context.linear.{s}", f"{q}txt_mod.lin.{s}")
            out[f"{q}img_attn.qkv.{s}"] = torch.cat([sd.pop(f"{p}attn.to_{n}.{s}") for n in "qkv"], 0)
            out[f"{q}txt_attn.qkv.{s}"] = torch.cat([sd.pop(f"{p}attn.add_{n}_proj.{s}") for n in "qkv"], 0)
            mv(f"{p}ff.net.0.proj.{s}", f"{q}img_mlp.0.{s}")
            mv(f"{p}ff.net.2.{s}", f"{q}img_mlp.2.{s}")
            mv(f"{p}ff_context.net.0.proj.{s}", f"{q}txt_mlp.0.{s}")
            mv(f"{p}ff_context.net.2.{s}", f"{q}txt_mlp.2.{s}")
            mv(f"{p}attn.to_out.0.{s}", f"{q}img_attn.proj.{s}")
            mv(f"{p}attn.to_add_out.{s}", f"{q}txt_attn.proj.{s}")
        mv(f"{p}attn.norm_q.weight", f"{q}img_attn.norm.query_norm.scale")
        mv(f"{p}attn.norm_k.weight", f"{q}img_attn.norm.key_norm.scale")
        mv(f"{p}attn.norm_added_q.weight", f"{q}txt_attn.norm.query_norm.scale")
        mv(f"{p}attn.norm_added_k.weight", f"{q}txt_attn.norm.key_norm.scale")
    for i in range(n_single):
        p, q = f"single_transformer_blocks.{i}.", f"single_blocks.{i}."
        for s in ("weight", "bias"):
            mv(f"{p}norm.linear.{s}", f"{q}modulation.lin.{s}")
            out[f"{q}linear1.{s}"] = torch.cat([sd.pop(f"{p}attn.to_{n}.{s}") for n in "qkv"] +
                                               [sd.pop(f"{p}proj_mlp.{s}")], 0)
            mv(f"{p}proj_out.{s}", f"{q}linear2.{s}")
        mv(f"{p}attn.norm_q.weight", f"{q}norm.query_norm.scale")
        mv(f"{p}attn.norm_k.weight", f"{q}norm.key_norm.scale")
    assert not sd, f"unconverted keys: {sorted(sd)}"
    return out


def bfl_to_dit(sd, hidden, mlp):
    """The forward conversion (diffusers' converter re-done for any inner_dim: its own hard-codes 3072), used to
    check dit_to_bfl round-trips."""
    sd = dict(sd)
    out = {}
    inv = {}
    for a, b in (("time_text_embed.timestep_embedder.linear_1", "time_in.in_layer"),
                 ("time_text_embed.timestep_embedder.linear_2", "time_in.out_layer"),
                 ("time_text_embed.text_embedder.linear_1", "vector_in.in_layer"),
                 ("time_text_embed.text_embedder.linear_2", "vector_in.out_layer"),
                 ("time_text_embed.guidance_embedder.linear_1", "guidance_in.in_layer"),
                 ("time_text_embed.guidance_embedder.linear_2", "guidance_in.out_layer"),
                 ("context_embedder", "txt_in"), ("x_embedder", "img_in"), ("proj_out", "final_layer.linear")):
        inv[b] = a
    for k in list(sd):
        base, s = k.rsplit(".", 1)
        if base in inv:
            out[f"{inv[base]}.{s}"] = sd.pop(k)
    for s in ("weight", "bias"):
        shift, scale = sd.pop(f"final_layer.adaLN_modulation.1.{s}").chunk(2, 0)
        out[f"norm_out.linear.{s}"] = torch.cat([scale, shift], 0)
    for k in list(sd):
        parts = k.split(".")
        if parts[0] == "double_blocks":
            i, rest = parts[1], ".".join(parts[2:])
            p = f"transformer_blocks.{i}."
            v = sd.pop(k)
            if rest.startswith("img_attn.qkv."):
                for n, c in zip("qkv", v.chunk(3, 0)):
                    out[f"{p}attn.to_{n}.{parts[-1]}"] = c
            elif rest.startswith("txt_attn.qkv."):
                for n, c in zip("qkv", v.chunk(3, 0)):
                    out[f"{p}attn.add_{n}_proj.{parts[-1]}"] = c
            else:
                m = {"img_mod.lin": "norm1.linear", "txt_mod.lin": "norm1_context.linear",
                     "img_mlp.0": "ff.net.0.proj", "img_mlp.2": "ff.net.2", "txt_mlp.0": "ff_context.net.0.proj",
                     "txt_mlp.2": "ff_context.net.2", "img_attn.proj": "attn.to_out.0",
                     "txt_attn.proj": "attn.to_add_out"}
                nm = {"img_attn.norm.query_norm.scale": "attn.norm_q.weight",
                      "img_attn.norm.key_norm.scale": "attn.norm_k.weight",
                      "txt_attn.norm.query_norm.scale": "attn.norm_added_q.weight",
                      "txt_attn.norm.key_norm.scale": "attn.norm_added_k.weight"}
                if rest in nm:
                    out[p + nm[rest]] = v
                else:
                    base, s = rest.rsplit(".", 1)
                    out[f"{p}{m[base]}.{s}"] = v
        elif parts[0] == "single_blocks":
            i, rest = parts[1], ".".join(parts[2:])
            p = f"single_transformer_blocks.{i}."
            v = sd.pop(k)
            if rest.startswith("linear1."):
                q, kk, vv, ml = torch.split(v, (hidden, hidden, hidden, mlp), 0)
                for n, c in zip(("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"), (q, kk, vv, ml)):
                    out[f"{p}{n}.{parts[-1]}"] = c
            elif rest == "norm.query_norm.scale":
                out[p + "attn.norm_q.weight"] = v
            elif rest == "norm.key_norm.scale":
                out[p + "attn.norm_k.weight"] = v
            else:
                base, s = rest.rsplit(".", 1)
                out[f"{p}{ {'modulation.lin': 'norm.linear', 'linear2': 'proj_out'}[base]}.{s}"] = v
    assert not sd, f"unconverted keys: {sorted(sd)}"
    return out


def image_to_png(arr01, path):
    """[H, W, 3] float in [0, 1] -> PNG with diffusers' numpy_to_pil rounding ((x * 255).round())."""
    Image.fromarray((arr01 * 255).round().astype("uint8")).save(path)


def unpack(lat, H, W):
    """FluxPipeline._unpack_latents: [B, (h/2)*(w/2), C*4] -> [B, C, h, w] with h = 2*(H//16)."""
    b, n, c = lat.shape
    h, w = 2 * (H // 16), 2 * (W // 16)
    x = lat.view(b, h // 2, w // 2, c // 4, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(b, c // 4, h, w)


def easel_flags(c):
    f = [f'-p "{c["prompt"]}"']
    if c["negative_prompt"]:
        f.append(f'-n "{c["negative_prompt"]}"')
    f += [f'-W {c["width"]}', f'-H {c["height"]}', f'--steps {c["steps"]}', f'--cfg-scale {c["cfg_scale"]}']
    if c["guidance"] is not None:
        f.append(f'--guidance {c["guidance"]}')
    f += [f'-s {c["seed"]}', "--sampling-method euler", f'--scheduler {c["scheduler"]}', "--rng cpu"]
    return " ".join(f)


def encode(pipe, text):
    """FluxPipeline.encode_prompt pieces: T5 last_hidden_state over 512 padded tokens, CLIP pooler_output."""
    t5_ids = pipe.tokenizer_2([text], padding="max_length", max_length=512, truncation=True,
                              return_tensors="pt").input_ids
    clip_ids = pipe.tokenizer([text], padding="max_length", max_length=77, truncation=True,
                              return_tensors="pt").input_ids
    with torch.no_grad():
        ctx = pipe.text_encoder_2(t5_ids, output_hidden_states=False)[0]
        pooled = pipe.text_encoder(clip_ids, output_hidden_states=False).pooler_output
    return t5_ids, clip_ids, ctx, pooled


def run_case(pipes, case, out):
    name, variant, prompt, neg, seed, W, H, steps, g, tcfg = case
    pipe = pipes[variant]
    t = {}
    t5_ids, clip_ids, ctx, pooled = encode(pipe, prompt)
    t["cond"], t["pooled"] = ctx[0].float().clone(), pooled[0].float().clone()
    t["t5_ids"], t["clip_ids"] = t5_ids[0].to(torch.int32), clip_ids[0].to(torch.int32)
    if tcfg > 1 and neg:
        _, _, nctx, npooled = encode(pipe, neg)
        t["uncond"], t["uncond_pooled"] = nctx[0].float().clone(), npooled[0].float().clone()

    steps_lat = []

    def cb(p, i, ts, kw):
        steps_lat.append(kw["latents"].detach().float().clone())
        return kw

    first = {}

    def hook(mod, args, kwargs, output):
        if not first:
            first["x"] = kwargs["hidden_states"].detach().float().clone()
            first["t"] = kwargs["timestep"].detach().float().reshape(-1).clone()
            if kwargs.get("guidance") is not None:
                first["g"] = kwargs["guidance"].detach().float().reshape(-1).clone()
            first["ctx"] = kwargs["encoder_hidden_states"].detach().float().clone()
            first["pooled"] = kwargs["pooled_projections"].detach().float().clone()
            first["out"] = output[0].detach().float().clone()

    h = pipe.transformer.register_forward_hook(hook, with_kwargs=True)
    gen = torch.Generator("cpu").manual_seed(seed)
    kw = dict(prompt=prompt, height=H, width=W, num_inference_steps=steps, generator=gen, output_type="np",
              callback_on_step_end=cb, max_sequence_length=512)
    if g is not None:
        kw["guidance_scale"] = g
    if neg:
        kw["negative_prompt"] = neg
        kw["true_cfg_scale"] = tcfg
    with torch.no_grad():
        img = pipe(**kw).images
    h.remove()
    sched = pipe.scheduler
    lh, lw = 2 * (H // 16), 2 * (W // 16)
    t["noise"] = torch.randn((1, 16, lh, lw), generator=torch.Generator("cpu").manual_seed(seed), dtype=torch.float32)
    t["step_latents"] = torch.cat([unpack(x, H, W) for x in steps_lat], 0)
    t["final_latent"] = unpack(steps_lat[-1], H, W)
    t["image"] = torch.from_numpy(np.ascontiguousarray(img)).permute(0, 3, 1, 2).float()
    t["dit0_x"], t["dit0_t"], t["dit0_out"] = first["x"], first["t"], first["out"]
    if "g" in first:
        t["dit0_guidance"] = first["g"]
    t["sigmas"] = sched.sigmas.float().cpu()
    t["timesteps"] = sched.timesteps.float().cpu()
    checks = {
        # the first DiT input is the packed noise; the pipeline's embeddings equal encode()'s
        "dit0_x_vs_packed_noise_max_abs_diff": float((unpack(first["x"], H, W) - t["noise"]).abs().max()),
        "dit0_ctx_vs_cond_max_abs_diff": float((first["ctx"][0] - t["cond"]).abs().max()),
        "dit0_pooled_vs_pooled_max_abs_diff": float((first["pooled"][0] - t["pooled"]).abs().max()),
    }
    save_file({k: v.contiguous() for k, v in t.items()}, os.path.join(out, f"case_{name}.safetensors"))
    image_to_png(img[0], os.path.join(out, f"case_{name}.png"))
    dev = variant == "dev"
    c = {"name": name, "variant": variant, "prompt": prompt, "negative_prompt": neg, "seed": seed, "width": W,
         "height": H, "steps": steps, "guidance": g, "true_cfg_scale": tcfg, "cfg_active": bool(tcfg > 1 and neg),
         "cfg_scale": tcfg if (tcfg > 1 and neg) else 1.0, "sampling_method": "euler",
         "scheduler": "flux" if dev else "discrete", "rng": "cpu", "png": f"case_{name}.png",
         "tensors": f"case_{name}.safetensors", "latent_shape": [16, lh, lw], "image_seq_len": (lh // 2) * (lw // 2),
         "sigmas": [float(x) for x in sched.sigmas], "timesteps": [float(x) for x in sched.timesteps],
         "t5_ids_unpadded": [int(x) for x in t5_ids[0] if int(x) != 0], "clip_ids": [int(x) for x in clip_ids[0]],
         "checks": checks}
    dit_file = DEV_FILE if dev else SCHNELL_FILE
    if dev:
        c["easel_args"] = "generate -m diffusers " + easel_flags(c)
    c["easel_args_single_files"] = (f"generate --diffusion-model {dit_file} --t5xxl diffusers/text_encoder_2/"
                                    f"model.safetensors --clip_l diffusers/text_encoder/model.safetensors "
                                    f"--vae {VAE_FILE} " + easel_flags(c))
    return c, img


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clip-tok-dir", required=True, help="CLIP tokenizer folder (tokenizer.json, config)")
    ap.add_argument("--t5-tok-gz", required=True, help="gzipped T5 tokenizer.json")
    ap.add_argument("--t5-tok-config", required=True, help="T5 tokenizer_config.json")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=2718)
    a = ap.parse_args()
    t0 = time.time()
    torch.set_num_threads(8)
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import AutoTokenizer

    os.makedirs(a.out, exist_ok=True)
    t5_dir = "/tmp/flux_t5_tok"
    os.makedirs(t5_dir, exist_ok=True)
    with gzip.open(a.t5_tok_gz, "rb") as f, open(os.path.join(t5_dir, "tokenizer.json"), "wb") as g:
        g.write(f.read())
    shutil.copy(a.t5_tok_config, os.path.join(t5_dir, "tokenizer_config.json"))
    tok2 = AutoTokenizer.from_pretrained(t5_dir)
    tok = AutoTokenizer.from_pretrained(a.clip_tok_dir)
    clip, t5, dev, schnell, vae = build_models(a.seed)
    pipes = {
        "dev": FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(**SCHED_DEV), vae=vae, text_encoder=clip,
                            tokenizer=tok, text_encoder_2=t5, tokenizer_2=tok2, transformer=dev),
        "schnell": FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(**SCHED_SCHNELL), vae=vae,
                                text_encoder=clip, tokenizer=tok, text_encoder_2=t5, tokenizer_2=tok2,
                                transformer=schnell),
    }
    for p in pipes.values():
        p.set_progress_bar_config(disable=True)

    cases, imgs = [], {}
    for case in CASES:
        c, img = run_case(pipes, case, a.out)
        cases.append(c)
        imgs[c["name"]] = img
        print(f"case {c['name']}: {len(c['t5_ids_unpadded'])} T5 tokens, checks {c['checks']} "
              f"({time.time() - t0:.1f}s)")

    # (i) diffusers folder of the dev pipeline, f16 weights (exact: the weights are f16-rounded)
    ddir = os.path.join(a.out, "diffusers")
    pipe = pipes["dev"]
    pipe.to(torch.float16)
    pipe.save_pretrained(ddir, safe_serialization=True)
    pipe.to(torch.float32)
    saved_tok = {}
    for sub in ("tokenizer", "tokenizer_2"):
        tdir = os.path.join(ddir, sub)
        saved_tok[sub] = sorted(os.listdir(tdir))
        for fn in saved_tok[sub]:
            if fn != "tokenizer_config.json":
                os.remove(os.path.join(tdir, fn))
    # (ii) single files, original layouts, f16
    save_file({k: v.half().contiguous() for k, v in dit_to_bfl(dev.state_dict()).items()},
              os.path.join(a.out, DEV_FILE),
              metadata={"format": "pt", "easel_note": "tiny random FLUX.1-dev DiT, BFL layout (f16)"})
    save_file({"model.diffusion_model." + k: v.half().contiguous()
               for k, v in dit_to_bfl(schnell.state_dict()).items()}, os.path.join(a.out, SCHNELL_FILE),
              metadata={"format": "pt", "easel_note": "tiny random FLUX.1-schnell DiT, ComfyUI layout (f16)"})
    vsd = {k[len(ldm_convert.VAE_PREFIX):]: v.half().contiguous()
           for k, v in ldm_convert.vae_to_ldm(vae.state_dict(), dict(vae.config)).items()}
    save_file(vsd, os.path.join(a.out, VAE_FILE),
              metadata={"format": "pt", "easel_note": "tiny random FLUX-style VAE, ae.safetensors layout (f16)"})

    checks = {"saved_tokenizer_files": saved_tok}
    # (iii) the BFL files convert back to the diffusers weights exactly
    try:
        hid = DIT_CFG["attention_head_dim"] * DIT_CFG["num_attention_heads"]
        for m, fn, pre in ((dev, DEV_FILE, ""), (schnell, SCHNELL_FILE, "model.diffusion_model.")):
            raw = {k[len(pre):]: v.float() for k, v in load_file(os.path.join(a.out, fn)).items()}
            conv = bfl_to_dit(raw, hid, 4 * hid)
            ref = m.state_dict()
            checks[f"{fn}_keys_equal"] = set(conv) == set(ref)
            checks[f"{fn}_max_abs_diff"] = max(float((conv[k] - ref[k]).abs().max()) for k in ref)
    except Exception as e:  # noqa: BLE001
        checks["bfl_roundtrip_error"] = f"{type(e).__name__}: {e}"[:500]
    try:
        m = AutoencoderKL.from_single_file(os.path.join(a.out, VAE_FILE), config=os.path.join(ddir, "vae"),
                                           local_files_only=True, torch_dtype=torch.float32)
        ref = vae.state_dict()
        checks["from_single_file_vae_max_abs_diff"] = max(
            float((m.state_dict()[k].float() - ref[k]).abs().max()) for k in ref)
    except Exception as e:  # noqa: BLE001
        checks["from_single_file_vae_error"] = f"{type(e).__name__}: {e}"[:300]
    # (iv) the saved folder reproduces the true-CFG case (tokenizers restored from the carried files)
    try:
        shutil.copy(os.path.join(t5_dir, "tokenizer.json"), os.path.join(ddir, "tokenizer_2", "tokenizer.json"))
        shutil.copy(os.path.join(a.clip_tok_dir, "tokenizer.json"), os.path.join(ddir, "tokenizer", "tokenizer.json"))
        p2 = FluxPipeline.from_pretrained(ddir, torch_dtype=torch.float32)
        os.remove(os.path.join(ddir, "tokenizer_2", "tokenizer.json"))
        os.remove(os.path.join(ddir, "tokenizer", "tokenizer.json"))
        p2.set_progress_bar_config(disable=True)
        n, _, pr, ng, sd, W, H, st, g, tc = CASES[2]
        with torch.no_grad():
            im = p2(prompt=pr, negative_prompt=ng, true_cfg_scale=tc, guidance_scale=g, height=H, width=W,
                    num_inference_steps=st, generator=torch.Generator("cpu").manual_seed(sd),
                    output_type="np").images
        checks["folder_reload_max_abs_diff_case2"] = float(np.abs(im - imgs[n]).max())
    except Exception as e:  # noqa: BLE001
        checks["folder_reload_error"] = f"{type(e).__name__}: {e}"[:500]
    print("checks:", checks)

    import diffusers
    import transformers

    meta = {"generator": "tools/reference/make_flux_pipeline.py", "seed": a.seed, "torch": torch.__version__,
            "diffusers": diffusers.__version__, "transformers": transformers.__version__, "device": "cpu float32",
            "weights": "f16-rounded, run in float32", "checks": checks,
            "single_files": {"diffusion_model_dev": DEV_FILE, "diffusion_model_schnell": SCHNELL_FILE,
                             "vae": VAE_FILE, "clip_l": "diffusers/text_encoder/model.safetensors",
                             "t5xxl": "diffusers/text_encoder_2/model.safetensors"},
            "clip_config": CLIP_CFG, "t5_config": T5_CFG,
            "transformer_config": {k: v for k, v in dict(dev.config).items() if not k.startswith("_")},
            "vae_config": {k: v for k, v in dict(vae.config).items() if not k.startswith("_")},
            "scheduler_config_dev": SCHED_DEV, "scheduler_config_schnell": SCHED_SCHNELL, "vae_scale_factor": 8,
            "max_sequence_length": 512,
            "cfg_mapping": "FluxPipeline true_cfg_scale s > 1 with a negative prompt -> easel --cfg-scale s; "
                           "guidance_scale (dev's embedded guidance) -> easel --guidance",
            "cases": cases}
    with open(os.path.join(a.out, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1, ensure_ascii=False, default=str)
    print(f"flux pipeline: done in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
