// SD UNet block sequence; order of operations as diffusers UNet2DConditionModel.forward
// (diffusers/models/unets/unet_2d_condition.py) and its blocks (unet_2d_blocks.py).
#include "models/sd/unet.h"

#include "core/error.h"

#include <fmt/format.h>

namespace easel::models::sd {

void UNetState::visit_tensors(const nn::StateTensorFn& f) {
    f("h", h);
    f("temb", temb);
    f("context", context);
    for (size_t k = 0; k < skips.size(); ++k) f(fmt::format("skip.{}", k).c_str(), skips[k]);
}

UNet2DCondition::UNet2DCondition(UNetConfig cfg) : cfg_(std::move(cfg)) {
    const UNetConfig& c = cfg_;
    const int G = c.norm_groups;
    const float eps = c.norm_eps;
    auto unit = [&](Kind k, int b, int j) {
        UNetUnit& u = add<UNetUnit>("");  // empty name: children carry their full paths
        u.kind = k;
        u.block = b;
        u.layer = j;
        units_.push_back(&u);
        return &u;
    };

    conv_in_ = &add<nn::Conv2d>("conv_in", c.in_channels, c.model_channels, c.conv_in_kernel, 1, (c.conv_in_kernel - 1) / 2);
    time_linear_1_ = &add<nn::Linear>("time_embedding.linear_1", c.time_proj_dim, c.time_embed_dim);
    time_linear_2_ = &add<nn::Linear>("time_embedding.linear_2", c.time_embed_dim, c.time_embed_dim);
    if (c.has_add_embedding) {
        add_linear_1_ = &add<nn::Linear>("add_embedding.linear_1", c.add_embed_in, c.time_embed_dim);
        add_linear_2_ = &add<nn::Linear>("add_embedding.linear_2", c.time_embed_dim, c.time_embed_dim);
    }

    for (int b = 0; b < (int)c.down.size(); ++b) {
        auto& d = c.down[b];
        for (int j = 0; j < (int)d.resnets.size(); ++j) {
            UNetUnit* u = unit(Kind::Down, b, j);
            u->resnet = &u->add<ResnetBlock2D>(fmt::format("down_blocks.{}.resnets.{}", b, j), d.resnets[j], G, eps);
            if (j < (int)d.attentions.size())
                u->attn = &u->add<Transformer2D>(fmt::format("down_blocks.{}.attentions.{}", b, j), d.attentions[j], G);
        }
        if (d.downsample) {
            UNetUnit* u = unit(Kind::Downsample, b, (int)d.resnets.size());
            u->down = &u->add<Downsample2D>(fmt::format("down_blocks.{}.downsamplers.0", b), d.resnets.back().out);
        }
    }
    if (c.mid.present) {
        UNetUnit* u = unit(Kind::Mid, 0, 0);
        for (size_t j = 0; j < c.mid.resnets.size(); ++j)
            u->mid_resnets.push_back(&u->add<ResnetBlock2D>(fmt::format("mid_block.resnets.{}", j), c.mid.resnets[j], G, eps));
        for (size_t j = 0; j < c.mid.attentions.size(); ++j)
            u->mid_attns.push_back(&u->add<Transformer2D>(fmt::format("mid_block.attentions.{}", j), c.mid.attentions[j], G));
    }
    for (int b = 0; b < (int)c.up.size(); ++b) {
        auto& ub = c.up[b];
        for (int j = 0; j < (int)ub.resnets.size(); ++j) {
            UNetUnit* u = unit(Kind::Up, b, j);
            u->resnet = &u->add<ResnetBlock2D>(fmt::format("up_blocks.{}.resnets.{}", b, j), ub.resnets[j], G, eps);
            if (j < (int)ub.attentions.size())
                u->attn = &u->add<Transformer2D>(fmt::format("up_blocks.{}.attentions.{}", b, j), ub.attentions[j], G);
            if (ub.upsample && j + 1 == (int)ub.resnets.size())
                u->up = &u->add<Upsample2D>(fmt::format("up_blocks.{}.upsamplers.0", b), ub.resnets.back().out);
        }
    }
    conv_norm_out_ = &add<nn::GroupNorm>("conv_norm_out", G, c.model_channels, eps);
    conv_out_ = &add<nn::Conv2d>("conv_out", c.model_channels, c.out_channels, c.conv_out_kernel, 1,
                                 (c.conv_out_kernel - 1) / 2);
    if (c.conv_direct) nn::set_conv_direct(*this, true);
}

std::string UNet2DCondition::block_name(int i) const {
    const UNetUnit& u = *units_.at((size_t)i);
    switch (u.kind) {
        case Kind::Down:
            return fmt::format("down_blocks.{}.resnets.{}{}", u.block, u.layer,
                               u.attn ? fmt::format("+attentions.{}", u.layer) : "");
        case Kind::Downsample: return fmt::format("down_blocks.{}.downsamplers.0", u.block);
        case Kind::Mid: return "mid_block";
        case Kind::Up:
            return fmt::format("up_blocks.{}.resnets.{}{}{}", u.block, u.layer,
                               u.attn ? fmt::format("+attentions.{}", u.layer) : "", u.up ? "+upsamplers.0" : "");
    }
    return {};
}

void UNet2DCondition::visit_prologue_params(const std::function<void(const std::string&, nn::Param&)>& fn) {
    time_linear_1_->visit_params("time_embedding.linear_1", fn);
    time_linear_2_->visit_params("time_embedding.linear_2", fn);
    if (add_linear_1_) {
        add_linear_1_->visit_params("add_embedding.linear_1", fn);
        add_linear_2_->visit_params("add_embedding.linear_2", fn);
    }
    conv_in_->visit_params("conv_in", fn);
}

void UNet2DCondition::visit_epilogue_params(const std::function<void(const std::string&, nn::Param&)>& fn) {
    conv_norm_out_->visit_params("conv_norm_out", fn);
    conv_out_->visit_params("conv_out", fn);
}

void UNet2DCondition::validate(const UNetInputs& in) const {
    if (!in.sample || !in.timestep || !in.context)
        fail(ErrorKind::InvalidInput, "UNet needs sample, timestep and context tensors");
    const ggml_tensor* x = in.sample;
    if (x->type != GGML_TYPE_F32 || in.timestep->type != GGML_TYPE_F32 || in.context->type != GGML_TYPE_F32)
        fail(ErrorKind::InvalidInput, "UNet inputs must be F32 tensors");
    const int64_t N = x->ne[3];
    if (x->ne[0] < 1 || x->ne[1] < 1 || x->ne[2] != cfg_.in_channels || N < 1)
        fail(ErrorKind::InvalidInput, "UNet sample has shape [N={}, C={}, H={}, W={}]; this model needs C={} (latent channels)",
             N, x->ne[2], x->ne[1], x->ne[0], cfg_.in_channels);
    if (ggml_nelements(in.timestep) != N || in.timestep->ne[0] != N)
        fail(ErrorKind::InvalidInput, "UNet timestep has {} values for a batch of {}; give one per sample",
             ggml_nelements(in.timestep), N);
    const ggml_tensor* ctx = in.context;
    if (cfg_.context_dim > 0 && ctx->ne[0] != cfg_.context_dim)
        fail(ErrorKind::InvalidInput,
             "UNet conditioning has width {}, this model's cross-attention takes {}: wrong text encoder for this model",
             ctx->ne[0], cfg_.context_dim);
    if (ctx->ne[1] < 1 || ctx->ne[2] != N || ctx->ne[3] != 1)
        fail(ErrorKind::InvalidInput, "UNet conditioning has shape [N={}, L={}, D={}] for a batch of {}", ctx->ne[2],
             ctx->ne[1], ctx->ne[0], N);
    if (!cfg_.has_add_embedding) {
        if (in.text_embeds || in.time_ids)
            fail(ErrorKind::InvalidInput, "this UNet has no add_embedding: it takes no pooled text embedding or time ids");
        return;
    }
    if (!in.text_embeds || !in.time_ids)
        fail(ErrorKind::InvalidInput, "this SDXL UNet needs the pooled text embedding and the time ids (text_time conditioning)");
    if (in.text_embeds->type != GGML_TYPE_F32 || in.time_ids->type != GGML_TYPE_F32)
        fail(ErrorKind::InvalidInput, "UNet text_embeds / time_ids must be F32 tensors");
    if (in.text_embeds->ne[0] != cfg_.add_text_dim || in.text_embeds->ne[1] != N || ggml_nelements(in.text_embeds) != cfg_.add_text_dim * N)
        fail(ErrorKind::InvalidInput,
             "UNet pooled text embedding has width {} for a batch of {}; this model takes {} (the second text encoder's projection)",
             in.text_embeds->ne[0], in.text_embeds->ne[1], cfg_.add_text_dim);
    if (in.time_ids->ne[0] != cfg_.add_time_ids || in.time_ids->ne[1] != N || ggml_nelements(in.time_ids) != cfg_.add_time_ids * N)
        fail(ErrorKind::InvalidInput, "UNet time ids have {} values per sample for a batch of {}; this model takes {}", in.time_ids->ne[0],
             in.time_ids->ne[1], cfg_.add_time_ids);
}

UNetState UNet2DCondition::prologue(nn::Ctx& c, const UNetInputs& in) const {
    validate(in);
    UNetState s;
    ggml_tensor* t = nn::timestep_embedding(c, in.timestep, (int)cfg_.time_proj_dim, cfg_.flip_sin_to_cos, cfg_.freq_shift);
    ggml_tensor* emb = time_linear_2_->forward(c, ggml_silu(c.ctx, time_linear_1_->forward(c, t)));
    if (cfg_.has_add_embedding) {
        // diffusers text_time: add_time_proj(time_ids.flatten()) -> [N * ids, Dt] reshaped to
        // [N, ids * Dt] (each sample's id embeddings side by side), concat with text_embeds,
        // add_embedding (linear_1 -> SiLU -> linear_2), added to the time embedding.
        const int64_t N = in.time_ids->ne[1];
        ggml_tensor* ids = ggml_reshape_1d(c.ctx, in.time_ids, cfg_.add_time_ids * N);
        ggml_tensor* te = nn::timestep_embedding(c, ids, (int)cfg_.add_time_dim, cfg_.flip_sin_to_cos, cfg_.freq_shift);
        te = ggml_reshape_2d(c.ctx, te, cfg_.add_time_dim * cfg_.add_time_ids, N);
        ggml_tensor* add_in = ggml_concat(c.ctx, in.text_embeds, te, 0);
        ggml_tensor* aug = add_linear_2_->forward(c, ggml_silu(c.ctx, add_linear_1_->forward(c, add_in)));
        emb = ggml_add(c.ctx, emb, aug);
    }
    s.temb = ggml_silu(c.ctx, emb);  // every ResnetBlock2D applies SiLU to temb first
    s.context = in.context;
    s.h = conv_in_->forward(c, in.sample);
    s.skips.push_back(s.h);
    return s;
}

UNetState UNet2DCondition::block(nn::Ctx& c, int i, UNetState s) const {
    if (i < 0 || i >= n_blocks()) fail(ErrorKind::InvalidInput, "UNet has no block {} (it has {})", i, n_blocks());
    const UNetUnit& u = *units_[(size_t)i];
    ggml_context* g = c.ctx;
    switch (u.kind) {
        case Kind::Down:
            s.h = u.resnet->forward(c, s.h, s.temb);
            if (u.attn) s.h = u.attn->forward(c, s.h, s.context);
            s.skips.push_back(s.h);
            break;
        case Kind::Downsample:
            s.h = u.down->forward(c, s.h);
            s.skips.push_back(s.h);
            break;
        case Kind::Mid:
            s.h = u.mid_resnets[0]->forward(c, s.h, s.temb);
            for (size_t j = 0; j < u.mid_attns.size(); ++j) {
                s.h = u.mid_attns[j]->forward(c, s.h, s.context);
                s.h = u.mid_resnets[j + 1]->forward(c, s.h, s.temb);
            }
            if (u.mid_attns.empty())
                for (size_t j = 1; j < u.mid_resnets.size(); ++j) s.h = u.mid_resnets[j]->forward(c, s.h, s.temb);
            break;
        case Kind::Up: {
            if (s.skips.empty()) fail(ErrorKind::InvalidInput, "UNet {}: the skip stack is empty (blocks run out of order?)", block_name(i));
            ggml_tensor* skip = s.skips.back();
            s.skips.pop_back();
            if (skip->ne[0] != s.h->ne[0] || skip->ne[1] != s.h->ne[1] || skip->ne[3] != s.h->ne[3])
                fail(ErrorKind::InvalidInput, "UNet {}: skip {}x{} does not match hidden {}x{} (blocks run out of order?)",
                     block_name(i), skip->ne[0], skip->ne[1], s.h->ne[0], s.h->ne[1]);
            s.h = ggml_concat(g, s.h, skip, 2);  // torch.cat([hidden, skip], dim=1)
            s.h = u.resnet->forward(c, s.h, s.temb);
            if (u.attn) s.h = u.attn->forward(c, s.h, s.context);
            if (u.up) {
                // diffusers passes upsample_size = size of the next skip when the input size is not
                // a multiple of 2^num_upsamplers; otherwise that size is exactly 2x. Either way the
                // target is the next skip's size.
                int64_t ow = 2 * s.h->ne[0], oh = 2 * s.h->ne[1];
                if (!s.skips.empty()) {
                    ow = s.skips.back()->ne[0];
                    oh = s.skips.back()->ne[1];
                }
                s.h = u.up->forward(c, s.h, ow, oh);
            }
            break;
        }
    }
    return s;
}

ggml_tensor* UNet2DCondition::epilogue(nn::Ctx& c, UNetState s) const {
    ggml_tensor* h = ggml_silu(c.ctx, conv_norm_out_->forward(c, s.h));
    return conv_out_->forward(c, h);
}

LoadedUNet load_unet(const io::WeightIndex& index, ggml_backend_buffer_type_t buft, const UNetOverrides& ov,
                     const nn::LoadOptions& opt) {
    LoadedUNet r;
    UNetConfig cfg = infer_unet_config(index, ov);
    nn::TensorSource src = make_unet_source(index, cfg);
    r.net = std::make_unique<UNet2DCondition>(std::move(cfg));
    r.params = nn::ParamBuffer::load(*r.net, src, buft, opt);
    return r;
}

}  // namespace easel::models::sd
