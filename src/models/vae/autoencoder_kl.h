// AutoencoderKL: the KL-regularised VAE of Stable Diffusion 1.x/2.x, SDXL, FLUX.1 and Z-Image.
//
// Architecture as diffusers defines it (diffusers/models/autoencoders/autoencoder_kl.py and
// vae.py Encoder/Decoder; resnet.py ResnetBlock2D; attention_processor.py Attention with
// group_norm, one head over the H*W tokens, residual connection; downsampling.py Downsample2D:
// pad (0,1,0,1) then 3x3 conv stride 2; upsampling.py Upsample2D: nearest x2 then 3x3 conv).
// All norms are GroupNorm(norm_num_groups, eps 1e-6), the activation is SiLU.
//
// Canonical parameter names are diffusers' (encoder.down_blocks.0.resnets.1.conv1.weight,
// decoder.mid_block.attentions.0.to_q.weight, quant_conv.weight, ...). The original ldm layout
// (encoder.down.0.block.1.conv1.weight, decoder.up.N.block.M..., mid.attn_1.{q,k,v,proj_out} as
// 1x1 conv weights [C, C, 1, 1], nin_shortcut, norm_out), optionally under "first_stage_model."
// or "vae.", is read through a key map (facts from diffusers/loaders/single_file_utils.py,
// convert_ldm_vae_checkpoint). The configuration is inferred from the weight shapes; only the
// group count of the norms is not visible there (config.json, default 32).
//
// Tensor layout: images and latents are ggml ne = {W, H, C, N} (PyTorch [N, C, H, W]).
#pragma once

#include "io/weight_index.h"
#include "models/vae/graph_exec.h"
#include "models/vae/host_tensor.h"
#include "nn/block.h"
#include "nn/layers.h"
#include "nn/sequence.h"

#include <ggml-backend.h>
#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace easel::vae {

/// Key layout of a stored AutoencoderKL.
enum class KLLayout {
    Diffusers,        ///< diffusers names (to_q/to_k/to_v/to_out.0 Linear weights [C, C])
    DiffusersLegacy,  ///< old diffusers names of the mid attention (query/key/value/proj_attn)
    Ldm,              ///< original ldm / CompVis / BFL names (down.N.block.M, mid.attn_1.q as [C, C, 1, 1])
};

/// Where an AutoencoderKL lies in a weight file: key prefix and layout.
struct KLSource {
    std::string prefix;   ///< "" , "first_stage_model.", "vae." ...
    KLLayout layout = KLLayout::Diffusers;
    bool has_encoder = false;
    bool has_decoder = false;
    /// Ldm layout of the FLUX.2 VAE (BFL flux2 ae.safetensors): the 1x1 quant convs stored inside
    /// the halves, encoder.quant_conv / decoder.post_quant_conv (diffusers
    /// scripts/convert_flux2_to_diffusers.py), instead of top-level quant_conv / post_quant_conv.
    bool quant_in_halves = false;
};

/// Finds an AutoencoderKL in `index`: tries the prefixes "", "first_stage_model.", "vae." and the
/// three layouts by looking for the conv_in / conv_out keys. Returns nullopt when there is none.
std::optional<KLSource> find_autoencoder_kl(const io::WeightIndex& index);

/// The canonical (diffusers) -> stored (ldm, without prefix) name of a parameter of an
/// AutoencoderKL with `n_levels` resolution levels; used as the TensorSource mapper of the Ldm
/// layout. Examples: "decoder.up_blocks.0.resnets.2.conv_shortcut.weight" ->
/// "decoder.up.<n_levels-1>.block.2.nin_shortcut.weight";
/// "encoder.mid_block.attentions.0.to_out.0.bias" -> "encoder.mid.attn_1.proj_out.bias".
/// Names it does not know are returned unchanged.
std::string kl_canonical_to_ldm(const std::string& canonical, int n_levels);

/// Settings not visible in the weights.
struct KLOverrides {
    /// GroupNorm groups. Unset: "norm_num_groups" of the config.json beside the weights
    /// (io::WeightIndex::config()), else diffusers' default 32.
    std::optional<int> norm_num_groups;
    /// sd-cli's --vae-conv-direct: k > 1 convolutions as ggml_conv_2d_direct (nn::Conv2d::direct).
    bool conv_direct = false;
};

