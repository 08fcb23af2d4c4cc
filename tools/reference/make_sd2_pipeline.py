"""Tiny complete Stable Diffusion 2.x (v-prediction) pipeline (random, seeded weights) and reference generations.

Runs on the GPU machine with diffusers' source on PYTHONPATH (models on the CPU in float32, weights rounded
to f16 values first). Reuses make_sd_pipeline.py's case runner with an SD2.x scheduler (v_prediction).

SD2.x conventions the tiny model keeps, so that everything can be inferred from a single file:
  text encoder  OpenCLIP-style CLIPTextModel: hidden_act gelu, width 64 = 1 head of 64 (CLIP head size 64),
                77 positions, real CLIP vocabulary (49408), tokenizer pad token "!" (id 0, as SD2's tokenizer).
                The original model has 3 layers; like diffusers' conversion of SD2 checkpoints (which drops
                OpenCLIP-H's 24th layer, SD_2_TEXT_ENCODER_KEYS_TO_IGNORE), the diffusers folder stores only the
                first 2 and diffusers uses their last output (final layer norm applied). The single file stores
                all 3 (resblocks.0..2); the "penultimate" layer SD2 uses (ldm FrozenOpenCLIPEmbedder
                layer="penultimate", sd.cpp/A1111 clip skip 2) gives the same conditioning.
  UNet          use_linear_projection=True, block_out_channels (32, 64), attention in the 64-channel level and
                the mid block (like SD2's last level, the first has none), attention_head_dim per block (1, 1)
                (diffusers' naming quirk: head counts) -> head size 64 (SD2's num_head_channels = 64),
                cross_attention_dim 64 = text-encoder width, layers_per_block 1 (small: the repo budget).
  VAE           AutoencoderKL, 4 levels of 32 channels (factor 8), 1 resnet per level, 4 latent channels,
                scaling 0.18215.
  scheduler     prediction_type v_prediction (SD2.x 768-v), scaled_linear betas 0.00085..0.012.

Writes into --out:
  diffusers/                 StableDiffusionPipeline.save_pretrained (f16 weights, tokenizer with pad "!"); with
                             --configs-only-folder only its JSON files are kept (the weights are the single file's,
                             which tests convert back at run time, as diffusers' conversion does: the repo budget)
  sd2_tiny.safetensors       original (ldm) single file, f16: model.diffusion_model.*, first_stage_model.*,
                             cond_stage_model.model.{token_embedding.weight, positional_embedding,
                             transformer.resblocks.N.{ln_1, attn.in_proj_weight/in_proj_bias (fused q|k|v rows),
                             attn.out_proj, ln_2, mlp.c_fc, mlp.c_proj}, ln_final, text_projection ([width, proj]),
                             logit_scale}
  cases.json, case_<name>.png, case_<name>.safetensors   as make_sd_pipeline.py (cond = the folder's
                             conditioning; cond_penultimate_check = the 3-layer model's hidden_states[-2] + final
                             layer norm, which must equal it)
"""

import argparse
import json
import os
import shutil
import sys
import time

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ldm_convert  # noqa: E402
import make_sd_pipeline as msp  # noqa: E402
from dump_clip_tokens import load_hf_tokenizer, write_tokenizer_files  # noqa: E402

msp.SCHED_BASE = dict(msp.SCHED_BASE, prediction_type="v_prediction")
OPENCLIP_PREFIX = "cond_stage_model.model."
TE_LAYERS_ORIGINAL = 3

CASES = [
    # name, mode, prompt, negative, seed, W, H, steps, sampler, karras, cfg
    ("euler_discrete_a_s0", "txt2img", "a photo of a cat", "", 0, 64, 64, 10, "euler", False, 7.5),
    ("euler_karras_b_s1_neg", "txt2img", "a small red circle on the left, blue background",
     "blurry, low quality", 1, 64, 64, 12, "euler", True, 7.5),
    ("dpmpp2m_karras_a_s1_neg_96x64", "txt2img", "a photo of a cat", "ugly, deformed", 1, 96, 64, 10, "dpm++2m",
     True, 5.0),
    ("dpmpp2m_discrete_b_s0", "txt2img", "a small red circle on the left, blue background", "", 0, 64, 64, 10,
     "dpm++2m", False, 7.5),
]


