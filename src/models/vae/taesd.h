// TAESD: the tiny autoencoders of madebyollin/taesd (TAESD, TAESDXL, TAESD3, TAEF1, TAEF2,
// TAESANA) and diffusers' AutoencoderTiny.
//
// Architecture facts: madebyollin/taesd taesd.py (Encoder, Decoder, F32Encoder, F32Decoder,
// Block with the optional "midblock GN" pool of TAEF2) and diffusers
// models/autoencoders/autoencoder_tiny.py + vae.py (EncoderTiny, DecoderTiny,
// AutoencoderTinyBlock). Both are one nn.Sequential per half:
//   conv   3x3, padding 1 (weight [out, in, 3, 3], optional bias)
//   Block  relu(conv.4(relu(conv.2(relu(conv.0(x'))))) + skip(x')), x' = x + pool(x) when the
//          block has pool (pool = 1x1 conv C->4C, GroupNorm(4, 4C), ReLU, 1x1 conv 4C->C, no biases),
//          skip = 1x1 conv without bias when in != out, else identity
//   parameter-free layers (Clamp, ReLU, Upsample) take an index but have no keys.
// The layer list is read from the keys: for each Sequential index, "N.weight" is a conv,
// "N.conv.0.weight" a Block, and a missing index a parameter-free layer, which is
//   encoder: a ReLU after a conv (F32Encoder);
//   decoder: the Clamp before the first conv (original layout), a ReLU after a conv, an
//            Upsample (nearest x2) after a Block.
// Encoder convs have stride 2 except the last one and a first conv with bias that is followed
// by a Block (Encoder / EncoderTiny: convs without bias are the strided ones; F32Encoder: the
// convs followed by a ReLU are strided too).
//
// Key layouts: diffusers AutoencoderTiny ("encoder.layers.N...", "decoder.layers.N...", decoder
// without a Clamp index) and the original files (bare "N..." keys, one file per half, decoder
// index 0 = Clamp).
//
// Value conventions (as diffusers' AutoencoderTiny): encode takes images in [-1, 1] (maps them to
// [0, 1] first) and returns raw latents; decode clamps latents with tanh(x / 3) * 3, runs the
// layers and returns images in [-1, 1] (x * 2 - 1). The raw latents are the latent space of the
// matching full VAE (for SD: the scaled latents; for TAEF2: FLUX.2 VAE latents before 2x2 patchify).
#pragma once

#include "io/weight_index.h"
#include "models/vae/graph_exec.h"
#include "models/vae/host_tensor.h"
#include "nn/block.h"
#include "nn/layers.h"

#include <ggml-backend.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace easel::vae {

/// One half of a TAESD.
enum class TaesdPart { Encoder, Decoder };

/// Where the TAESD halves lie in an index: key prefixes ("encoder.layers.", "decoder.layers.", or
/// "" for an original single-half file). nullopt: that half is absent.
struct TaesdSource {
    std::optional<std::string> encoder_prefix;
    std::optional<std::string> decoder_prefix;
};

/// Finds TAESD halves in `index`: diffusers keys "encoder.layers.0.weight" /
/// "decoder.layers.0.weight"; an original file with bare keys is an encoder when "0.weight" has 3
/// input channels, a decoder when its first key index is 1 ("1.weight": index 0 is the Clamp).
TaesdSource find_taesd(const io::WeightIndex& index);

/// One layer of a TAESD half.
struct TaesdLayer {
    enum class Kind { Conv, Block, Relu, Upsample } kind = Kind::Conv;
    int index = -1;        ///< Sequential index ("N" of the keys); -1 for parameter-free layers
    int64_t in = 0, out = 0;
    int stride = 1;        ///< Conv only
    bool bias = true;      ///< Conv only
    bool pool = false;     ///< Block only: has the TAEF2 "midblock GN" pool
};

/// Reads the layer list of a half from the keys under `prefix` (see the file comment).
/// Throws Error(ModelMismatch) when the keys do not form a TAESD half (channel chain broken,
/// unknown sub-keys, a gap the rules do not explain).
std::vector<TaesdLayer> parse_taesd_layers(const io::WeightIndex& index, const std::string& prefix, TaesdPart part);