/// Reads the fields of a diffusers AutoencoderKL config.json object that the weights do not show
/// (norm_num_groups). Throws Error(InvalidInput) when a field has the wrong type or value.
KLOverrides kl_overrides_from_diffusers_config(const nlohmann::json& config);

/// Configuration of an AutoencoderKL (diffusers config names).
struct AutoencoderKLConfig {
    int64_t in_channels = 3;                 ///< image channels into the encoder
    int64_t out_channels = 3;                ///< image channels out of the decoder
    int64_t latent_channels = 4;             ///< channels of the latent (mean); the encoder emits 2x
    std::vector<int64_t> block_out_channels; ///< per resolution level, encoder order (e.g. 128,256,512,512)
    int layers_per_block = 2;                ///< resnets per encoder level (decoder: +1)
    int norm_num_groups = 32;                ///< GroupNorm groups of every norm
    bool conv_direct = false;                ///< KLOverrides::conv_direct (execution, not structure)
    float norm_eps = 1e-6f;                  ///< GroupNorm eps (diffusers VAE: 1e-6)
    bool use_quant_conv = true;              ///< 1x1 conv 2L->2L after the encoder
    bool use_post_quant_conv = true;         ///< 1x1 conv L->L before the decoder
    bool mid_block_attention = true;         ///< mid block has the self-attention
    bool has_encoder = true;
    bool has_decoder = true;

    /// Image pixels per latent pixel: 2^(levels-1).
    int spatial_factor() const { return 1 << (int(block_out_channels.size()) - 1); }
};

/// Infers the configuration from the weight shapes under `src` (prefix + layout), e.g.
/// block_out_channels from encoder.down_blocks.i.resnets.0.conv1.weight [out, in, 3, 3],
/// latent_channels from decoder.conv_in.weight [C0, L, 3, 3]. Throws Error(ModelMismatch) when
/// the keys do not describe an AutoencoderKL or encoder and decoder disagree.
AutoencoderKLConfig infer_autoencoder_kl_config(const io::WeightIndex& index, const KLSource& src,
                                                const KLOverrides& ov = {});

/// diffusers ResnetBlock2D without time embedding:
/// h = conv1(silu(norm1(x))); h = conv2(silu(norm2(h))); out = shortcut(x) + h,
/// shortcut = 1x1 conv_shortcut when in != out. x: {W, H, in, N} -> {W, H, out, N}.
class ResnetBlock2D : public nn::Block {
public:
    ResnetBlock2D(int64_t in, int64_t out, int groups, float eps);
    ggml_tensor* forward(nn::Ctx& c, ggml_tensor* x) const;
    nn::GroupNorm *norm1, *norm2;
    nn::Conv2d *conv1, *conv2;
    nn::Conv2d* conv_shortcut = nullptr;
};

/// Linear projection of the VAE attention. Its weight is [C, C] (diffusers) or [C, C, 1, 1]
/// (ldm 1x1 conv, `conv_shape`); either way it acts as a Linear over ne[0].
class AttnProjection : public nn::Block {
public:
    AttnProjection(int64_t channels, bool conv_shape);
    /// x: {C, L, N} -> {C, L, N}.
    ggml_tensor* forward(nn::Ctx& c, ggml_tensor* x) const;
    int64_t channels;
    nn::Param* w;
    nn::Param* b;
};

/// The VAE mid-block attention (diffusers Attention with norm_num_groups, heads 1,
/// residual_connection=True): out = x + to_out(softmax(q k^T / sqrt(C)) v) over the H*W
/// tokens of group_norm(x). x: {W, H, C, N} -> same.
class VaeAttention : public nn::Block {
public:
    VaeAttention(int64_t channels, int groups, float eps, bool conv_shape);
    ggml_tensor* forward(nn::Ctx& c, ggml_tensor* x) const;
    int64_t channels;
    nn::GroupNorm* group_norm;
    AttnProjection *to_q, *to_k, *to_v, *to_out;
};

/// diffusers UNetMidBlock2D as the VAE uses it: resnet, [attention], resnet (C -> C).
class VaeMidBlock : public nn::Block {
public:
    VaeMidBlock(int64_t channels, int groups, float eps, bool attention, bool conv_shape);
    ggml_tensor* forward(nn::Ctx& c, ggml_tensor* x) const;
    ResnetBlock2D *resnet0, *resnet1;
    VaeAttention* attn = nullptr;
};

