"""Tiny complete SDXL pipeline (random, seeded weights): module references and reference generations.

Runs on the GPU machine (models on the CPU in float32, weights rounded to f16 values first) with
diffusers' source carried as .diffusers/ (or .carry/diffusers, or on PYTHONPATH):

  python3 tools/reference/make_sdxl_pipeline.py --gz models/tokenizers/clip/bpe_simple_vocab_16e6.txt.gz \
      --out tests/data/reference/sdxl_tiny

SDXL conventions the tiny model keeps, so that everything can be inferred from a single file:
  text_encoder    CLIP-L-like CLIPTextModel: width 8, 1 head, quick_gelu, 2 layers, 77 positions, CLIP vocabulary,
                  tokenizer pads with <|endoftext|>; SDXL uses hidden_states[-2] (no final layer norm).
  text_encoder_2  OpenCLIP-G-like CLIPTextModelWithProjection: width 8, 1 head, gelu, 2 layers, projection 12
                  (!= width, so a transposed text_projection shows), tokenizer_2 pads with "!" (id 0) as SDXL's;
                  hidden_states[-2] and text_embeds (projection of the final-normed EOS state) = pooled.
  unet            use_linear_projection, levels (32, 64): no attention in the first level (DownBlock2D), head
                  size 64 (attention_head_dim quirk = 1 head), transformer_layers_per_block (1, 2) (the mid block
                  takes the last: 2), cross_attention_dim 16 = 8 + 8, addition_embed_type text_time with
                  addition_time_embed_dim 256 (SDXL's) and projection_class_embeddings_input_dim 12 + 6 * 256,
                  time_embedding_dim 64, layers_per_block 1, 32 groups.
  vae             AutoencoderKL, 4 levels of 32 channels (factor 8), 1 resnet per level, scaling 0.13025 (SDXL's).
  scheduler       EulerDiscreteScheduler as SDXL base's scheduler_config.json: scaled_linear 0.00085..0.012,
                  timestep_spacing "leading", steps_offset 1, epsilon.
  pipeline        StableDiffusionXLPipeline, force_zeros_for_empty_prompt True (SDXL base), no watermark.

Writes into --out (about 3.5 MB):
  sdxl_tiny.safetensors      original (SGM) single file, f16: model.diffusion_model.* (label_emb.0.0/0.2 =
                             add_embedding.linear_1/2), first_stage_model.*,
                             conditioner.embedders.0.transformer.text_model.* (CLIP-L, transformers names),
                             conditioner.embedders.1.model.* (OpenCLIP: token_embedding, positional_embedding,
                             transformer.resblocks.N.{ln_1, attn.in_proj_weight/bias (q|k|v rows), attn.out_proj,
                             ln_2, mlp.c_fc, mlp.c_proj}, ln_final, text_projection [width, projection], logit_scale)
  diffusers/                 save_pretrained's JSON files only (model_index, scheduler, unet/vae/text encoder
                             configs, tokenizer configs): the weights are the single file's (test-data budget)
  modules.safetensors        float32 module references: te1_ids/te2_ids [1, 77] (prompt MODULE_PROMPT),
                             te1_hidden_penultimate [1, 77, 8], te1_last_hidden_state, te2_hidden_penultimate,
                             te2_text_embeds [1, 12], unet_sample [2, 4, 8, 12], unet_timestep [2],
                             unet_context [2, 77, 16], unet_text_embeds [2, 12], unet_time_ids [2, 6], unet_out
  cases.json, case_<name>.png, case_<name>.safetensors (cond [1, 77, 16], pooled [1, 12], uncond,
                             uncond_pooled, add_time_ids [1, 6], noise, final_latent, image [1, 3, H, W] in [0, 1],
                             sigmas, timesteps, unet0_* (first UNet call, CFG batch [uncond, cond]))
"""

import argparse
import json
import os
import shutil
import sys
import time

for _p in (".diffusers", ".carry/diffusers"):
    if os.path.isdir(_p):
        sys.path.insert(0, _p)

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ldm_convert  # noqa: E402
from dump_clip_tokens import load_hf_tokenizer, write_tokenizer_files  # noqa: E402