def build_models(seed):
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    def te_cfg(layers):
        return CLIPTextConfig(vocab_size=49408, hidden_size=64, intermediate_size=256, num_hidden_layers=layers,
                              num_attention_heads=1, max_position_embeddings=77, hidden_act="gelu",
                              layer_norm_eps=1e-5, projection_dim=64, bos_token_id=49406, eos_token_id=49407,
                              pad_token_id=0)

    torch.manual_seed(seed)
    te_full = CLIPTextModel(te_cfg(TE_LAYERS_ORIGINAL))
    te = CLIPTextModel(te_cfg(TE_LAYERS_ORIGINAL - 1))
    sd = {k: v for k, v in te_full.state_dict().items()
          if f"encoder.layers.{TE_LAYERS_ORIGINAL - 1}." not in k}
    missing, unexpected = te.load_state_dict(sd, strict=False)
    assert not [k for k in missing if not k.endswith("position_ids")] and not unexpected, (missing, unexpected)
    torch.manual_seed(seed + 1)
    unet = UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
                                block_out_channels=(32, 64),
                                down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                                up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
                                cross_attention_dim=64, attention_head_dim=(1, 1), use_linear_projection=True,
                                norm_num_groups=32)
    torch.manual_seed(seed + 2)
    vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
                        up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(32, 32, 32, 32),
                        layers_per_block=1, latent_channels=4, norm_num_groups=32, sample_size=64,
                        scaling_factor=0.18215)
    g = torch.Generator().manual_seed(seed + 3)
    text_projection = torch.randn(64, 64, generator=g) * 0.1  # OpenCLIP [width, projection]; unused by SD2
    with torch.no_grad():
        for m in (te_full, te, unet, vae):
            for p in m.parameters():
                p.copy_(p.half().float())
            m.eval()
    return te_full, te, unet, vae, text_projection.half().float()


