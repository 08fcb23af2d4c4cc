"""Key-name conversion between diffusers state dicts and the original (ldm / CompVis) single-file
Stable Diffusion 1.x layout.

Our own implementation, written from the mapping facts documented in diffusers'
scripts/convert_diffusers_to_original_stable_diffusion.py and loaders/single_file_utils.py, but
generalised to any number of levels (len(block_out_channels)) and layers_per_block, so tiny
models convert too.

ldm layout (prefixes):
  model.diffusion_model.*                      UNet (openaimodel.UNetModel)
  first_stage_model.*                          VAE (AutoencoderKL: encoder/decoder/quant_conv/post_quant_conv)
  cond_stage_model.transformer.text_model.*    CLIP text encoder (HF CLIPTextModel names, unchanged)

UNet (L levels, n = layers_per_block):
  conv_in                              -> input_blocks.0.0
  down_blocks.i.resnets.j              -> input_blocks.{(n+1)*i + j + 1}.0
  down_blocks.i.attentions.j           -> input_blocks.{(n+1)*i + j + 1}.1
  down_blocks.i.downsamplers.0.conv    -> input_blocks.{(n+1)*(i+1)}.0.op        (i < L-1)
  mid_block.resnets.0 / attentions.0 / resnets.1 -> middle_block.0 / .1 / .2
  up_blocks.i.resnets.j                -> output_blocks.{(n+1)*i + j}.0           (j in 0..n)
  up_blocks.i.attentions.j             -> output_blocks.{(n+1)*i + j}.1
  up_blocks.i.upsamplers.0.conv        -> output_blocks.{(n+1)*i + n}.{2 if block i has attention else 1}.conv
  time_embedding.linear_1/2            -> time_embed.0 / time_embed.2
  conv_norm_out / conv_out             -> out.0 / out.2
  inside resnets: norm1->in_layers.0, conv1->in_layers.2, norm2->out_layers.0, conv2->out_layers.3,
                  time_emb_proj->emb_layers.1, conv_shortcut->skip_connection
  Transformer2DModel internals keep their names (norm, proj_in, transformer_blocks.*, proj_out).

VAE (L levels, n = layers_per_block; decoder has n+1 resnets per level and is numbered in reverse):
  encoder.down_blocks.i.resnets.j      -> encoder.down.i.block.j
  encoder.down_blocks.i.downsamplers.0 -> encoder.down.i.downsample
  decoder.up_blocks.i.resnets.j        -> decoder.up.{L-1-i}.block.j
  decoder.up_blocks.i.upsamplers.0     -> decoder.up.{L-1-i}.upsample
  *.mid_block.resnets.k                -> *.mid.block_{k+1}
  *.mid_block.attentions.0             -> *.mid.attn_1 ; group_norm->norm, to_q->q, to_k->k, to_v->v,
                                          to_out.0->proj_out ; linear weights [C, C] -> conv [C, C, 1, 1]
  conv_norm_out -> norm_out ; conv_shortcut -> nin_shortcut ; quant_conv/post_quant_conv unchanged.
"""

import re

import torch

UNET_PREFIX = "model.diffusion_model."
VAE_PREFIX = "first_stage_model."
TE_PREFIX = "cond_stage_model.transformer."

_RESNET_RENAMES = [
    ("norm1", "in_layers.0"),
    ("conv1", "in_layers.2"),
    ("norm2", "out_layers.0"),
    ("conv2", "out_layers.3"),
    ("time_emb_proj", "emb_layers.1"),
    ("conv_shortcut", "skip_connection"),
]