/// One encoder level (DownEncoderBlock2D): resnets, then (except the last level) the
/// downsampler pad (0,1,0,1) + 3x3 conv stride 2.
class DownEncoderBlock2D : public nn::Block {
public:
    DownEncoderBlock2D(int64_t in, int64_t out, int layers, bool downsample, int groups, float eps);
    ggml_tensor* forward(nn::Ctx& c, ggml_tensor* x) const;
    std::vector<ResnetBlock2D*> resnets;
    nn::Conv2d* down = nullptr;
};

/// One decoder level (UpDecoderBlock2D): resnets, then (except the last level) nearest x2
/// upsampling + 3x3 conv.
class UpDecoderBlock2D : public nn::Block {
public:
    UpDecoderBlock2D(int64_t in, int64_t out, int layers, bool upsample, int groups, float eps);
    ggml_tensor* forward(nn::Ctx& c, ggml_tensor* x) const;
    std::vector<ResnetBlock2D*> resnets;
    nn::Conv2d* up = nullptr;
};

/// diffusers vae.Encoder (double_z): image {W, H, in, N} -> moments {W/f, H/f, 2L, N}.
class VaeEncoder : public nn::Block {
public:
    explicit VaeEncoder(const AutoencoderKLConfig& cfg, bool conv_shape_attn);
    ggml_tensor* forward(nn::Ctx& c, ggml_tensor* x) const;
    nn::Conv2d* conv_in;
    std::vector<DownEncoderBlock2D*> down_blocks;
    VaeMidBlock* mid;
    nn::GroupNorm* norm_out;
    nn::Conv2d* conv_out;
};

/// diffusers vae.Decoder: latent {w, h, L, N} -> image {w*f, h*f, out, N}.
class VaeDecoder : public nn::Block {
public:
    explicit VaeDecoder(const AutoencoderKLConfig& cfg, bool conv_shape_attn);
    nn::Conv2d* conv_in;
    VaeMidBlock* mid;
    std::vector<UpDecoderBlock2D*> up_blocks;
    nn::GroupNorm* norm_out;
    nn::Conv2d* conv_out;
};

/// Which halves of the VAE to build and load.
enum class KLParts { Both, EncoderOnly, DecoderOnly };

/// Inputs of the decoder sequence: the raw (unscaled) latent z {w, h, L, N}, F32.
struct KLDecodeInputs {
    ggml_tensor* z = nullptr;
};

/// The state between two decoder blocks (an nn::SequenceState): the feature map {W, H, C, N}.
struct KLDecodeState {
    ggml_tensor* h = nullptr;
    /// Calls f on "h".
    void visit_tensors(const nn::StateTensorFn& f) { f("h", h); }
};

/// One block of the decoder sequence: a resnet, the mid-block attention, or an upsampler
/// (nearest x2 + 3x3 conv); `params` is its parameter subtree.
struct KLDecodeUnit {
    enum class Kind { Resnet, Attention, Upsample };
    Kind kind = Kind::Resnet;
    const nn::Block* params = nullptr;
    const ResnetBlock2D* resnet = nullptr;
    const VaeAttention* attn = nullptr;
    const nn::Conv2d* up = nullptr;
    std::string name;  ///< e.g. "decoder.up_blocks.1.upsamplers.0"
};

/// Inputs of the encoder sequence: the image {W, H, in, N} in [-1, 1], F32.
struct KLEncodeInputs {
    ggml_tensor* image = nullptr;
};

/// The state between two encoder blocks (an nn::SequenceState): the feature map {W, H, C, N}.
struct KLEncodeState {
    ggml_tensor* h = nullptr;
    /// Calls f on "h".
    void visit_tensors(const nn::StateTensorFn& f) { f("h", h); }
};

/// One block of the encoder sequence: a resnet, a downsampler (pad (0,1,0,1) + 3x3 conv stride
/// 2) or the mid-block attention; `params` is its parameter subtree.
struct KLEncodeUnit {
    enum class Kind { Resnet, Downsample, Attention };
    Kind kind = Kind::Resnet;
    const nn::Block* params = nullptr;
    const ResnetBlock2D* resnet = nullptr;
    const VaeAttention* attn = nullptr;
    const nn::Conv2d* down = nullptr;
    std::string name;  ///< e.g. "encoder.down_blocks.0.downsamplers.0"
};