def te_to_openclip(sd, text_projection):
    """HF CLIPTextModel state dict -> OpenCLIP names under cond_stage_model.model. (the inverse of diffusers'
    convert_open_clip_checkpoint: q/k/v fused into in_proj rows q|k|v, fc1/fc2 -> mlp.c_fc/c_proj)."""
    P = OPENCLIP_PREFIX
    # transformers 5 may drop the "text_model." prefix from CLIPTextModel's state dict: accept both
    sd = {(k if k.startswith("text_model.") else "text_model." + k): v for k, v in sd.items()}
    out = {P + "token_embedding.weight": sd["text_model.embeddings.token_embedding.weight"],
           P + "positional_embedding": sd["text_model.embeddings.position_embedding.weight"],
           P + "ln_final.weight": sd["text_model.final_layer_norm.weight"],
           P + "ln_final.bias": sd["text_model.final_layer_norm.bias"],
           P + "text_projection": text_projection, P + "logit_scale": torch.tensor(4.6052)}
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gz", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=2222)
    ap.add_argument("--configs-only-folder", action="store_true",
                    help="after the runs, keep only the JSON files of diffusers/ (drop its weights and tokenizer.json)")
    a = ap.parse_args()
    t0 = time.time()
    torch.set_num_threads(8)
    from diffusers import StableDiffusionPipeline

    os.makedirs(a.out, exist_ok=True)
    tok_dir = os.path.join(a.out, "_tok")
    write_tokenizer_files(a.gz, tok_dir)
    # SD2.x's tokenizer pads with "!" (id 0), as OpenCLIP does
    for fn in ("special_tokens_map.json", "tokenizer_config.json"):
        p = os.path.join(tok_dir, fn)
        with open(p) as f:
            j = json.load(f)
        j["pad_token"] = "!"
        with open(p, "w") as f:
            json.dump(j, f, indent=1)
    tok = load_hf_tokenizer(tok_dir)
    assert tok.pad_token_id == 0, tok.pad_token_id
    te_full, te, unet, vae, text_projection = build_models(a.seed)
    comps = dict(vae=vae, text_encoder=te, tokenizer=tok, unet=unet, scheduler=msp.make_scheduler("euler", False),
                 safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    pipe = StableDiffusionPipeline(**comps)
    pipe.set_progress_bar_config(disable=True)
    pipes = {"txt2img": pipe}

    ddir = os.path.join(a.out, "diffusers")
    pipe.to(torch.float16)
    pipe.save_pretrained(ddir, safe_serialization=True)
    pipe.to(torch.float32)
    # single file: UNet + VAE via ldm_convert, text encoder in OpenCLIP layout with all 3 layers
    ldm = {}
    ldm.update(ldm_convert.unet_to_ldm(unet.state_dict(), unet.config))
    ldm.update(ldm_convert.vae_to_ldm(vae.state_dict(), vae.config))
    ldm.update(te_to_openclip(te_full.state_dict(), text_projection))
    ldm = {k: (v.detach().half() if v.is_floating_point() else v).contiguous() for k, v in ldm.items()}
    single = os.path.join(a.out, "sd2_tiny.safetensors")
    save_file(ldm, single, metadata={"format": "pt", "easel_note": "tiny random SD2.x-layout (v) test model (f16)"})

    checks = {}
    # (a) diffusers' own OpenCLIP conversion restores the HF names (all 3 layers: its ignore list names layer 23)
    try:
        from diffusers.loaders.single_file_utils import convert_open_clip_checkpoint

        conv = convert_open_clip_checkpoint(te_full, {k: v.float() for k, v in ldm.items()})
        ref = {(k if k.startswith("text_model.") else "text_model." + k): v
               for k, v in te_full.state_dict().items() if not k.endswith("position_ids")}
        checks["open_clip_convert_keys_equal"] = set(conv) == set(ref)
        checks["open_clip_convert_max_abs_diff"] = max(float((conv[k].float() - ref[k]).abs().max()) for k in ref)
    except Exception as e:  # noqa: BLE001
        checks["open_clip_convert_error"] = f"{type(e).__name__}: {e}"[:400]

    rec = msp.RngRecorder()
    cases = []
    for case in CASES:
        c, img = msp.run_case(pipes, rec, case, a.out, None, None)
        # (b) the penultimate layer of the 3-layer original encoder + final layer norm = the folder's conditioning
        ids = torch.tensor([tok(case[2], padding="max_length", max_length=77, truncation=True)["input_ids"]])
        with torch.no_grad():
            hs = te_full(input_ids=ids, output_hidden_states=True).hidden_states
            pen = getattr(te_full, "text_model", te_full).final_layer_norm(hs[-2])
        from safetensors.torch import load_file

        tp = os.path.join(a.out, c["tensors"])
        t = load_file(tp)
        c["penultimate_vs_folder_cond_max_abs_diff"] = float((pen[0] - t["cond"][0]).abs().max())
        c["mode"] = "txt2img"
        flags = msp.sd_cli_flags(c)
        c["easel_args"] = "generate -m diffusers " + flags
        c["easel_args_single_file"] = "generate -m sd2_tiny.safetensors --prediction v " + flags
        c["sd_cli_args"] = "-m sd2_tiny.safetensors --prediction v " + flags
        cases.append(c)
        print(f"case {c['name']}: done ({time.time() - t0:.1f}s), penultimate check "
              f"{c['penultimate_vs_folder_cond_max_abs_diff']:.3g}")

    # (c) diffusers' single-file loader for the UNet and VAE with our folder's config, offline
    try:
        from diffusers import AutoencoderKL, UNet2DConditionModel

        for name, cls, m in (("unet", UNet2DConditionModel, unet), ("vae", AutoencoderKL, vae)):
            sm = cls.from_single_file(single, config=ddir, subfolder=name, local_files_only=True,
                                      torch_dtype=torch.float32)
            msd = sm.state_dict()
            checks[f"from_single_file_{name}_max_abs_diff"] = max(
                float((msd[k].float() - v.float()).abs().max()) for k, v in m.state_dict().items())
    except Exception as e:  # noqa: BLE001
        checks["from_single_file_error"] = f"{type(e).__name__}: {e}"[:400]
    print("checks:", checks)

    import diffusers
    import transformers

    meta = {"generator": "tools/reference/make_sd2_pipeline.py", "seed": a.seed, "torch": torch.__version__,
            "diffusers": diffusers.__version__, "transformers": transformers.__version__, "device": "cpu float32",
            "weights": "f16-rounded, run in float32", "single_file": "sd2_tiny.safetensors", "checks": checks,
            "ldm_tensors": len(ldm), "prediction_type": "v_prediction",
            "text_encoder_config": {k: v for k, v in te.config.to_dict().items()
                                    if k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                             "num_attention_heads", "max_position_embeddings", "hidden_act",
                                             "layer_norm_eps", "pad_token_id")},
            "text_encoder_layers_single_file": TE_LAYERS_ORIGINAL,
            "unet_config": {k: v for k, v in dict(unet.config).items() if not k.startswith("_")},
            "vae_config": {k: v for k, v in dict(vae.config).items() if not k.startswith("_")},
            "vae_scale_factor": 8, "pad_token_id": 0,
            "clip_skip": "folder: 1 (last of its 2 layers); single file: 2 (penultimate of 3), same conditioning",
            "text_encoder_output": "last_hidden_state (final layer norm)", "cases": cases}
    with open(os.path.join(a.out, "cases.json"), "w") as f:
        json.dump(msp_finite(meta), f, indent=1, default=str, allow_nan=False)
    shutil.rmtree(tok_dir)
    if a.configs_only_folder:
        for root, _, files in os.walk(ddir):
            for fn in files:
                if not fn.endswith(".json") or fn == "tokenizer.json":
                    os.remove(os.path.join(root, fn))
    print(f"sd2 pipeline: done in {time.time() - t0:.1f}s")


def msp_finite(o):
    """Strict JSON: non-finite floats (scheduler configs hold -inf) become strings."""
    if isinstance(o, float) and o != o:
        return "NaN"
    if isinstance(o, float) and o in (float("inf"), float("-inf")):
        return "Infinity" if o > 0 else "-Infinity"
    if isinstance(o, dict):
        return {k: msp_finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [msp_finite(v) for v in o]
    return o


if __name__ == "__main__":
    main()