SCHED = dict(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
             prediction_type="epsilon", timestep_spacing="leading", steps_offset=1, interpolation_type="linear",
             use_karras_sigmas=False)
TE_WIDTH, TE2_WIDTH, TE2_PROJ = 8, 8, 12
TIME_DIM = 256
MODULE_PROMPT = "a photo of an astronaut riding a horse"

CASES = [
    # name, prompt, negative (None = not given: SDXL zeros), seed, W, H, steps, cfg
    ("euler_a_s0_neg", "a photo of a cat", "blurry, low quality", 0, 64, 64, 6, 5.0),
    ("euler_b_s1_zero_neg_96x64", "a small red circle on the left, blue background", None, 1, 96, 64, 6, 7.0),
]


def round_f16(*models):
    with torch.no_grad():
        for m in models:
            for p in m.parameters():
                p.copy_(p.half().float())
            m.eval()


def build_models(seed):
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    def te_cfg(width, act, proj, pad):
        return CLIPTextConfig(vocab_size=49408, hidden_size=width, intermediate_size=2 * width, num_hidden_layers=2,
                              num_attention_heads=1, max_position_embeddings=77, hidden_act=act, layer_norm_eps=1e-5,
                              projection_dim=proj, bos_token_id=49406, eos_token_id=49407, pad_token_id=pad)

    torch.manual_seed(seed)
    te = CLIPTextModel(te_cfg(TE_WIDTH, "quick_gelu", TE_WIDTH, 49407))
    torch.manual_seed(seed + 1)
    te2 = CLIPTextModelWithProjection(te_cfg(TE2_WIDTH, "gelu", TE2_PROJ, 0))
    torch.manual_seed(seed + 2)
    unet = UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
                                block_out_channels=(32, 64), down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                                up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
                                transformer_layers_per_block=(1, 2), attention_head_dim=(1, 1),
                                use_linear_projection=True, cross_attention_dim=TE_WIDTH + TE2_WIDTH,
                                addition_embed_type="text_time", addition_time_embed_dim=TIME_DIM,
                                projection_class_embeddings_input_dim=TE2_PROJ + 6 * TIME_DIM,
                                time_embedding_dim=64, norm_num_groups=32)
    torch.manual_seed(seed + 3)
    vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
                        up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(32, 32, 32, 32),
                        layers_per_block=1, latent_channels=4, norm_num_groups=32, sample_size=64,
                        scaling_factor=0.13025)
    round_f16(te, te2, unet, vae)
    return te, te2, unet, vae


def hf_te_sd(m):
    """transformers state dict with text_model. on every text-model key (transformers 5 may drop it)."""
    out = {}
    for k, v in m.state_dict().items():
        if k.endswith("position_ids"):
            continue
        if not (k.startswith("text_model.") or k.startswith("text_projection")):
            k = "text_model." + k
        out[k] = v
    return out


def te2_to_openclip(te2, prefix):
    """CLIPTextModelWithProjection -> SGM's OpenCLIP names (inverse of diffusers' convert_open_clip_checkpoint)."""
    sd = hf_te_sd(te2)
    P = prefix
    out = {P + "token_embedding.weight": sd["text_model.embeddings.token_embedding.weight"],
           P + "positional_embedding": sd["text_model.embeddings.position_embedding.weight"],
           P + "ln_final.weight": sd["text_model.final_layer_norm.weight"],
           P + "ln_final.bias": sd["text_model.final_layer_norm.bias"],
           P + "text_projection": sd["text_projection.weight"].t().contiguous(),  # [width, projection]
           P + "logit_scale": torch.tensor(4.6052)}
    n = 0
    while f"text_model.encoder.layers.{n}.layer_norm1.weight" in sd:
        s, d = f"text_model.encoder.layers.{n}.", f"{P}transformer.resblocks.{n}."
        for wb in ("weight", "bias"):
            out[d + "ln_1." + wb] = sd[s + "layer_norm1." + wb]
            out[d + "ln_2." + wb] = sd[s + "layer_norm2." + wb]
            out[d + "attn.in_proj_" + wb] = torch.cat([sd[s + f"self_attn.{x}_proj.{wb}"] for x in "qkv"], 0)
            out[d + "attn.out_proj." + wb] = sd[s + "self_attn.out_proj." + wb]
            out[d + "mlp.c_fc." + wb] = sd[s + "mlp.fc1." + wb]
            out[d + "mlp.c_proj." + wb] = sd[s + "mlp.fc2." + wb]
        n += 1
    return out


