"""LoRA and textual-inversion references for easel's parity tests (issue 21), made with peft + diffusers
on the tiny test pipelines of tests/data/reference/{sd_tiny,zimage_tiny,flux1_tiny,klein_tiny}.

Run on the GPU machine from the repository root (the models run on the CPU in float32, as the pipeline
scripts do), with diffusers' source either in .diffusers/ or unpacked by tools/reference/device_setup.sh:

    python3 tools/reference/make_lora_refs.py --out $OUT/lora

The committed flux1/zimage/klein diffusers folders hold no tokenizer.json (easel ships the vocabularies): the
pipelines load from copies under /tmp with the tokenizers restored from models/tokenizers/ (Qwen3, T5) and
sd_tiny's CLIP tokenizer, and each family's image without the LoRA must equal its committed e2e PNG within
3/255 (asserted), so the LoRA images are those of the e2e cases.

Writes into --out (all small; the lead copies the folder to tests/data/reference/lora/):
  <fam>_lora_diffusers.safetensors  the LoRA as diffusers saves it (save_lora_weights: "unet." /
                                    "text_encoder." / "transformer." prefixes, PEFT lora_A / lora_B, the
                                    adapter configs in the "lora_adapter_metadata" entry: lora_alpha 8)
  <fam>_lora_kohya.safetensors      the same LoRA in the other common layout of the family, converted here
                                    exactly (fused layers get the pieces' down matrices stacked and their up
                                    matrices block-diagonal, alpha scaled with the rank so alpha/rank stays):
                                      sd:     kohya sd-scripts (lora_unet_/lora_te_ + diffusers names, .alpha)
                                      flux1:  kohya FLUX (lora_unet_ + BFL names: double_blocks.N.img_attn.qkv,
                                              single_blocks.N.linear1/linear2, final_layer... with norm_out's
                                              halves swapped to BFL's (shift, scale) order)
                                      zimage: kohya with the original names (layers.N.attention.qkv / .out)
                                      klein:  ComfyUI / ai-toolkit (diffusion_model. + BFL names, lora_A/lora_B)
  <fam>_w<weight>.png / .safetensors the image of the family's first e2e case (same prompt, seed, size, steps,
                                    settings as <fam>_tiny/cases.json) with the LoRA loaded through
                                    pipe.load_lora_weights + pipe.set_adapters([..], [weight]) at weights 1.0
                                    and 0.6; the tensors file holds "image" [1, 3, H, W] in [0, 1] and
                                    "final_latent"
  ti_tinyemb.safetensors, ti_*.png  textual inversion on sd_tiny: an A1111-form embedding ("emb_params",
                                    2 vectors of the tiny CLIP's width 64) loaded with load_textual_inversion
                                    (token "tinyemb"), the image of "a photo of tinyemb cat" and its
                                    conditioning ("cond": encode_prompt's prompt_embeds)
  module_refs.safetensors           module-level peft references on one Linear(16, 12): LoHa, LoKr and DoRA
                                    adapters in LyCORIS / kohya naming ("loha.*", "lokr.*", "dora.*"), the
                                    base weight and bias, the input x [5, 16] and peft's output y [5, 12]
  lora_refs.json                    everything above: cases, easel flags, adapter configs, checks
                                    (max |image - base image| per weight, so the LoRA visibly matters; the
                                    kohya file loaded by diffusers' own converters where it has one)

LoRA weights are random (seeded) and rounded to f16-representable values; lora_B is non-zero so the
LoRA changes the image. Rank 4, alpha 8 (scale 2) for every family.
"""

import argparse
import json
import math
import os
import sys
import time

if os.path.isdir(".diffusers"):
    sys.path.insert(0, ".diffusers")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

REF = "tests/data/reference"
RANK, ALPHA = 4, 8.0
WEIGHTS = (1.0, 0.6)

SD_UNET_TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "proj_in", "proj_out", "ff.net.0.proj", "ff.net.2", "conv1", "conv2",
                   "time_emb_proj"]