/// The AutoencoderKL encoder (with quant_conv) as a typed block sequence (nn::Sequence), so the
/// placement runtime can cut it into segments on devices, keep its weights in RAM or on disk,
/// and measure any block range (models/vae/placed_encoder.h):
///   prologue   encoder.conv_in: image {W, H, in, N} -> {W, H, C0, N}
///   block[i]   in order: for each down block b (highest resolution first)
///              down_blocks.b.resnets.0..layers-1, then down_blocks.b.downsamplers.0 (all but the
///              last level), then mid_block.resnets.0, mid_block.attentions.0 (when present),
///              mid_block.resnets.1
///   epilogue   conv_norm_out -> SiLU -> conv_out -> quant_conv (when present):
///              {w, h, C_last, N} -> moments {w, h, 2L, N}
/// The ops and their order are those of diffusers vae.Encoder.forward followed by
/// AutoencoderKL.encode's quant_conv; AutoencoderKL::encode_moments is forward() (the same
/// graph). Owned by an AutoencoderKL built with its encoder (AutoencoderKL::encoder_sequence);
/// it refers into that tree and must not outlive it.
class KLEncoderSequence : public nn::Sequence<KLEncodeInputs, KLEncodeState, ggml_tensor*> {
public:
    int n_blocks() const override { return int(units_.size()); }
    /// encoder.conv_in.
    KLEncodeState prologue(nn::Ctx& c, const KLEncodeInputs& in) const override;
    /// Block i (see the class comment). Throws Error(InvalidInput) for a bad index.
    KLEncodeState block(nn::Ctx& c, int i, KLEncodeState s) const override;
    /// conv_norm_out + SiLU + conv_out (+ quant_conv).
    ggml_tensor* epilogue(nn::Ctx& c, KLEncodeState s) const override;
    const nn::Block& block_params(int i) const override { return *units_.at(size_t(i)).params; }
    /// Block i of the encoder sequence. Throws std::out_of_range for a bad index.
    const KLEncodeUnit& unit(int i) const { return units_.at(size_t(i)); }

private:
    friend class AutoencoderKL;
    const VaeEncoder* encoder_ = nullptr;
    const nn::Conv2d* quant_conv_ = nullptr;
    std::vector<KLEncodeUnit> units_;
};

/// The AutoencoderKL module tree (root names: encoder, decoder, quant_conv, post_quant_conv).
///
/// The decoder is a typed block sequence (nn::Sequence, nn/sequence.h), so the placement
/// runtime can cut it into segments on devices, stream its weights or measure any block range:
///   prologue   post_quant_conv (when present) + decoder.conv_in
///   block[i]   in order: mid_block.resnets.0, mid_block.attentions.0 (when present),
///              mid_block.resnets.1, then for each up block b (lowest resolution first)
///              up_blocks.b.resnets.0..layers, then up_blocks.b.upsamplers.0 (all but the last)
///   epilogue   conv_norm_out -> SiLU -> conv_out: {W, H, C0, N} -> image {W, H, out, N}
/// The state between blocks is the feature map (KLDecodeState). The ops and their order are
/// those of diffusers vae.Decoder.forward; decode() is forward() (the same graph).
/// n_blocks() is 0 when the decoder was not built; prologue/epilogue then throw.
class AutoencoderKL : public nn::Block, public nn::Sequence<KLDecodeInputs, KLDecodeState, ggml_tensor*> {
public:
    /// Builds the tree for `cfg`; `parts` leaves out a half (its params are then not declared).
    /// `ldm_attn_shape` declares the attention projections as [C, C, 1, 1] (ldm layout).
    AutoencoderKL(const AutoencoderKLConfig& cfg, KLParts parts = KLParts::Both, bool ldm_attn_shape = false);

    const AutoencoderKLConfig& config() const { return cfg_; }
    bool has_encoder() const { return encoder_ != nullptr; }
    bool has_decoder() const { return decoder_ != nullptr; }

    /// image {W, H, in, N} (values in [-1, 1]) -> moments {W/f, H/f, 2L, N}: encoder then
    /// quant_conv, i.e. encoder_sequence().forward({image}). Channels [0, L) are the mean,
    /// [L, 2L) the unclamped log-variance. Throws Error(InvalidInput) when the encoder was not built.
    ggml_tensor* encode_moments(nn::Ctx& c, ggml_tensor* image) const;
    /// The encoder as a typed block sequence (KLEncoderSequence). Throws Error(InvalidInput)
    /// when the encoder was not built.
    const KLEncoderSequence& encoder_sequence() const;