def unet_to_sgm(unet):
    """diffusers SDXL UNet -> model.diffusion_model.* (ldm_convert's map plus add_embedding -> label_emb.0)."""
    sd = unet.state_dict()
    add = {k: v for k, v in sd.items() if k.startswith("add_embedding.")}
    rest = {k: v for k, v in sd.items() if not k.startswith("add_embedding.")}
    out = ldm_convert.unet_to_ldm(rest, unet.config)
    for k, v in add.items():
        k2 = k.replace("add_embedding.linear_1.", "label_emb.0.0.").replace("add_embedding.linear_2.", "label_emb.0.2.")
        out[ldm_convert.UNET_PREFIX + k2] = v
    return out


def single_file(te, te2, unet, vae):
    ldm = {}
    ldm.update(unet_to_sgm(unet))
    ldm.update(ldm_convert.vae_to_ldm(vae.state_dict(), vae.config))
    ldm.update({"conditioner.embedders.0.transformer." + k: v for k, v in hf_te_sd(te).items()})
    ldm.update(te2_to_openclip(te2, "conditioner.embedders.1.model."))
    return {k: (v.detach().half() if v.is_floating_point() else v).contiguous() for k, v in ldm.items()}


def image_to_png(img01, path):
    from PIL import Image

    arr = (img01[0].permute(1, 2, 0).cpu().numpy() * 255).round().astype("uint8")
    Image.fromarray(arr).save(path)


def module_refs(pipe, out):
    te, te2, unet = pipe.text_encoder, pipe.text_encoder_2, pipe.unet
    t = {}
    ids1 = pipe.tokenizer(MODULE_PROMPT, padding="max_length", max_length=77, truncation=True,
                          return_tensors="pt").input_ids
    ids2 = pipe.tokenizer_2(MODULE_PROMPT, padding="max_length", max_length=77, truncation=True,
                            return_tensors="pt").input_ids
    with torch.no_grad():
        o1 = te(ids1, output_hidden_states=True)
        o2 = te2(ids2, output_hidden_states=True)
    t["te1_ids"], t["te2_ids"] = ids1.float(), ids2.float()
    t["te1_hidden_penultimate"] = o1.hidden_states[-2]
    t["te1_last_hidden_state"] = o1.last_hidden_state
    t["te2_hidden_penultimate"] = o2.hidden_states[-2]
    t["te2_text_embeds"] = o2.text_embeds
    g = torch.Generator().manual_seed(77)
    t["unet_sample"] = torch.randn(2, 4, 8, 12, generator=g)
    t["unet_timestep"] = torch.tensor([999.0, 321.5])
    t["unet_context"] = torch.randn(2, 77, TE_WIDTH + TE2_WIDTH, generator=g)
    t["unet_text_embeds"] = torch.randn(2, TE2_PROJ, generator=g)
    t["unet_time_ids"] = torch.tensor([[64.0, 96.0, 0.0, 0.0, 64.0, 96.0], [1024.0, 768.0, 16.0, 32.0, 896.0, 1152.0]])
    with torch.no_grad():
        t["unet_out"] = unet(t["unet_sample"], t["unet_timestep"], encoder_hidden_states=t["unet_context"],
                             added_cond_kwargs={"text_embeds": t["unet_text_embeds"], "time_ids": t["unet_time_ids"]}
                             ).sample
    save_file({k: v.detach().float().contiguous().clone() for k, v in t.items()}, os.path.join(out, "modules.safetensors"))
    return {"prompt": MODULE_PROMPT, "unet_out_abs_max": float(t["unet_out"].abs().max())}


