// ESRGAN-family image upscalers as ggml graphs: RRDBNet (ESRGAN, Real-ESRGAN x4plus, x4plus_anime_6B,
// x2plus) and SRVGGNetCompact (Real-ESRGAN realesr-animevideov3, realesr-general-x4v3).
//
// Architectures as published (Wang et al., "ESRGAN", ECCV 2018 workshops, and "Real-ESRGAN",
// ICCV 2021 workshops; BasicSR basicsr/archs/rrdbnet_arch.py, Real-ESRGAN
// realesrgan/archs/srvgg_arch.py):
//   RRDBNet        [pixel_unshuffle(u) when the model takes 3*u^2 channels: Real-ESRGAN x2 (u = 2), x1 (u = 4)]
//                  feat = conv_first(x); body = conv_body(RRDB_{n-1}(... RRDB_0(feat))); feat = feat + body;
//                  per upsampling stage: feat = lrelu(conv_up_k(nearest_x2(feat)));
//                  out = conv_last(lrelu(conv_hr(feat)))      scale = 2^stages / u
//     RRDB(x)      = rdb3(rdb2(rdb1(x))) * 0.2 + x
//     RDB(x)       x1 = lrelu(conv1(x)), x2 = lrelu(conv2([x, x1])), x3 = lrelu(conv3([x, x1, x2])),
//                  x4 = lrelu(conv4([x, x1, x2, x3])), x5 = conv5([x, x1, x2, x3, x4]); x5 * 0.2 + x
//                  (convs 3x3, padding 1; conv1..4 give `grow` channels; lrelu slope 0.2; [..] = channel concat)
//   SRVGGNetCompact  body: conv(3 -> F), PReLU, num_conv x (conv(F -> F), PReLU), conv(F -> 3 s^2);
//                  out = pixel_shuffle(body(x), s) + nearest_upsample(x, s)
// Values: RGB in [0, 1] in, RGB (about [0, 1], unclamped) out.
//
// Key layouts (every size inferred from the shapes, docs/formats.md "Upscalers"):
//   BasicSR RRDBNet    conv_first, body.N.rdb{1,2,3}.conv{1..5}, conv_body, conv_up1.., conv_hr, conv_last
//   ESRGAN (old)       model.0 (conv_first), model.1.sub.N.RDB{1,2,3}.conv{1..5}.0, model.1.sub.<n> (conv_body),
//                      model.3, model.6, ... (upsampling convs, after nn.Upsample and LeakyReLU entries),
//                      model.3k+2 (conv_hr), model.3k+4 (conv_last)  [B.sequential flattens the nesting]
//   ESRGAN (2019)      conv_first, RRDB_trunk.N.RDB{1,2,3}.conv{1..5}, trunk_conv, upconv1, upconv2, HRconv, conv_last
//   SRVGGNetCompact    body.0 conv, body.1 PReLU [F], ..., body.2k conv, body.2k+1 PReLU, body.2n+2 last conv
// under no prefix or "module." (DataParallel). The canonical names are BasicSR's; the others map
// onto them (nn::TensorSource mapper), nothing is copied.
//
// Both networks are nn::Sequences (prologue -> blocks -> epilogue), so the placement runtime runs
// them under a plan (PModule::Upscaler, models/esrgan/placed_upscaler.h): RRDBNet's blocks are the RRDBs
// (state: the conv_first output and the running features), SRVGGNetCompact's the conv + PReLU
// pairs between the first and the last conv (state: the input image and the features).
#pragma once

#include "io/weight_index.h"
#include "models/vae/host_tensor.h"
#include "nn/block.h"
#include "nn/layers.h"
#include "nn/sequence.h"

#include <memory>
#include <string>
#include <vector>

