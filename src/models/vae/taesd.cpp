#include "models/vae/taesd.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

namespace easel::vae {

namespace {

// What the keys of one Sequential index hold.
struct IndexKeys {
    const io::TensorInfo* conv_w = nullptr;  // "N.weight"
    bool conv_b = false;                     // "N.bias"
    const io::TensorInfo* block_w = nullptr; // "N.conv.0.weight"
    bool pool = false;                       // "N.pool.0.weight"
    const io::TensorInfo* skip = nullptr;    // "N.skip.weight"
};

bool digits(const std::string& s) { return !s.empty() && std::all_of(s.begin(), s.end(), ::isdigit); }

const char* part_name(TaesdPart p) { return p == TaesdPart::Encoder ? "encoder" : "decoder"; }

}  // namespace

TaesdSource find_taesd(const io::WeightIndex& index) {
    TaesdSource s;
    if (index.contains("encoder.layers.0.weight")) s.encoder_prefix = "encoder.layers.";
    if (index.contains("decoder.layers.0.weight")) s.decoder_prefix = "decoder.layers.";
    if (s.encoder_prefix || s.decoder_prefix) return s;
    if (const io::TensorInfo* t = index.find("0.weight"); t && t->shape.size() == 4 && t->shape[1] == 3)
        s.encoder_prefix = "";
    else if (!index.contains("0.weight") && index.contains("1.weight"))
        s.decoder_prefix = "";
    return s;
}

std::vector<TaesdLayer> parse_taesd_layers(const io::WeightIndex& index, const std::string& prefix, TaesdPart part) {
    std::map<int, IndexKeys> keys;
    for (const auto& t : index.tensors()) {
        if (t.name.compare(0, prefix.size(), prefix) != 0) continue;
        const std::string rest = t.name.substr(prefix.size());
        const size_t dot = rest.find('.');
        if (dot == std::string::npos || !digits(rest.substr(0, dot))) {
            if (prefix.empty()) continue;  // a bare file may carry unrelated keys; ignore them
            fail(ErrorKind::ModelMismatch, "TAESD {}: unexpected key '{}'", part_name(part), t.name);
        }
        const int idx = std::stoi(rest.substr(0, dot));
        const std::string sub = rest.substr(dot + 1);
        IndexKeys& k = keys[idx];
        if (sub == "weight") k.conv_w = &t;
        else if (sub == "bias") k.conv_b = true;
        else if (sub == "conv.0.weight") k.block_w = &t;
        else if (sub == "pool.0.weight") k.pool = true;
        else if (sub == "skip.weight") k.skip = &t;
        else if (sub.rfind("conv.", 0) == 0 || sub.rfind("pool.", 0) == 0) continue;  // bound by the Block
        else fail(ErrorKind::ModelMismatch, "TAESD {}: unknown key '{}'", part_name(part), t.name);
    }
    if (keys.empty()) fail(ErrorKind::ModelMismatch, "TAESD {}: no layer keys under prefix '{}'", part_name(part), prefix);

    std::vector<TaesdLayer> layers;
    const int last = keys.rbegin()->first;
    bool seen_param = false;
    for (int i = 0; i <= last; ++i) {
        auto it = keys.find(i);
        if (it == keys.end()) {
            TaesdLayer l;
            l.kind = TaesdLayer::Kind::Relu;
            if (!seen_param) {
                if (part == TaesdPart::Decoder) continue;  // the Clamp: applied by forward() in both layouts
                fail(ErrorKind::ModelMismatch, "TAESD encoder: layer {} has no weights but comes before any conv", i);
            }
            const TaesdLayer& prev = layers.back();
            if (prev.kind == TaesdLayer::Kind::Conv) l.kind = TaesdLayer::Kind::Relu;
            else if (prev.kind == TaesdLayer::Kind::Block && part == TaesdPart::Decoder) l.kind = TaesdLayer::Kind::Upsample;
            else fail(ErrorKind::ModelMismatch, "TAESD {}: cannot tell what parameter-free layer {} is", part_name(part), i);
            l.in = l.out = prev.out;
            layers.push_back(l);
            continue;
        }
        const IndexKeys& k = it->second;
        TaesdLayer l;
        l.index = i;
        if (k.conv_w && !k.block_w) {
            if (k.conv_w->shape.size() != 4 || k.conv_w->shape[2] != 3 || k.conv_w->shape[3] != 3)
                fail(ErrorKind::ModelMismatch, "TAESD {}: layer {} weight is not a 3x3 conv kernel", part_name(part), i);
            l.kind = TaesdLayer::Kind::Conv;
            l.out = k.conv_w->shape[0];
            l.in = k.conv_w->shape[1];
            l.bias = k.conv_b;
        } else if (k.block_w && !k.conv_w) {
            if (k.block_w->shape.size() != 4)
                fail(ErrorKind::ModelMismatch, "TAESD {}: block {} conv.0 weight is not 4-D", part_name(part), i);
            l.kind = TaesdLayer::Kind::Block;
            l.out = k.block_w->shape[0];
            l.in = k.block_w->shape[1];
            l.pool = k.pool;
            if ((l.in != l.out) != (k.skip != nullptr))
                fail(ErrorKind::ModelMismatch, "TAESD {}: block {} maps {} to {} channels but {} a skip conv", part_name(part),
                     i, l.in, l.out, k.skip ? "has" : "lacks");
        } else {
            fail(ErrorKind::ModelMismatch, "TAESD {}: layer {} is neither a conv nor a block", part_name(part), i);
        }
        if (!layers.empty() && layers.back().out != l.in)
            fail(ErrorKind::ModelMismatch, "TAESD {}: layer {} takes {} channels but the previous layer gives {}",
                 part_name(part), i, l.in, layers.back().out);
        layers.push_back(l);
        seen_param = true;
    }
    if (layers.back().kind != TaesdLayer::Kind::Conv)
        fail(ErrorKind::ModelMismatch, "TAESD {}: the last layer must be a conv", part_name(part));

    if (part == TaesdPart::Encoder) {
        for (size_t i = 0; i + 1 < layers.size(); ++i) {
            TaesdLayer& l = layers[i];
            if (l.kind != TaesdLayer::Kind::Conv) continue;
            const bool relu_next = layers[i + 1].kind == TaesdLayer::Kind::Relu;
            l.stride = (!l.bias || relu_next) ? 2 : 1;
        }
    }
    return layers;
}

// ---------------------------------------------------------------------------------------------

TaesdBlock::TaesdBlock(int64_t in, int64_t out, bool pool) {
    if (pool) {
        pool0 = &add<nn::Conv2d>("pool.0", in, 4 * in, 1, 1, 0, false);
        pool1 = &add<nn::GroupNorm>("pool.1", 4, 4 * in, 1e-5f);
        pool3 = &add<nn::Conv2d>("pool.3", 4 * in, in, 1, 1, 0, false);
    }
    conv0 = &add<nn::Conv2d>("conv.0", in, out, 3, 1, 1);
    conv2 = &add<nn::Conv2d>("conv.2", out, out, 3, 1, 1);
    conv4 = &add<nn::Conv2d>("conv.4", out, out, 3, 1, 1);
    if (in != out) skip = &add<nn::Conv2d>("skip", in, out, 1, 1, 0, false);
}

ggml_tensor* TaesdBlock::forward(nn::Ctx& c, ggml_tensor* x) const {
    if (pool0) {
        ggml_tensor* p = ggml_relu(c.ctx, pool1->forward(c, pool0->forward(c, x)));
        x = ggml_add(c.ctx, x, pool3->forward(c, p));
    }
    ggml_tensor* h = ggml_relu(c.ctx, conv0->forward(c, x));
    h = ggml_relu(c.ctx, conv2->forward(c, h));
    h = conv4->forward(c, h);
    return ggml_relu(c.ctx, ggml_add(c.ctx, h, skip ? skip->forward(c, x) : x));
}

TaesdSequential::TaesdSequential(std::vector<TaesdLayer> layers, TaesdPart part) : layers_(std::move(layers)), part_(part) {
    if (layers_.empty()) fail(ErrorKind::InvalidInput, "TAESD: empty layer list");
    for (const auto& l : layers_) {
        const std::string name = std::to_string(l.index);
        switch (l.kind) {
            case TaesdLayer::Kind::Conv: modules_.push_back(&add<nn::Conv2d>(name, l.in, l.out, 3, l.stride, 1, l.bias)); break;
            case TaesdLayer::Kind::Block: modules_.push_back(&add<TaesdBlock>(name, l.in, l.out, l.pool)); break;
            default: modules_.push_back(nullptr); break;
        }
    }
}

int64_t TaesdSequential::in_channels() const { return layers_.front().in; }
int64_t TaesdSequential::out_channels() const { return layers_.back().out; }

int TaesdSequential::spatial_factor() const {
    int f = 1;
    for (const auto& l : layers_)
        if ((l.kind == TaesdLayer::Kind::Conv && l.stride == 2) || l.kind == TaesdLayer::Kind::Upsample) f *= 2;
    return f;
}

ggml_tensor* TaesdSequential::forward(nn::Ctx& c, ggml_tensor* x) const {
    if (part_ == TaesdPart::Encoder) {
        x = ggml_scale_bias(c.ctx, x, 0.5f, 0.5f);  // [-1, 1] -> [0, 1]: x.add(1).div(2)
    } else {
        x = ggml_scale(c.ctx, ggml_tanh(c.ctx, ggml_scale(c.ctx, x, 1.0f / 3.0f)), 3.0f);  // Clamp: tanh(x / 3) * 3
    }
    for (size_t i = 0; i < layers_.size(); ++i) {
        const TaesdLayer& l = layers_[i];
        switch (l.kind) {
            case TaesdLayer::Kind::Conv: x = static_cast<nn::Conv2d*>(modules_[i])->forward(c, x); break;
            case TaesdLayer::Kind::Block: x = static_cast<TaesdBlock*>(modules_[i])->forward(c, x); break;
            case TaesdLayer::Kind::Relu: x = ggml_relu(c.ctx, x); break;
            case TaesdLayer::Kind::Upsample: x = ggml_upscale(c.ctx, x, 2, GGML_SCALE_MODE_NEAREST); break;
        }
    }
    if (part_ == TaesdPart::Decoder) x = ggml_scale_bias(c.ctx, x, 2.0f, -1.0f);  // [0, 1] -> [-1, 1]
    return x;
}

// ---------------------------------------------------------------------------------------------

TinyAutoencoder::~TinyAutoencoder() = default;

void TinyAutoencoder::set_conv_direct(bool direct) {
    if (encoder_) nn::set_conv_direct(*encoder_, direct);
    if (decoder_) nn::set_conv_direct(*decoder_, direct);
}

std::unique_ptr<TinyAutoencoder> TinyAutoencoder::load(const io::WeightIndex& index, ggml_backend_t backend) {
    TaesdSource s = find_taesd(index);
    if (!s.encoder_prefix && !s.decoder_prefix)
        fail(ErrorKind::ModelMismatch,
             "no TAESD found: expected keys 'encoder.layers.0.weight' / 'decoder.layers.0.weight' (diffusers "
             "AutoencoderTiny) or an original taesd_encoder / taesd_decoder file ('0.weight', '1.weight', ...)");
    return load(s.encoder_prefix ? &index : nullptr, s.decoder_prefix ? &index : nullptr, backend);
}

std::unique_ptr<TinyAutoencoder> TinyAutoencoder::load(const io::WeightIndex* encoder_index,
                                                       const io::WeightIndex* decoder_index, ggml_backend_t backend) {
    if (!backend) fail(ErrorKind::Internal, "TinyAutoencoder::load called without a backend");
    if (!encoder_index && !decoder_index) fail(ErrorKind::InvalidInput, "TAESD: neither an encoder nor a decoder was given");
    std::unique_ptr<TinyAutoencoder> m(new TinyAutoencoder());
    m->backend_ = backend;
    auto load_half = [&](const io::WeightIndex& index, TaesdPart part, std::unique_ptr<TaesdSequential>& seq,
                         nn::ParamBuffer& buf) {
        TaesdSource s = find_taesd(index);
        const auto& prefix = part == TaesdPart::Encoder ? s.encoder_prefix : s.decoder_prefix;
        if (!prefix)
            fail(ErrorKind::ModelMismatch, "TAESD: the file given as the {} holds no TAESD {}", part_name(part), part_name(part));
        seq = std::make_unique<TaesdSequential>(parse_taesd_layers(index, *prefix, part), part);
        nn::TensorSource ts(index, *prefix);
        nn::LoadOptions lo;
        lo.check_unexpected = false;  // the other half may share the file; the parser already checked the keys
        lo.weight_type = GGML_TYPE_F32;  // F32 convolutions (F16 ones round activations to F16); a few MB
        buf = nn::ParamBuffer::load(*seq, ts, ggml_backend_get_default_buffer_type(backend), lo);
    };
    if (encoder_index) load_half(*encoder_index, TaesdPart::Encoder, m->encoder_, m->enc_params_);
    if (decoder_index) load_half(*decoder_index, TaesdPart::Decoder, m->decoder_, m->dec_params_);
    if (m->encoder_ && m->decoder_) {
        if (m->encoder_->out_channels() != m->decoder_->in_channels())
            fail(ErrorKind::ModelMismatch, "TAESD: the encoder emits {} latent channels but the decoder takes {}",
                 m->encoder_->out_channels(), m->decoder_->in_channels());
        if (m->encoder_->spatial_factor() != m->decoder_->spatial_factor())
            fail(ErrorKind::ModelMismatch, "TAESD: encoder and decoder scale by {} and {}", m->encoder_->spatial_factor(),
                 m->decoder_->spatial_factor());
    }
    return m;
}

int64_t TinyAutoencoder::latent_channels() const {
    return encoder_ ? encoder_->out_channels() : decoder_->in_channels();
}

int TinyAutoencoder::spatial_factor() const { return encoder_ ? encoder_->spatial_factor() : decoder_->spatial_factor(); }

HostTensor TinyAutoencoder::encode(const HostTensor& image, const ExecOptions& ex) const {
    if (!encoder_) fail(ErrorKind::InvalidInput, "this TAESD has no encoder; give the taesd encoder file too");
    const int f = encoder_->spatial_factor();
    if (image.c != encoder_->in_channels())
        fail(ErrorKind::InvalidInput, "TAESD encode: image has {} channels, the encoder takes {}", image.c, encoder_->in_channels());
    if (image.h <= 0 || image.w <= 0 || image.h % f != 0 || image.w % f != 0)
        fail(ErrorKind::InvalidInput, "TAESD encode: image size {}x{} must be a positive multiple of {}", image.w, image.h, f);
    return run_image_graph(backend_, image, [&](nn::Ctx& c, ggml_tensor* x) { return encoder_->forward(c, x); }, ex);
}

HostTensor TinyAutoencoder::decode(const HostTensor& latents, const ExecOptions& ex) const {
    if (!decoder_) fail(ErrorKind::InvalidInput, "this TAESD has no decoder; give the taesd decoder file too");
    if (latents.c != decoder_->in_channels())
        fail(ErrorKind::InvalidInput, "TAESD decode: latent has {} channels, the decoder takes {}", latents.c, decoder_->in_channels());
    if (latents.h <= 0 || latents.w <= 0) fail(ErrorKind::InvalidInput, "TAESD decode: empty latent");
    return run_image_graph(backend_, latents, [&](nn::Ctx& c, ggml_tensor* x) { return decoder_->forward(c, x); }, ex);
}

void taesd_scale_latents(std::span<float> x) {
    for (float& v : x) v = std::clamp(v / 6.0f + 0.5f, 0.0f, 1.0f);
}

void taesd_unscale_latents(std::span<float> x) {
    for (float& v : x) v = (v - 0.5f) * 6.0f;
}

}  // namespace easel::vae