def _unet_key(k, n, up_has_attn):
    top = {
        "conv_in.weight": "input_blocks.0.0.weight",
        "conv_in.bias": "input_blocks.0.0.bias",
        "time_embedding.linear_1.weight": "time_embed.0.weight",
        "time_embedding.linear_1.bias": "time_embed.0.bias",
        "time_embedding.linear_2.weight": "time_embed.2.weight",
        "time_embedding.linear_2.bias": "time_embed.2.bias",
        "conv_norm_out.weight": "out.0.weight",
        "conv_norm_out.bias": "out.0.bias",
        "conv_out.weight": "out.2.weight",
        "conv_out.bias": "out.2.bias",
    }
    if k in top:
        return top[k]

    def resnet_inner(rest):
        for a, b in _RESNET_RENAMES:
            if rest.startswith(a + "."):
                return b + rest[len(a):]
        raise KeyError(f"unknown resnet key part {rest}")

    m = re.match(r"down_blocks\.(\d+)\.resnets\.(\d+)\.(.*)", k)
    if m:
        i, j, rest = int(m[1]), int(m[2]), m[3]
        return f"input_blocks.{(n + 1) * i + j + 1}.0.{resnet_inner(rest)}"
    m = re.match(r"down_blocks\.(\d+)\.attentions\.(\d+)\.(.*)", k)
    if m:
        i, j, rest = int(m[1]), int(m[2]), m[3]
        return f"input_blocks.{(n + 1) * i + j + 1}.1.{rest}"
    m = re.match(r"down_blocks\.(\d+)\.downsamplers\.0\.conv\.(.*)", k)
    if m:
        i, rest = int(m[1]), m[2]
        return f"input_blocks.{(n + 1) * (i + 1)}.0.op.{rest}"
    m = re.match(r"mid_block\.resnets\.(\d+)\.(.*)", k)
    if m:
        return f"middle_block.{2 * int(m[1])}.{resnet_inner(m[2])}"
    m = re.match(r"mid_block\.attentions\.0\.(.*)", k)
    if m:
        return f"middle_block.1.{m[1]}"
    m = re.match(r"up_blocks\.(\d+)\.resnets\.(\d+)\.(.*)", k)
    if m:
        i, j, rest = int(m[1]), int(m[2]), m[3]
        return f"output_blocks.{(n + 1) * i + j}.0.{resnet_inner(rest)}"
    m = re.match(r"up_blocks\.(\d+)\.attentions\.(\d+)\.(.*)", k)
    if m:
        i, j, rest = int(m[1]), int(m[2]), m[3]
        return f"output_blocks.{(n + 1) * i + j}.1.{rest}"
    m = re.match(r"up_blocks\.(\d+)\.upsamplers\.0\.conv\.(.*)", k)
    if m:
        i, rest = int(m[1]), m[2]
        return f"output_blocks.{(n + 1) * i + n}.{2 if up_has_attn[i] else 1}.conv.{rest}"
    raise KeyError(f"no ldm name for UNet key {k}")


def unet_to_ldm(sd, config):
    """diffusers UNet2DConditionModel state dict -> {ldm key (with model.diffusion_model.): tensor}."""
    n = config["layers_per_block"]
    up_has_attn = ["CrossAttn" in t for t in config["up_block_types"]]
    out = {}
    for k, v in sd.items():
        out[UNET_PREFIX + _unet_key(k, n, up_has_attn)] = v
    return out


_VAE_ATTN = [("group_norm", "norm"), ("to_q", "q"), ("to_k", "k"), ("to_v", "v"), ("to_out.0", "proj_out")]


def _vae_key(k, levels):
    m = re.match(r"(encoder|decoder)\.mid_block\.resnets\.(\d+)\.(.*)", k)
    if m:
        rest = m[3].replace("conv_shortcut", "nin_shortcut")
        return f"{m[1]}.mid.block_{int(m[2]) + 1}.{rest}"
    m = re.match(r"(encoder|decoder)\.mid_block\.attentions\.0\.(.*)", k)
    if m:
        rest = m[2]
        for a, b in _VAE_ATTN:
            if rest.startswith(a + "."):
                rest = b + rest[len(a):]
                break
        else:
            raise KeyError(f"unknown VAE attention key {k}")
        return f"{m[1]}.mid.attn_1.{rest}"
    m = re.match(r"encoder\.down_blocks\.(\d+)\.resnets\.(\d+)\.(.*)", k)
    if m:
        return f"encoder.down.{m[1]}.block.{m[2]}.{m[3].replace('conv_shortcut', 'nin_shortcut')}"
    m = re.match(r"encoder\.down_blocks\.(\d+)\.downsamplers\.0\.(.*)", k)
    if m:
        return f"encoder.down.{m[1]}.downsample.{m[2]}"
    m = re.match(r"decoder\.up_blocks\.(\d+)\.resnets\.(\d+)\.(.*)", k)
    if m:
        return f"decoder.up.{levels - 1 - int(m[1])}.block.{m[2]}.{m[3].replace('conv_shortcut', 'nin_shortcut')}"
    m = re.match(r"decoder\.up_blocks\.(\d+)\.upsamplers\.0\.(.*)", k)
    if m:
        return f"decoder.up.{levels - 1 - int(m[1])}.upsample.{m[2]}"
    m = re.match(r"(encoder|decoder)\.conv_norm_out\.(.*)", k)
    if m:
        return f"{m[1]}.norm_out.{m[2]}"
    if re.match(r"(encoder|decoder)\.conv_(in|out)\.", k) or k.startswith(("quant_conv.", "post_quant_conv.")):
        return k
    raise KeyError(f"no ldm name for VAE key {k}")