    /// latent {w, h, L, N} (raw, not scaled) -> image {w*f, h*f, out, N}: forward({z}).
    /// Throws Error(InvalidInput) when the decoder was not built.
    ggml_tensor* decode(nn::Ctx& c, ggml_tensor* z) const;

    // nn::Sequence (the decoder; see the class comment)
    int n_blocks() const override { return int(units_.size()); }
    /// post_quant_conv + conv_in: z {w, h, L, N} -> {w, h, C_top, N}.
    KLDecodeState prologue(nn::Ctx& c, const KLDecodeInputs& in) const override;
    KLDecodeState block(nn::Ctx& c, int i, KLDecodeState s) const override;
    /// conv_norm_out + SiLU + conv_out: {W, H, C0, N} -> {W, H, out, N}.
    ggml_tensor* epilogue(nn::Ctx& c, KLDecodeState s) const override;
    const nn::Block& block_params(int i) const override { return *units_.at(size_t(i)).params; }
    /// Block i of the decoder sequence. Throws std::out_of_range for a bad index.
    const KLDecodeUnit& unit(int i) const { return units_.at(size_t(i)); }

private:
    AutoencoderKLConfig cfg_;
    VaeEncoder* encoder_ = nullptr;
    VaeDecoder* decoder_ = nullptr;
    nn::Conv2d* quant_conv_ = nullptr;
    nn::Conv2d* post_quant_conv_ = nullptr;
    std::vector<KLDecodeUnit> units_;
    std::unique_ptr<KLEncoderSequence> enc_seq_;  // when the encoder is built
};

/// The TensorSource of an AutoencoderKL stored under `src` in `index` (prefix, and the key map
/// of the ldm / legacy diffusers layouts; docs/formats.md). `cfg` gives the level count.
nn::TensorSource kl_tensor_source(const io::WeightIndex& index, const KLSource& src, const AutoencoderKLConfig& cfg);

/// The load options AutoencoderKLModel::load uses for `parts` of a VAE of configuration `cfg`:
/// weights kept in `weight_type` (F32 or F16, else Error(InvalidInput)), unexpected keys checked
/// only when every half the file holds is built, the FLUX.2 BatchNorm statistics ignored.
nn::LoadOptions kl_load_options(const AutoencoderKLConfig& cfg, KLParts parts, ggml_type weight_type = GGML_TYPE_F32);

/// Tiling settings of encode/decode (--vae-tiling), in image pixels. Tiles are
/// tile_size x tile_size image pixels (tile_size / f latent pixels), placed every
/// tile_size * (1 - overlap) pixels and blended linearly over tile_size * overlap pixels
/// (diffusers AutoencoderKL.tiled_decode / _tiled_encode with blend_v / blend_h).
struct TilingOptions {
    bool enabled = false;
    int tile_size = 512;     ///< image pixels (diffusers: config.sample_size); must be a multiple of f
    float overlap = 0.25f;   ///< fraction of a tile shared with its neighbour (diffusers tile_overlap_factor)
};

/// Result of encode: the parameters of the diagonal Gaussian posterior.
struct LatentDist {
    HostTensor mean;    ///< [N, L, H/f, W/f]
    HostTensor logvar;  ///< [N, L, H/f, W/f], clamped to [-30, 20] (DiagonalGaussianDistribution)
};

/// The decode rule of AutoencoderKLModel::decode with the graph execution left to `run` (so a
/// placed decoder tiles exactly as the whole one): checks latent [N, L, h, w] against `cfg`
/// (channels, non-empty; else Error(InvalidInput)) and the tile size (a positive multiple of f);
/// with tiling enabled and a latent larger than one tile (tile_size / f cells) in h or w, `run`
/// decodes each tile (tiled_apply: diffusers tiled_decode), else the whole latent once.
/// run: raw latent [N, L, th, tw] -> image [N, out, th*f, tw*f].
HostTensor decode_with(const AutoencoderKLConfig& cfg, const HostTensor& latent, const TilingOptions& tiling,
                       const std::function<HostTensor(const HostTensor&)>& run);

/// The largest latent a decode of an h x w latent hands to one graph, in latent cells: the
/// first tile (min(tile_size / f, h) x min(tile_size / f, w)) when `tiling` tiles it (as
/// decode_with decides), else {h, w}.
std::pair<int64_t, int64_t> decode_graph_latent(const AutoencoderKLConfig& cfg, int64_t h, int64_t w, const TilingOptions& tiling);