/// TAESD Block (taesd.py Block, diffusers AutoencoderTinyBlock). x: {W, H, in, N} -> {W, H, out, N}.
class TaesdBlock : public nn::Block {
public:
    TaesdBlock(int64_t in, int64_t out, bool pool);
    ggml_tensor* forward(nn::Ctx& c, ggml_tensor* x) const;
    nn::Conv2d *conv0, *conv2, *conv4;
    nn::Conv2d* skip = nullptr;
    nn::Conv2d *pool0 = nullptr, *pool3 = nullptr;
    nn::GroupNorm* pool1 = nullptr;
};

/// One TAESD half as a Sequential whose children are named by index ("3", "3.conv.0", ...).
class TaesdSequential : public nn::Block {
public:
    TaesdSequential(std::vector<TaesdLayer> layers, TaesdPart part);
    /// Encoder: image {W, H, 3, N} in [-1, 1] -> latents {W/f, H/f, L, N}.
    /// Decoder: latents {w, h, L, N} -> image {w*f, h*f, 3, N} in about [-1, 1].
    ggml_tensor* forward(nn::Ctx& c, ggml_tensor* x) const;
    const std::vector<TaesdLayer>& layers() const { return layers_; }
    TaesdPart part() const { return part_; }
    int64_t in_channels() const;
    int64_t out_channels() const;
    /// Pixels per latent pixel: 2^(strided convs) or 2^(upsamples).
    int spatial_factor() const;

private:
    std::vector<TaesdLayer> layers_;
    TaesdPart part_;
    std::vector<nn::Block*> modules_;  // per layer: Conv2d, TaesdBlock or nullptr
};

/// A loaded TAESD: encoder and/or decoder, parameters on one backend.
class TinyAutoencoder {
public:
    /// Loads every half found in `index` (find_taesd). Throws Error(ModelMismatch) if none.
    static std::unique_ptr<TinyAutoencoder> load(const io::WeightIndex& index, ggml_backend_t backend);
    /// Loads the halves from two indexes (original layout: taesd_encoder + taesd_decoder files);
    /// either may be nullptr.
    static std::unique_ptr<TinyAutoencoder> load(const io::WeightIndex* encoder_index,
                                                 const io::WeightIndex* decoder_index, ggml_backend_t backend);
    ~TinyAutoencoder();

    bool has_encoder() const { return encoder_ != nullptr; }
    bool has_decoder() const { return decoder_ != nullptr; }
    /// --vae-conv-direct: every k > 1 convolution of both halves as ggml_conv_2d_direct (nn::set_conv_direct).
    void set_conv_direct(bool direct);
    /// Latent channels (from whichever half is loaded).
    int64_t latent_channels() const;
    int spatial_factor() const;
    const TaesdSequential* encoder() const { return encoder_.get(); }
    const TaesdSequential* decoder() const { return decoder_.get(); }
    /// Bytes of the decoder's parameter buffer (0 without a decoder).
    uint64_t decoder_param_bytes() const { return dec_params_.size(); }

    /// image [N, 3, H, W] in [-1, 1] -> raw latents [N, L, H/f, W/f]. H, W multiples of f.
    HostTensor encode(const HostTensor& image, const ExecOptions& ex = {}) const;
    /// raw latents [N, L, h, w] -> image [N, 3, h*f, w*f] in about [-1, 1].
    HostTensor decode(const HostTensor& latents, const ExecOptions& ex = {}) const;

private:
    TinyAutoencoder() = default;
    std::unique_ptr<TaesdSequential> encoder_, decoder_;
    nn::ParamBuffer enc_params_, dec_params_;
    ggml_backend_t backend_ = nullptr;
};

/// taesd.py TAESD.scale_latents: raw latents -> [0, 1]: clamp(x / (2 * 3) + 0.5, 0, 1), in place
/// (latent_magnitude 3, latent_shift 0.5, as diffusers AutoencoderTiny.scale_latents).
void taesd_scale_latents(std::span<float> x);
/// taesd.py TAESD.unscale_latents: [0, 1] -> raw latents: (x - 0.5) * (2 * 3), in place.
void taesd_unscale_latents(std::span<float> x);

}  // namespace easel::vae