def vae_to_ldm(sd, config):
    """diffusers AutoencoderKL state dict -> {ldm key (with first_stage_model.): tensor}.
    Mid-block attention linear weights [C, C] become 1x1 conv weights [C, C, 1, 1]."""
    levels = len(config["block_out_channels"])
    out = {}
    for k, v in sd.items():
        nk = _vae_key(k, levels)
        if ".mid.attn_1." in nk and nk.endswith(".weight") and v.ndim == 2:
            v = v.reshape(*v.shape, 1, 1)
        out[VAE_PREFIX + nk] = v
    return out


def _te_key(k):
    # transformers 4.x names CLIPTextModel weights text_model.*; transformers 5.x drops that prefix
    # (embeddings.*, encoder.*, final_layer_norm.*). The ldm name always has it.
    return TE_PREFIX + (k if k.startswith("text_model.") else "text_model." + k)


def text_encoder_to_ldm(sd):
    """HF CLIPTextModel state dict -> cond_stage_model.transformer.text_model.*.
    The non-persistent position_ids buffer is dropped if present."""
    return {_te_key(k): v for k, v in sd.items() if not k.endswith("position_ids")}


def fix_te_keys(ldm_sd):
    """Repairs ldm dicts written before the transformers-5 fix (cond_stage_model.transformer.X without
    text_model.): returns a dict with every text-encoder key under cond_stage_model.transformer.text_model."""
    out = {}
    for k, v in ldm_sd.items():
        if k.startswith(TE_PREFIX) and not k.startswith(TE_PREFIX + "text_model."):
            k = TE_PREFIX + "text_model." + k[len(TE_PREFIX):]
        out[k] = v
    return out


def pipeline_to_ldm(unet, vae, text_encoder, dtype=None):
    """All three models of an SD1.x pipeline -> one flat ldm state dict (contiguous tensors, optional dtype)."""
    out = {}
    out.update(unet_to_ldm(unet.state_dict(), unet.config))
    out.update(vae_to_ldm(vae.state_dict(), vae.config))
    out.update(text_encoder_to_ldm(text_encoder.state_dict()))
    res = {}
    for k, v in out.items():
        v = v.detach().cpu()
        if dtype is not None and v.is_floating_point():
            v = v.to(dtype)
        res[k] = v.contiguous()
    return res


def inverse_mapping(unet, vae, text_encoder):
    """{ldm key: (component name, diffusers key)} built by running the forward mapping on the key sets;
    used to check that the conversion is a bijection and to convert back."""
    inv = {}
    for k in unet.state_dict():
        inv[UNET_PREFIX + _unet_key(k, unet.config["layers_per_block"],
                                    ["CrossAttn" in t for t in unet.config["up_block_types"]])] = ("unet", k)
    for k in vae.state_dict():
        inv[VAE_PREFIX + _vae_key(k, len(vae.config["block_out_channels"]))] = ("vae", k)
    for k in text_encoder.state_dict():
        if not k.endswith("position_ids"):
            inv[_te_key(k)] = ("text_encoder", k)
    return inv


def ldm_to_components(ldm_sd, unet, vae, text_encoder):
    """Convert an ldm state dict back into the three diffusers/transformers state dicts (for self-checks)."""
    inv = inverse_mapping(unet, vae, text_encoder)
    out = {"unet": {}, "vae": {}, "text_encoder": {}}
    for k, v in ldm_sd.items():
        comp, dk = inv[k]
        ref = {"unet": unet, "vae": vae, "text_encoder": text_encoder}[comp].state_dict()[dk]
        out[comp][dk] = v.reshape(ref.shape)
    return out


def to_torch_dtype(name):
    return {"f16": torch.float16, "f32": torch.float32}[name]