namespace easel::esrgan {

enum class Arch { RRDBNet, SRVGGNetCompact };

/// What the weights say about an upscaler.
struct EsrganConfig {
    /// Key layout of an RRDBNet (see the file comment); SRVGGNetCompact files have one layout.
    enum class Layout { BasicSR, EsrganOld, EsrganTrunk };
    Arch arch = Arch::RRDBNet;
    Layout layout = Layout::BasicSR;
    std::string prefix;       ///< stored-name prefix: "" or "module."
    int64_t in_channels = 3;  ///< channels conv_first takes (3 u^2 for RRDBNet with pixel unshuffle)
    int64_t num_feat = 64;
    int64_t num_grow = 32;    ///< RRDBNet: channels each RDB conv adds
    int num_block = 23;       ///< RRDBNet: RRDB blocks; SRVGGNetCompact: num_conv (convs between the first and the last)
    int n_upsample = 2;       ///< RRDBNet: nearest-x2 + conv stages
    int unshuffle = 1;        ///< RRDBNet: pixel-unshuffle factor of the input (1, 2 or 4)
    int scale = 4;            ///< output pixels per input pixel (RRDBNet: 2^n_upsample / unshuffle)
    /// "RRDBNet x4 (23 blocks, 64 features, grow 32, BasicSR keys)" and the like.
    std::string describe() const;
};

/// Input pixels around an output pixel that matter to it, for choosing a tile overlap
/// (esrgan::default_overlap): SRVGGNetCompact's receptive field radius, num_conv + 2 (each 3x3
/// conv reaches one pixel further: 18 for animevideov3, where 64-pixel tiles overlapping by 32
/// differ from the whole image by up to 1.3/255 and by 64 not at all); RRDBNet's field is hundreds
/// of pixels wide but its weights fade: 16 pixels (x unshuffle), Real-ESRGAN tiles with 10.
int64_t context_pixels(const EsrganConfig& cfg);

/// Infers the configuration from the weights. Throws Error(ModelMismatch) naming what the file
/// holds when it is not an RRDBNet / SRVGGNetCompact upscaler (e.g. "'x.safetensors' is a SD1.x
/// diffusion model, not an upscaler"), and Error(Unsupported) for an upscaler this code does not
/// run (a compact model without PReLU weights, non-RGB outputs, an ESRGAN x3).
EsrganConfig infer_config(const io::WeightIndex& index, const std::string& label);

/// The graph input of a network: the image {W, H, 3, 1}, RGB in [0, 1] (W, H multiples of
/// EsrganConfig::unshuffle).
struct EsrganInputs {
    ggml_tensor* x = nullptr;
};

/// The state between two blocks (an nn::SequenceState). RRDBNet: `skip` = conv_first's output
/// (added back after conv_body), `h` = the running features. SRVGGNetCompact: `skip` = the input
/// image (for the nearest-upsampled base), `h` = the features.
struct EsrganState {
    ggml_tensor* skip = nullptr;
    ggml_tensor* h = nullptr;
    /// Calls f on "skip" then "h".
    void visit_tensors(const nn::StateTensorFn& f) {
        f("skip", skip);
        f("h", h);
    }
};

/// One upscaler network as a Block tree (canonical BasicSR-style names) and a Sequence.
class UpscalerNet : public nn::Block, public nn::Sequence<EsrganInputs, EsrganState, ggml_tensor*> {
public:
    const EsrganConfig& config() const { return cfg_; }
    /// The whole network on one device: x {W, H, 3, 1} -> {W*s, H*s, 3, 1}. Throws
    /// Error(InvalidInput) when W or H is not a positive multiple of the unshuffle factor.
    ggml_tensor* upscale(nn::Ctx& c, ggml_tensor* x) const { return forward(c, EsrganInputs{x}); }

protected:
    explicit UpscalerNet(EsrganConfig cfg) : cfg_(std::move(cfg)) {}
    EsrganConfig cfg_;
};

/// Builds the network for `cfg` (parameters declared, not loaded).
std::unique_ptr<UpscalerNet> make_net(const EsrganConfig& cfg);

/// Where the canonical names lie in `index` (the prefix and, for the old ESRGAN and the compact
/// layouts, the name map).
nn::TensorSource tensor_source(const io::WeightIndex& index, const EsrganConfig& cfg);

/// Load options: every parameter F32 (convolution kernels of F16 files too: the networks are
/// small, and F32 kernels keep the convolutions exact).
nn::LoadOptions load_options();

/// Convolution as the networks use it: 3x3, stride 1, padding 1, through ggml_conv_2d_direct
/// (im2col in bounded slices, no full im2col buffer; F32 kernels stay F32) where c.backend runs it,
/// else nn::Conv2d's im2col + matmul. x {W, H, in, 1} -> {W, H, out, 1}.
ggml_tensor* conv3x3(nn::Ctx& c, const nn::Conv2d& conv, ggml_tensor* x);

/// torch.nn.functional.pixel_unshuffle / pixel_shuffle on {W, H, C, 1} images (batch 1):
/// unshuffle(x, u)[c*u*u + i*u + j][y][x'] = x[c][y*u + i][x'*u + j]; shuffle is its inverse.
ggml_tensor* pixel_unshuffle(ggml_context* ctx, ggml_tensor* x, int u);
ggml_tensor* pixel_shuffle(ggml_context* ctx, ggml_tensor* x, int s);

}  // namespace easel::esrgan
