// unet_slot_hooks (see unet_slot.h).
#include "models/sd/unet_slot.h"

#include "core/error.h"
#include "text/clip_tokenizer.h"

namespace easel::models::sd {

ModuleSlot<UNetWhole, PlacedUNet>::Hooks unet_slot_hooks(const io::WeightIndex& index, const ModuleSource& src, const UNetConfig& cfg,
                                                         const FamilyOptions& opt, ggml_type weight_type, std::string family) {
    ModuleSlot<UNetWhole, PlacedUNet>::Hooks h;
    nn::LoadOptions lo;
    lo.weight_type = weight_type;
    h.load_whole = [&index, &src, &cfg, &opt, lo, family] {
        auto u = std::make_unique<UNetWhole>();
        u->runner = std::make_unique<runtime::GraphRunner>(opt.diffusion_device, opt.threads);
        try {
            nn::TensorSource ts = make_unet_source(index, cfg);
            u->unet.net = std::make_unique<UNet2DCondition>(cfg);
            u->unet.params = nn::ParamBuffer::load(*u->unet.net, ts, u->runner->buffer_type(), lo);
        } catch (const Error& e) {
            if (e.kind() == ErrorKind::ModelMismatch)
                fail(ErrorKind::ModelMismatch, "{}: no {} UNet in this file ({}); pass an {} checkpoint as -m, or the UNet as --diffusion-model",
                     src.named(), family, e.what(), family);
            throw;
        }
        return u;
    };
    h.load_placed = [&index, &cfg, &opt, lo] {
        return std::make_unique<PlacedUNet>(index, cfg, lo, *opt.placement, opt.threads, opt.flash_attn_diffusion);
    };
    h.files = [&src]() -> std::vector<std::string> { return {src.path}; };
    h.costs = [&index, &cfg, &opt, lo](int64_t lh, int64_t lw) {
        return std::vector<placement::ModuleCosts>{
            unet_costs(index, cfg, lo, opt.threads, opt.flash_attn_diffusion, 1, lh, lw, text::ClipTokenizer::kMaxLength)};
    };
    return h;
}

}  // namespace easel::models::sd