def run_case(pipe, case, out):
    from diffusers import EulerDiscreteScheduler

    name, prompt, neg, seed, W, H, steps, cfg = case
    pipe.scheduler = EulerDiscreteScheduler(**SCHED)
    t = {}
    with torch.no_grad():
        pe, npe, pp, npp = pipe.encode_prompt(prompt, device="cpu", num_images_per_prompt=1,
                                              do_classifier_free_guidance=True, negative_prompt=neg)
    t["cond"], t["uncond"], t["pooled"], t["uncond_pooled"] = pe, npe, pp, npp
    steps_lat = []

    def cb(p, i, ts, kw):
        steps_lat.append(kw["latents"].detach().float().clone())
        return kw

    first = {}

    def hook(mod, args, kwargs, output):
        if not first:
            first["sample"] = args[0].detach().float().clone()
            first["timestep"] = torch.as_tensor(args[1], dtype=torch.float32).reshape(-1).clone()
            first["time_ids"] = kwargs["added_cond_kwargs"]["time_ids"].detach().float().clone()
            o = output[0] if isinstance(output, tuple) else output.sample
            first["out"] = o.detach().float().clone()

    h = pipe.unet.register_forward_hook(hook, with_kwargs=True)
    gen = torch.Generator("cpu").manual_seed(seed)
    with torch.no_grad():
        img = pipe(prompt=prompt, negative_prompt=neg, num_inference_steps=steps, guidance_scale=cfg, height=H,
                   width=W, generator=gen, output_type="pt", callback_on_step_end=cb).images
    h.remove()
    sched = pipe.scheduler
    t["noise"] = torch.randn((1, 4, H // 8, W // 8), generator=torch.Generator("cpu").manual_seed(seed),
                             dtype=torch.float32)
    t["add_time_ids"] = first["time_ids"][-1:].clone()
    t["final_latent"] = steps_lat[-1]
    t["image"] = img.float()
    t["unet0_sample"], t["unet0_timestep"], t["unet0_out"] = first["sample"], first["timestep"], first["out"]
    t["sigmas"] = sched.sigmas.float().cpu()
    t["timesteps"] = sched.timesteps.float().cpu()
    save_file({k: v.detach().float().contiguous().clone() for k, v in t.items()}, os.path.join(out, f"case_{name}.safetensors"))
    image_to_png(img, os.path.join(out, f"case_{name}.png"))
    flags = [f'-p "{prompt}"'] + ([f'-n "{neg}"'] if neg else []) + [
        f"-W {W}", f"-H {H}", f"--steps {steps}", f"--cfg-scale {cfg}", f"-s {seed}", "--sampling-method euler",
        "--scheduler discrete", "--rng cpu"]
    return {"name": name, "prompt": prompt, "negative_prompt": neg or "", "negative_given": neg is not None,
            "seed": seed, "width": W, "height": H, "steps": steps, "cfg_scale": cfg, "sampling_method": "euler",
            "scheduler": "discrete", "timestep_spacing": "leading", "rng": "cpu", "png": f"case_{name}.png",
            "tensors": f"case_{name}.safetensors", "sigmas": [float(x) for x in sched.sigmas],
            "timesteps": [float(x) for x in sched.timesteps], "init_noise_sigma": float(sched.init_noise_sigma),
            "add_time_ids": [float(x) for x in t["add_time_ids"][0]],
            "uncond_is_zero": bool(float(t["uncond"].abs().max()) == 0.0),
            "easel_args": "generate -m sdxl_tiny.safetensors " + " ".join(flags)}


def finite(o):
    if isinstance(o, float) and o != o:
        return "NaN"
    if isinstance(o, float) and o in (float("inf"), float("-inf")):
        return "Infinity" if o > 0 else "-Infinity"
    if isinstance(o, dict):
        return {k: finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [finite(v) for v in o]
    return o


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gz", required=True, help="OpenAI's bpe_simple_vocab_16e6.txt.gz")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=4242)
    ap.add_argument("--keep-folder-weights", action="store_true", help="keep the diffusers folder's weights")
    a = ap.parse_args()
    t0 = time.time()
    torch.set_num_threads(8)
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline

    os.makedirs(a.out, exist_ok=True)
    tok_dir, tok2_dir = os.path.join(a.out, "_tok"), os.path.join(a.out, "_tok2")
    write_tokenizer_files(a.gz, tok_dir)
    write_tokenizer_files(a.gz, tok2_dir)
    for fn in ("special_tokens_map.json", "tokenizer_config.json"):  # SDXL's tokenizer_2 pads with "!" (id 0)
        p = os.path.join(tok2_dir, fn)
        with open(p) as f:
            j = json.load(f)
        j["pad_token"] = "!"
        with open(p, "w") as f:
            json.dump(j, f, indent=1)
    tok, tok2 = load_hf_tokenizer(tok_dir), load_hf_tokenizer(tok2_dir)
    assert tok2.pad_token_id == 0 and tok.pad_token_id == 49407, (tok.pad_token_id, tok2.pad_token_id)
    te, te2, unet, vae = build_models(a.seed)
    pipe = StableDiffusionXLPipeline(vae=vae, text_encoder=te, text_encoder_2=te2, tokenizer=tok, tokenizer_2=tok2,
                                     unet=unet, scheduler=EulerDiscreteScheduler(**SCHED),
                                     force_zeros_for_empty_prompt=True, add_watermarker=False)
    pipe.set_progress_bar_config(disable=True)

    ddir = os.path.join(a.out, "diffusers")
    pipe.to(torch.float16)
    pipe.save_pretrained(ddir, safe_serialization=True)
    pipe.to(torch.float32)
    ldm = single_file(te, te2, unet, vae)
    single = os.path.join(a.out, "sdxl_tiny.safetensors")
    save_file(ldm, single, metadata={"format": "pt", "easel_note": "tiny random SDXL-layout test model (f16)"})
    print(f"single file: {len(ldm)} tensors ({time.time() - t0:.1f}s)")

    mods = module_refs(pipe, a.out)
    cases = []
    for case in CASES:
        cases.append(run_case(pipe, case, a.out))
        print(f"case {case[0]}: done ({time.time() - t0:.1f}s)")

    checks = {}
    try:  # diffusers' own single-file loader with our folder's configs, offline
        sf = StableDiffusionXLPipeline.from_single_file(single, config=ddir, local_files_only=True,
                                                        torch_dtype=torch.float32, add_watermarker=False)
        for name in ("unet", "vae", "text_encoder", "text_encoder_2"):
            msd, ref = getattr(sf, name).state_dict(), getattr(pipe, name).state_dict()
            checks[f"{name}_max_abs_diff"] = max(float((msd[k].float() - v.float()).abs().max())
                                                 for k, v in ref.items() if not k.endswith("position_ids"))
    except Exception as e:  # noqa: BLE001
        checks["from_single_file_error"] = f"{type(e).__name__}: {e}"[:400]
    print("checks:", checks)

    import diffusers
    import transformers

    meta = {"generator": "tools/reference/make_sdxl_pipeline.py", "seed": a.seed, "torch": torch.__version__,
            "diffusers": diffusers.__version__, "transformers": transformers.__version__, "device": "cpu float32",
            "weights": "f16-rounded, run in float32", "single_file": "sdxl_tiny.safetensors",
            "single_file_check": checks, "modules": mods,
            "unet_config": {k: v for k, v in dict(unet.config).items() if not k.startswith("_")},
            "vae_config": {k: v for k, v in dict(vae.config).items() if not k.startswith("_")},
            "scheduler": SCHED, "cases": cases}
    with open(os.path.join(a.out, "cases.json"), "w") as f:
        json.dump(finite(meta), f, indent=1, default=str, allow_nan=False)
    shutil.rmtree(tok_dir)
    shutil.rmtree(tok2_dir)
    if not a.keep_folder_weights:
        for root, _, files in os.walk(ddir):
            for fn in files:
                if not fn.endswith(".json") or fn in ("tokenizer.json", "vocab.json"):
                    os.remove(os.path.join(root, fn))
    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(a.out) for f in fs)
    print(f"sdxl pipeline: done in {time.time() - t0:.1f}s, {total / 1e6:.2f} MB in {a.out}")


if __name__ == "__main__":
    main()