SD_TE_TARGETS = ["q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"]
FLUX1_TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out", "ff.net.0.proj",
                 "ff.net.2", "ff_context.net.0.proj", "ff_context.net.2", "norm1.linear", "norm1_context.linear", "norm.linear",
                 "proj_mlp", "proj_out", "norm_out.linear", "x_embedder", "context_embedder"]
ZIMAGE_TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "w1", "w2", "w3", "adaLN_modulation.0"]
KLEIN_TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out", "ff.linear_in",
                 "ff.linear_out", "ff_context.linear_in", "ff_context.linear_out", "to_qkv_mlp_proj", "attn.to_out"]


def image_to_png(img01, path):
    """[H, W, 3] numpy in [0, 1] -> PNG with diffusers' rounding ((x * 255).round())."""
    Image.fromarray((img01 * 255).round().astype("uint8")).save(path)


def randomize_lora(model, seed, adapter):
    """lora_A ~ N(0, 1/fan_in), lora_B ~ N(0, 0.5/r) (f16-rounded): a LoRA that changes the output visibly."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if f".{adapter}." not in n and not n.endswith(f".{adapter}.weight"):
                continue
            if "lora_A" in n:
                fan = p[0].numel()
                p.copy_((torch.randn(p.shape, generator=g) / math.sqrt(fan)).half().float())
            elif "lora_B" in n:
                p.copy_((torch.randn(p.shape, generator=g) * (0.5 / math.sqrt(RANK))).half().float())


def peft_lora(model, targets, seed):
    """Adds a rank-4 LoRA (alpha 8) to `model`, randomises it, returns its PEFT state dict, removes it."""
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    # the suffixes resolved to full names of Linear / Conv2d modules only (a suffix such as "attn.to_out"
    # would also name FLUX.2's double-block ModuleList, which peft cannot wrap)
    full = sorted(n for n, mod in model.named_modules()
                  if isinstance(mod, (torch.nn.Linear, torch.nn.Conv2d)) and any(n == t or n.endswith("." + t) for t in targets))
    assert full, f"no module of {type(model).__name__} matches {targets}"
    cfg = LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=full, init_lora_weights=True)
    model.add_adapter(cfg, adapter_name="mk")
    randomize_lora(model, seed, "mk")
    sd = {k: v.detach().float().clone() for k, v in get_peft_model_state_dict(model, adapter_name="mk").items()}
    if hasattr(model, "delete_adapters"):
        model.delete_adapters("mk")
    else:
        model.delete_adapter("mk")
    meta = {k: (sorted(v) if isinstance(v, set) else v) for k, v in cfg.to_dict().items()}
    return sd, meta


def block_diag_fuse(parts):
    """[(A_i [r, in], B_i [out_i, r])] -> (A [n r, in], B [sum out_i, n r]): one LoRA equal to the pieces stacked by rows."""
    A = torch.cat([a for a, _ in parts], 0)
    B = torch.block_diag(*[b for _, b in parts])
    return A, B


def modules_of(sd, prefix):
    """PEFT state dict -> {module: (A, B)} for keys under prefix ("" for all)."""
    out = {}
    for k, v in sd.items():
        if not k.startswith(prefix):
            continue
        k = k[len(prefix):]
        for tag, i in ((".lora_A.weight", 0), (".lora_B.weight", 1)):
            if k.endswith(tag):
                out.setdefault(k[: -len(tag)], [None, None])[i] = v
    return {m: (ab[0], ab[1]) for m, ab in out.items()}


def kohya_pairs(pairs, prefix, alpha_per_rank):
    """{name: (A, B)} -> kohya keys with prefix + name.replace('.', '_'), lora_down/lora_up/alpha."""
    d = {}
    for name, (A, B) in pairs.items():
        k = prefix + name.replace(".", "_")
        d[k + ".lora_down.weight"] = A.contiguous()
        d[k + ".lora_up.weight"] = B.contiguous()
        d[k + ".alpha"] = torch.tensor(alpha_per_rank * A.shape[0])
    return d


# ------------------------------------------------------------------------------- conversions

def sd_to_kohya(sd):
    pairs = {}
    for k, v in modules_of(sd, "unet.").items():
        pairs["unet|" + k] = v
    for k, v in modules_of(sd, "text_encoder.").items():
        pairs["te|" + k] = v
    out = {}
    out.update(kohya_pairs({k[5:]: v for k, v in pairs.items() if k.startswith("unet|")}, "lora_unet_", ALPHA / RANK))
    out.update(kohya_pairs({k[3:]: v for k, v in pairs.items() if k.startswith("te|")}, "lora_te_", ALPHA / RANK))
    return out


def flux1_to_kohya(sd, n_double, n_single, hidden):
    m = modules_of(sd, "transformer.")
    pairs = {}
    for i in range(n_double):
        t, b = f"transformer_blocks.{i}.", f"double_blocks.{i}."
        pairs[b + "img_attn.qkv"] = block_diag_fuse([m.pop(t + f"attn.to_{x}") for x in "qkv"])
        pairs[b + "txt_attn.qkv"] = block_diag_fuse([m.pop(t + f"attn.add_{x}_proj") for x in "qkv"])
        for d, bf in (("attn.to_out.0", "img_attn.proj"), ("attn.to_add_out", "txt_attn.proj"), ("ff.net.0.proj", "img_mlp.0"),
                      ("ff.net.2", "img_mlp.2"), ("ff_context.net.0.proj", "txt_mlp.0"), ("ff_context.net.2", "txt_mlp.2"),
                      ("norm1.linear", "img_mod.lin"), ("norm1_context.linear", "txt_mod.lin")):
            pairs[b + bf] = m.pop(t + d)
    for i in range(n_single):
        t, b = f"single_transformer_blocks.{i}.", f"single_blocks.{i}."
        pairs[b + "linear1"] = block_diag_fuse([m.pop(t + f"attn.to_{x}") for x in "qkv"] + [m.pop(t + "proj_mlp")])
        pairs[b + "linear2"] = m.pop(t + "proj_out")
        pairs[b + "modulation.lin"] = m.pop(t + "norm.linear")
    A, B = m.pop("norm_out.linear")
    pairs["final_layer.adaLN_modulation.1"] = (A, torch.cat([B[hidden:], B[:hidden]], 0))  # (scale, shift) -> (shift, scale)
    pairs["final_layer.linear"] = m.pop("proj_out")
    pairs["img_in"] = m.pop("x_embedder")
    pairs["txt_in"] = m.pop("context_embedder")
    assert not m, f"unconverted FLUX.1 modules: {sorted(m)}"
    return kohya_pairs(pairs, "lora_unet_", ALPHA / RANK)


def zimage_to_kohya(sd):
    m = modules_of(sd, "transformer.") or modules_of(sd, "")
    pairs = {}
    for name in sorted({k.rsplit(".attention.", 1)[0] for k in m if ".attention." in k}):
        pairs[name + ".attention.qkv"] = block_diag_fuse([m.pop(name + f".attention.to_{x}") for x in "qkv"])
        pairs[name + ".attention.out"] = m.pop(name + ".attention.to_out.0")
    pairs.update(m)
    return kohya_pairs(pairs, "lora_unet_", ALPHA / RANK)


def klein_to_comfy(sd, n_double, n_single):
    m = modules_of(sd, "transformer.")
    pairs = {}
    for i in range(n_double):
        t, b = f"transformer_blocks.{i}.", f"double_blocks.{i}."
        pairs[b + "img_attn.qkv"] = block_diag_fuse([m.pop(t + f"attn.to_{x}") for x in "qkv"])
        pairs[b + "txt_attn.qkv"] = block_diag_fuse([m.pop(t + f"attn.add_{x}_proj") for x in "qkv"])
        for d, bf in (("attn.to_out.0", "img_attn.proj"), ("attn.to_add_out", "txt_attn.proj"), ("ff.linear_in", "img_mlp.0"),
                      ("ff.linear_out", "img_mlp.2"), ("ff_context.linear_in", "txt_mlp.0"), ("ff_context.linear_out", "txt_mlp.2")):
            pairs[b + bf] = m.pop(t + d)
    for i in range(n_single):
        t, b = f"single_transformer_blocks.{i}.", f"single_blocks.{i}."
        pairs[b + "linear1"] = m.pop(t + "attn.to_qkv_mlp_proj")
        pairs[b + "linear2"] = m.pop(t + "attn.to_out")
    assert not m, f"unconverted FLUX.2 modules: {sorted(m)}"
    out = {}
    for name, (A, B) in pairs.items():
        out[f"diffusion_model.{name}.lora_A.weight"] = A.contiguous()
        out[f"diffusion_model.{name}.lora_B.weight"] = B.contiguous()
        out[f"diffusion_model.{name}.alpha"] = torch.tensor(ALPHA / RANK * A.shape[0])
    return out


# ------------------------------------------------------------------------------- runs

def load_case(fam):
    with open(os.path.join(REF, f"{fam}_tiny" if fam != "sd" else "sd_tiny", "cases.json")) as f:
        return json.load(f)["cases"][0]


def run_pipe(fam, pipe, case, prompt=None):
    gen = torch.Generator("cpu").manual_seed(case["seed"])
    kw = dict(prompt=prompt or case["prompt"], height=case["height"], width=case["width"], num_inference_steps=case["steps"],
              generator=gen, output_type="np")
    steps_lat = []

    def cb(p, i, ts, k):
        steps_lat.append(k["latents"].detach().float().clone())
        return k

    kw["callback_on_step_end"] = cb
    if fam == "sd":
        kw["guidance_scale"] = case["cfg_scale"]
        if case.get("negative_prompt"):
            kw["negative_prompt"] = case["negative_prompt"]
    elif fam == "flux1":
        kw["guidance_scale"] = case["guidance"]
        kw["max_sequence_length"] = 512
    else:  # zimage, klein
        kw["guidance_scale"] = case["diffusers_guidance_scale"]
    with torch.no_grad():
        img = pipe(**kw).images[0]
    return img, steps_lat[-1]


def set_weight(pipe, w):
    pipe.set_adapters(["ref"], adapter_weights=[w])


# the tokenizer.json files the committed diffusers folders leave out (easel ships the vocabularies): without
# them transformers builds a tokenizer that gives other token ids, and the images are not the e2e cases'
TOKENIZER_FILES = {
    "flux1": {"tokenizer": os.path.join(REF, "sd_tiny", "diffusers", "tokenizer", "tokenizer.json"),
              "tokenizer_2": "models/tokenizers/t5/tokenizer.json.gz"},
    "zimage": {"tokenizer": "models/tokenizers/qwen3/tokenizer.json.gz"},
    "klein": {"tokenizer": "models/tokenizers/qwen3/tokenizer.json.gz"},
}


def pipeline_folder(fam):
    """The family's committed diffusers folder, or for flux1 / zimage / klein a copy of it under /tmp with the
    tokenizer.json files restored (as make_{flux,zimage,klein}_pipeline.py's folder-reload checks do)."""
    import gzip
    import shutil

    folder = os.path.join(REF, "sd_tiny" if fam == "sd" else f"{fam}_tiny", "diffusers")
    if fam not in TOKENIZER_FILES:
        return folder
    tmp = f"/tmp/lora_refs_{fam}_pipeline"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(folder, tmp)
    for sub, src in TOKENIZER_FILES[fam].items():
        dst = os.path.join(tmp, sub, "tokenizer.json")
        if src.endswith(".gz"):
            with gzip.open(src, "rb") as f, open(dst, "wb") as g:
                g.write(f.read())
        else:
            shutil.copy(src, dst)
    return tmp


def family(fam, a, meta):
    from diffusers import DiffusionPipeline, EulerDiscreteScheduler

    folder = pipeline_folder(fam)
    pipe = DiffusionPipeline.from_pretrained(folder, torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    case = load_case(fam)
    if fam == "sd":
        cfg = case["diffusers_scheduler_config"]
        assert case["diffusers_scheduler"] == "EulerDiscreteScheduler", case["diffusers_scheduler"]
        pipe.scheduler = EulerDiscreteScheduler.from_config(cfg)
    base_img, _ = run_pipe(fam, pipe, case)
    ref_png = os.path.join(REF, "sd_tiny" if fam == "sd" else f"{fam}_tiny", case["png"])
    base_vs_committed = float(np.abs(np.asarray(Image.open(ref_png), np.float32) / 255.0 - base_img).max())
    # the LoRA images are only references if the pipeline without the LoRA still gives the committed e2e image
    assert base_vs_committed <= 3.0 / 255, f"{fam}: the base image differs from {ref_png} by {base_vs_committed * 255:.1f}/255"

    seed = {"sd": 11, "flux1": 12, "zimage": 13, "klein": 14}[fam]
    info = {"case": case["name"], "prompt": case["prompt"], "seed": case["seed"], "width": case["width"],
            "height": case["height"], "steps": case["steps"], "easel_args": case["easel_args"],
            "base_image_vs_committed_png_max_abs_diff": base_vs_committed}
    if fam == "sd":
        unet_sd, ucfg = peft_lora(pipe.unet, SD_UNET_TARGETS, seed)
        te_sd, tcfg = peft_lora(pipe.text_encoder, SD_TE_TARGETS, seed + 100)
        # the adapter configs go into the file's "lora_adapter_metadata" (lora_alpha 8: scale 2), as diffusers'
        # training scripts save them
        pipe.save_lora_weights(a.out, unet_lora_layers=unet_sd, text_encoder_lora_layers=te_sd,
                               unet_lora_adapter_metadata=ucfg, text_encoder_lora_adapter_metadata=tcfg,
                               weight_name=f"{fam}_lora_diffusers.safetensors")
        info["adapters"] = {"unet": ucfg, "text_encoder": tcfg}
    else:
        tr = pipe.transformer
        targets = {"flux1": FLUX1_TARGETS, "zimage": ZIMAGE_TARGETS, "klein": KLEIN_TARGETS}[fam]
        tr_sd, tcfg = peft_lora(tr, targets, seed)
        pipe.save_lora_weights(a.out, transformer_lora_layers=tr_sd, transformer_lora_adapter_metadata=tcfg,
                               weight_name=f"{fam}_lora_diffusers.safetensors")
        info["adapters"] = {"transformer": tcfg}
    dpath = os.path.join(a.out, f"{fam}_lora_diffusers.safetensors")
    saved = load_file(dpath)
    tcfg_model = dict(pipe.transformer.config) if fam != "sd" else {}
    if fam == "sd":
        kohya = sd_to_kohya(saved)
    elif fam == "flux1":
        kohya = flux1_to_kohya(saved, tcfg_model["num_layers"], tcfg_model["num_single_layers"],
                               tcfg_model["num_attention_heads"] * tcfg_model["attention_head_dim"])
    elif fam == "zimage":
        kohya = zimage_to_kohya(saved)
    else:
        kohya = klein_to_comfy(saved, tcfg_model["num_layers"], tcfg_model["num_single_layers"])
    kpath = os.path.join(a.out, f"{fam}_lora_kohya.safetensors")
    save_file(kohya, kpath, metadata={"easel_note": f"tiny {fam} LoRA converted from {fam}_lora_diffusers.safetensors"})
    info["files"] = {"diffusers": os.path.basename(dpath), "kohya": os.path.basename(kpath),
                     "diffusers_tensors": len(saved), "kohya_tensors": len(kohya)}

    # a folder + weight_name: with HF_HUB_OFFLINE diffusers does not guess a file name
    pipe.load_lora_weights(a.out, weight_name=os.path.basename(dpath), adapter_name="ref")
    info["images"] = {}
    for w in WEIGHTS:
        set_weight(pipe, w)
        img, lat = run_pipe(fam, pipe, case)
        name = f"{fam}_w{w}"
        image_to_png(img, os.path.join(a.out, name + ".png"))
        save_file({"image": torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1)[None].float().contiguous(),
                   "final_latent": lat.contiguous()}, os.path.join(a.out, name + ".safetensors"))
        info["images"][str(w)] = {"png": name + ".png", "tensors": name + ".safetensors",
                                  "max_abs_diff_vs_base": float(np.abs(img - base_img).max()),
                                  "easel_lora_flag": f"--lora {fam}_lora_diffusers.safetensors:{w}"}
    pipe.unload_lora_weights()
    # diffusers' own converters on the kohya form (where it has them): the same image at weight 1
    try:
        pipe.load_lora_weights(a.out, weight_name=os.path.basename(kpath), adapter_name="ref")
        set_weight(pipe, 1.0)
        img, _ = run_pipe(fam, pipe, case)
        first = np.asarray(Image.open(os.path.join(a.out, f"{fam}_w1.0.png")), np.float32) / 255.0
        info["kohya_loaded_by_diffusers_max_abs_diff"] = float(np.abs(img - first).max())
        pipe.unload_lora_weights()
    except Exception as e:  # noqa: BLE001
        info["kohya_loaded_by_diffusers"] = f"not loadable by diffusers: {type(e).__name__}: {e}"[:300]
        try:
            pipe.unload_lora_weights()
        except Exception:  # noqa: BLE001
            pass
    meta["families"][fam] = info
    print(f"{fam}: done")


def textual_inversion(a, meta):
    from diffusers import EulerDiscreteScheduler, StableDiffusionPipeline

    pipe = StableDiffusionPipeline.from_pretrained(os.path.join(REF, "sd_tiny", "diffusers"), torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    case = load_case("sd")
    pipe.scheduler = EulerDiscreteScheduler.from_config(case["diffusers_scheduler_config"])
    table = pipe.text_encoder.get_input_embeddings().weight.detach()
    g = torch.Generator().manual_seed(21)
    vec = (torch.randn((2, table.shape[1]), generator=g) * table.std()).half().float()
    path = os.path.join(a.out, "ti_tinyemb.safetensors")
    save_file({"emb_params": vec.contiguous()}, path)
    pipe.load_textual_inversion(path, token="tinyemb")
    prompt = "a photo of tinyemb cat"
    with torch.no_grad():
        cond, _ = pipe.encode_prompt(prompt, "cpu", 1, False)
    img, lat = run_pipe("sd", pipe, case, prompt=prompt)
    image_to_png(img, os.path.join(a.out, "ti_tinyemb.png"))
    conv = pipe.maybe_convert_prompt(prompt, pipe.tokenizer)
    ids = pipe.tokenizer(conv, padding="max_length", max_length=77, truncation=True)["input_ids"]
    save_file({"cond": cond[0].float().contiguous(), "image": torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1)[None].float().contiguous(),
               "final_latent": lat.contiguous(), "input_ids": torch.tensor(ids, dtype=torch.int32)},
              os.path.join(a.out, "ti_tinyemb_case.safetensors"))
    meta["textual_inversion"] = {"embedding": "ti_tinyemb.safetensors", "token": "tinyemb", "vectors": 2, "prompt": prompt,
                                 "converted_prompt": conv, "png": "ti_tinyemb.png", "tensors": "ti_tinyemb_case.safetensors",
                                 "case": case["name"], "seed": case["seed"],
                                 "easel_args": case["easel_args"].replace(f'-p "{case["prompt"]}"', f'-p "{prompt}"') + " --embd-dir DIR"}
    print("textual inversion: done")


def module_refs(a, meta):
    """LoHa, LoKr and DoRA on one Linear(16, 12) with peft, saved in LyCORIS / kohya naming."""
    from peft import LoHaConfig, LoKrConfig, LoraConfig, get_peft_model

    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = torch.nn.Linear(16, 12)

        def forward(self, x):
            return self.m(x)

    torch.manual_seed(31)
    base = Wrap()
    with torch.no_grad():
        for p in base.parameters():
            p.copy_(p.half().float())
    x = torch.randn(5, 16, generator=torch.Generator().manual_seed(32)).half().float()
    out = {"base.weight": base.m.weight.detach().clone(), "base.bias": base.m.bias.detach().clone(), "x": x}
    cfgs = {"loha": LoHaConfig(r=4, alpha=2.0, target_modules=["m"], init_weights=False),
            # r = 1 keeps lokr_w2 factored (peft keeps it whole once r >= max(factor)/2, and then scales by
            # alpha / r where LyCORIS and ComfyUI use 1)
            "lokr": LoKrConfig(r=1, alpha=2.0, target_modules=["m"], init_weights=False, decompose_both=False),
            "dora": LoraConfig(r=4, lora_alpha=8.0, target_modules=["m"], use_dora=True, init_lora_weights=True)}
    info = {}
    for name, cfg in cfgs.items():
        import copy

        model = get_peft_model(copy.deepcopy(base), cfg)
        g = torch.Generator().manual_seed(40 + len(info))
        with torch.no_grad():
            for n, p in model.named_parameters():
                if any(t in n for t in ("hada_", "lokr_", "lora_A", "lora_B")):
                    p.copy_((torch.randn(p.shape, generator=g) * 0.3).half().float())
                if "lora_magnitude_vector" in n:
                    p.copy_((p * (1.0 + 0.2 * torch.randn(p.shape, generator=g))).half().float())
        model.eval()
        with torch.no_grad():
            y = model(x)
        out[f"{name}.y"] = y.detach().clone()
        kept = []
        for n, p in model.named_parameters():
            if ".default" not in n:
                continue
            short = n.split(".m.", 1)[1].replace(".default", "")  # e.g. hada_w1_a, lora_A.weight, lora_magnitude_vector.weight
            out[f"{name}.m.{short}"] = p.detach().clone()
            kept.append(short)
        alpha = cfg.alpha if hasattr(cfg, "alpha") and name != "dora" else cfg.lora_alpha
        out[f"{name}.m.alpha"] = torch.tensor(float(alpha))
        info[name] = {"config": {k: (v if isinstance(v, (int, float, str, bool, type(None))) else str(v))
                                 for k, v in cfg.to_dict().items() if k in ("r", "alpha", "lora_alpha", "use_dora",
                                                                             "decompose_both", "decompose_factor",
                                                                             "rank_dropout", "module_dropout")},
                      "tensors": kept, "y_max_abs_diff_vs_base": float((y - base(x)).abs().max())}
    save_file({k: v.contiguous().float() for k, v in out.items()}, os.path.join(a.out, "module_refs.safetensors"))
    meta["module_refs"] = info
    print("module refs: done")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--families", default="sd,flux1,zimage,klein")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.set_num_threads(8)
    t0 = time.time()
    import diffusers
    import peft
    import transformers

    meta = {"generator": "tools/reference/make_lora_refs.py", "torch": torch.__version__, "diffusers": diffusers.__version__,
            "transformers": transformers.__version__, "peft": peft.__version__, "device": "cpu float32",
            "rank": RANK, "alpha": ALPHA, "weights": list(WEIGHTS), "families": {}}
    for fam in a.families.split(","):
        family(fam, a, meta)
    textual_inversion(a, meta)
    module_refs(a, meta)
    with open(os.path.join(a.out, "lora_refs.json"), "w") as f:
        json.dump(meta, f, indent=1, default=str)
    total = sum(os.path.getsize(os.path.join(a.out, n)) for n in os.listdir(a.out))
    print(f"lora refs: {len(os.listdir(a.out))} files, {total} bytes, {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