/// The encode rule of AutoencoderKLModel::encode_moments with the graph execution left to `run`
/// (so a placed encoder tiles exactly as the whole one): checks image [N, C, H, W] against `cfg`
/// (C = in_channels; H, W positive multiples of f; else Error(InvalidInput)) and the tile size (a
/// positive multiple of f); with tiling enabled and an image larger than one tile (tile_size
/// pixels) in H or W, `run` encodes each tile (tiled_apply: diffusers _tiled_encode, the moments
/// blended), else the whole image once. run: image [N, in, th, tw] -> moments [N, 2L, th/f, tw/f].
HostTensor encode_moments_with(const AutoencoderKLConfig& cfg, const HostTensor& image, const TilingOptions& tiling,
                               const std::function<HostTensor(const HostTensor&)>& run);

/// Splits moments [N, 2L, h, w] into the posterior: mean = channels [0, L), logvar = channels
/// [L, 2L) clamped to [-30, 20] (diffusers DiagonalGaussianDistribution). Throws
/// Error(InvalidInput) when the channel count is not 2L.
LatentDist moments_to_dist(const HostTensor& moments, int64_t latent_channels);

/// The largest image an encode of an H x W image (pixels) hands to one graph: the first tile
/// (min(tile_size, H) x min(tile_size, W)) when `tiling` tiles it (as encode_moments_with
/// decides), else {H, W}.
std::pair<int64_t, int64_t> encode_graph_image(const AutoencoderKLConfig& cfg, int64_t H, int64_t W, const TilingOptions& tiling);

/// A loaded AutoencoderKL with its parameters on one backend.
class AutoencoderKLModel {
public:
    /// Loads from `index` (layout and prefix found with find_autoencoder_kl, config inferred),
    /// parameters allocated in `backend`'s default buffer type. `weight_type` is the type the
    /// conv and projection weights are kept in: F32 by default, because F16 convolutions round
    /// the activations to F16 and the SDXL VAE's activations overflow it (the reason for
    /// "sdxl-vae-fp16-fix"); F16 halves the memory for VAEs known to be safe.
    /// Throws Error(ModelMismatch) when no AutoencoderKL is found or keys do not match,
    /// Error(OutOfMemory) when the parameters do not fit.
    static std::unique_ptr<AutoencoderKLModel> load(const io::WeightIndex& index, ggml_backend_t backend,
                                                    const KLOverrides& ov = {}, KLParts parts = KLParts::Both,
                                                    ggml_type weight_type = GGML_TYPE_F32);
    /// As load(), with the source given explicitly (e.g. an index whose keys were renamed).
    static std::unique_ptr<AutoencoderKLModel> load(const io::WeightIndex& index, const KLSource& src,
                                                    ggml_backend_t backend, const KLOverrides& ov = {},
                                                    KLParts parts = KLParts::Both, ggml_type weight_type = GGML_TYPE_F32);
    ~AutoencoderKLModel();

    const AutoencoderKLConfig& config() const { return module_->config(); }
    const AutoencoderKL& module() const { return *module_; }

    /// image [N, in, H, W] in [-1, 1] -> posterior mean/logvar [N, L, H/f, W/f].
    /// H and W must be multiples of f (else Error(InvalidInput)). With tiling, diffusers'
    /// _tiled_encode rule (the moments are blended, then split and clamped).
    LatentDist encode(const HostTensor& image, const TilingOptions& tiling = {}, const ExecOptions& ex = {}) const;
    /// Raw encoder moments [N, 2L, H/f, W/f] (mean, then unclamped logvar), optionally tiled.
    HostTensor encode_moments(const HostTensor& image, const TilingOptions& tiling = {}, const ExecOptions& ex = {}) const;
    /// latent [N, L, h, w] (raw) -> image [N, out, h*f, w*f] (about [-1, 1]); optionally tiled
    /// (diffusers tiled_decode rule). Throws Error(InvalidInput) on a channel mismatch.
    HostTensor decode(const HostTensor& latent, const TilingOptions& tiling = {}, const ExecOptions& ex = {}) const;

private:
    AutoencoderKLModel() = default;
    std::unique_ptr<AutoencoderKL> module_;
    nn::ParamBuffer params_;
    ggml_backend_t backend_ = nullptr;
};

}  // namespace easel::vae
