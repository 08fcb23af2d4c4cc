// The LoRA targets of each module easel runs: one KeyMap component per loaded module, with the
// other file layouts of that module as aliases (see key_map.h). The families call these with
// the module trees they built (their canonical names) and the configs inferred from the
// weights; nothing here reads a weight.
#pragma once

#include "lora/key_map.h"
#include "models/clip/clip_text.h"
#include "models/flux/flux2_dit.h"
#include "models/flux/flux_dit.h"
#include "models/qwen3/qwen3.h"
#include "models/sd/unet_config.h"
#include "models/zimage/z_image_dit.h"

namespace easel::lora {

/// The SD1.x / SD2.x (SDXL) UNet `unet` built from `cfg`: diffusers names and the LDM names
/// (input_blocks.N.M..., middle_block, output_blocks) of the same config. Component "unet".
int add_unet_targets(KeyMap& km, const nn::Block& unet, const models::sd::UNetConfig& cfg);

/// A CLIP text encoder (transformers names; "text_model." allowed before them; the OpenCLIP
/// names of its out_proj / mlp / norms): `name` "clip_l" / "clip_g" / "openclip_h".
int add_clip_targets(KeyMap& km, const std::string& name, int te_index, const nn::Block& clip,
                     const models::clip::ClipConfig& cfg);

/// A T5 encoder (transformers names and llama.cpp GGUF names). Component "t5xxl".
int add_t5_targets(KeyMap& km, int te_index, const nn::Block& t5);

/// A Qwen3 text encoder (transformers names, "model." allowed before them; llama.cpp GGUF
/// names). Component "qwen3".
int add_qwen3_targets(KeyMap& km, int te_index, const nn::Block& qwen3, const models::qwen3::Qwen3Config& cfg);

/// The FLUX.1 DiT (diffusers names and the BFL/ComfyUI names with fused qkv / linear1 split
/// into row ranges). `final_shift_first`: the model's norm_out rows are in BFL order (the
/// FluxDiT flag), so a diffusers-named norm_out LoRA has its two row halves swapped (and a
/// BFL-named one when the model is in diffusers order). Component "dit".
int add_flux1_targets(KeyMap& km, const nn::Block& dit, const models::flux::FluxDiTConfig& cfg, bool final_shift_first);

/// The FLUX.2 DiT, as add_flux1_targets.
int add_flux2_targets(KeyMap& km, const nn::Block& dit, const models::flux::Flux2DiTConfig& cfg, bool final_shift_first);

/// The Z-Image DiT (diffusers names and the original / ComfyUI names with the fused
/// attention.qkv). Component "dit".
int add_zimage_targets(KeyMap& km, const nn::Block& dit, const models::zimage::ZImageDiTConfig& cfg);

}  // namespace easel::lora
