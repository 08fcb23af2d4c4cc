// LoRA targets per module (see targets.h): the modules' own key maps (the TensorSources their
// loaders use for the other layouts) give the aliases, so a layout is described once.
#include "models/lora_targets.h"

#include "models/t5/t5_encoder.h"

namespace easel::lora {

namespace {

// The layouts are TensorSources over an index with no tensors: only their names are used.
const io::WeightIndex& no_tensors() {
    static const io::WeightIndex empty;
    return empty;
}

// Swaps the two row halves of `alias` (FLUX norm_out: diffusers (scale, shift) vs BFL (shift, scale)).
void swap_halves(KeyMap& km, int ci, const std::string& alias) {
    std::vector<Destination> d = km.alias(ci, alias);
    if (d.size() != 1) return;
    const int64_t rows = d[0].rows.src_end - d[0].rows.src_begin, h = rows / 2;
    if (rows % 2 != 0) return;
    km.set_alias(ci, alias, {{d[0].target, {0, h, h}}, {d[0].target, {h, rows, 0}}});
}

}  // namespace

int add_unet_targets(KeyMap& km, const nn::Block& unet, const models::sd::UNetConfig& cfg) {
    const int ci = km.add_component("diffusion", "unet", -1, unet);
    models::sd::UNetConfig ldm = cfg;
    ldm.layout = models::sd::UNetKeyLayout::Ldm;
    ldm.prefix = "";
    km.add_layout(ci, models::sd::make_unet_source(no_tensors(), ldm));
    return ci;
}

int add_clip_targets(KeyMap& km, const std::string& name, int te_index, const nn::Block& clip, const models::clip::ClipConfig& cfg) {
    const int ci = km.add_component("te", name, te_index, clip);
    km.add_name_prefix(ci, "text_model.");
    models::clip::ClipKeys open;
    open.layout = models::clip::ClipKeys::Layout::OpenClip;
    km.add_layout(ci, models::clip::make_tensor_source(no_tensors(), open, cfg));
    return ci;
}

int add_t5_targets(KeyMap& km, int te_index, const nn::Block& t5) {
    const int ci = km.add_component("te", "t5xxl", te_index, t5);
    models::t5::T5Keys gguf;
    gguf.layout = models::t5::T5Keys::Layout::LlamaCpp;
    gguf.embedding = "token_embd.weight";
    km.add_layout(ci, models::t5::make_tensor_source(no_tensors(), gguf));
    return ci;
}

int add_qwen3_targets(KeyMap& km, int te_index, const nn::Block& qwen3, const models::qwen3::Qwen3Config& cfg) {
    const int ci = km.add_component("te", "qwen3", te_index, qwen3);
    km.add_name_prefix(ci, "model.");
    models::qwen3::Qwen3Keys gguf;
    gguf.layout = models::qwen3::Qwen3Keys::Layout::Gguf;
    km.add_layout(ci, models::qwen3::make_tensor_source(no_tensors(), gguf, cfg));
    return ci;
}

int add_flux1_targets(KeyMap& km, const nn::Block& dit, const models::flux::FluxDiTConfig& cfg, bool final_shift_first) {
    const int ci = km.add_component("diffusion", "dit", -1, dit);
    nn::TensorSource bfl(no_tensors(), "");
    models::flux::configure_flux_source(bfl, cfg, models::flux::FluxSource{"", models::flux::FluxLayout::Bfl});
    km.add_layout(ci, bfl);
    swap_halves(km, ci, final_shift_first ? "norm_out.linear" : "final_layer.adaLN_modulation.1");
    return ci;
}

int add_flux2_targets(KeyMap& km, const nn::Block& dit, const models::flux::Flux2DiTConfig& cfg, bool final_shift_first) {
    const int ci = km.add_component("diffusion", "dit", -1, dit);
    nn::TensorSource bfl(no_tensors(), "");
    models::flux::configure_flux2_source(bfl, cfg, models::flux::FluxSource{"", models::flux::FluxLayout::Bfl});
    km.add_layout(ci, bfl);
    swap_halves(km, ci, final_shift_first ? "norm_out.linear" : "final_layer.adaLN_modulation.1");
    return ci;
}

int add_zimage_targets(KeyMap& km, const nn::Block& dit, const models::zimage::ZImageDiTConfig& cfg) {
    const int ci = km.add_component("diffusion", "dit", -1, dit);
    models::zimage::ZImageKeys orig;
    orig.layout = models::zimage::ZImageKeys::Layout::Original;
    km.add_layout(ci, models::zimage::make_tensor_source(no_tensors(), orig, cfg));
    return ci;
}

}  // namespace easel::lora
