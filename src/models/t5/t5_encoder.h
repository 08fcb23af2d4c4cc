// T5 text encoder: transformers' T5EncoderModel (transformers/models/t5/modeling_t5.py), the
// text_encoder_2 of FLUX.1 and text_encoder_3 of SD3 (T5 v1.1 XXL), also t5-small .. t5-large
// (T5 v1.0: ReLU FFN) and UMT5-style stacks (a relative bias table in every layer).
//
// Architecture (per layer, pre-norm, residual, no biases anywhere):
//   x = h;  n = T5LayerNorm(x)                    RMS norm without mean: n = x / sqrt(mean(x^2) + eps) * w
//   h = x + o(softmax(q(n) k(n)^T + position_bias) v(n))   multi-head, NO 1/sqrt(d_kv) scaling
//   h = h + wo(gelu_new(wi_0(T5LayerNorm(h))) * wi_1(T5LayerNorm(h)))   gated-gelu (T5 v1.1)
//       or  wo(relu(wi(T5LayerNorm(h))))                                 (T5 v1.0)
// then final_layer_norm. gelu_new is the tanh approximation
//   0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
// position_bias[h, i, j] = relative_attention_bias[bucket(j - i), h], computed from layer 0's
// table and shared by every layer (transformers passes it down the stack); the attention mask,
// when given, is added to it ((1 - mask) * float_min, as transformers' get_extended_attention_mask).
// bucket() is T5's bidirectional relative_position_bucket (see relative_position_buckets()).
//
// Canonical parameter names (transformers layout; ComfyUI's t5xxl_fp16.safetensors and the
// diffusers text_encoder_2 folder use them as they are):
//   shared.weight                                                   [vocab, d_model]
//     (or encoder.embed_tokens.weight: the same tied table; whichever the file has)
//   encoder.block.N.layer.0.SelfAttention.{q,k,v}.weight            [heads*d_kv, d_model]
//   encoder.block.N.layer.0.SelfAttention.o.weight                  [d_model, heads*d_kv]
//   encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight  [buckets, heads]
//   encoder.block.N.layer.0.layer_norm.weight                       [d_model]
//   encoder.block.N.layer.1.DenseReluDense.{wi_0,wi_1}.weight       [d_ff, d_model]  (wi for v1.0)
//   encoder.block.N.layer.1.DenseReluDense.wo.weight                [d_model, d_ff]
//   encoder.block.N.layer.1.layer_norm.weight                       [d_model]
//   encoder.final_layer_norm.weight                                 [d_model]
// llama.cpp / city96 GGUF names (t5-v1_1-xxl-encoder-*.gguf) map onto them (as ComfyUI-GGUF's
// T5 key map): token_embd -> shared, enc.output_norm -> encoder.final_layer_norm,
// enc.blk.N.{attn_q, attn_k, attn_v, attn_o, attn_rel_b, attn_norm} -> ...layer.0.{SelfAttention.q,
// .k, .v, .o, .relative_attention_bias, layer_norm}, enc.blk.N.{ffn_gate, ffn_up, ffn_down,
// ffn_norm} -> ...layer.1.{DenseReluDense.wi_0, .wi_1, .wo, layer_norm}.
//
// Tensor layout (ggml order): ids I32 {L, N}; hidden states F32 {d_model, L, N}; position bias
// F32 {L, L, heads, 1} (key fastest); attention mask F32 {L, N} of 1 (attend) / 0 (masked key).
//
// Numerics: activations are F32 throughout. ggml's mul_mat with F16/BF16/quantised weights
// accumulates in F32 (the CPU converts the activation row to the weight's dot type, F16 for F16
// weights). T5 v1.1 XXL's feed-forward output reaches values beyond F16's 65504 (the reason
// transformers keeps `wo` in F32 and clamps in F16), so the input of `wo` is scaled by 1/32 before
// the matmul and the result by 32 after (exact in binary floating point), and the matmul is marked
// GGML_PREC_F32 for backends (CUDA) that would otherwise accumulate F16 weights in F16. The
// residual stream never leaves F32.
#pragma once

#include "io/weight_index.h"
#include "nn/layers.h"
#include "nn/sequence.h"

#include <optional>
#include <string>
#include <vector>

namespace easel::models::t5 {

/// Feed-forward kind: gated-gelu (T5 v1.1, FLUX/SD3 T5-XXL) or relu (T5 v1.0).
enum class FeedForward { GatedGelu, Relu };

/// Architecture of one T5 encoder, inferred from the weights (infer_config).
struct T5Config {
    int64_t vocab = 0;        ///< embedding rows (32128 for T5-XXL files, 32100 used by the tokenizer)
    int64_t d_model = 0;      ///< hidden size (4096 for XXL)
    int64_t d_kv = 0;         ///< per-head size (64)
    int64_t heads = 0;        ///< attention heads (64), from the relative bias table
    int64_t d_ff = 0;         ///< feed-forward size (10240)
    int64_t layers = 0;       ///< encoder blocks (24)
    int64_t num_buckets = 32; ///< relative_attention_num_buckets, from the bias table
    int64_t max_distance = 128;  ///< relative_attention_max_distance (not in the weights; 128 in every T5)
    FeedForward ff = FeedForward::GatedGelu;
    bool bias_every_layer = false;  ///< UMT5: every layer has its own relative_attention_bias
    float eps = 1e-6f;        ///< layer_norm_epsilon
};

/// Where a T5 encoder's tensors are in a file.
struct T5Keys {
    enum class Layout { Transformers, LlamaCpp } layout = Layout::Transformers;
    std::string prefix;  ///< prefix of the stored names ("", "text_encoders.t5xxl.transformer.", ...)
    /// Stored name (without prefix) of the token embedding: "shared.weight",
    /// "encoder.embed_tokens.weight" or "token_embd.weight".
    std::string embedding = "shared.weight";
};

/// Finds the T5 encoder in `index`: transformers layout by "<p>encoder.block.0.layer.0.SelfAttention.q.weight",
/// llama.cpp layout by "<p>enc.blk.0.attn_q.weight". Returns nullopt when there is none.
std::optional<T5Keys> find_t5_encoder(const io::WeightIndex& index);

/// Infers the configuration from tensor shapes (vocab, d_model from the embedding; heads and
/// buckets from layer 0's relative bias table [buckets, heads]; d_kv = q rows / heads; d_ff and
/// the feed-forward kind from wi_0/wi; layers by counting blocks). `eps` and `max_distance` keep
/// their T5 defaults. Throws Error(ModelMismatch) naming the missing or mis-shaped tensor.
T5Config infer_config(const io::WeightIndex& index, const T5Keys& keys);

/// A TensorSource for the canonical names under `keys` (prefix, the embedding's stored name, the
/// llama.cpp renames).
nn::TensorSource make_tensor_source(const io::WeightIndex& index, const T5Keys& keys);
/// Load options: the tied second copy of the embedding (shared / encoder.embed_tokens), a decoder
/// or lm_head in the same file are not reported as unexpected.
nn::LoadOptions default_load_options(const io::WeightIndex& index, const T5Keys& keys);

/// T5's bidirectional relative position buckets (modeling_t5.py T5Attention._relative_position_bucket
/// with bidirectional=True): for query i and key j, rel = j - i; half = num_buckets / 2;
/// bucket = (rel > 0 ? half : 0) + (|rel| < half/2 ? |rel| :
///   min(half - 1, half/2 + int(log(|rel| / (half/2)) / log(max_distance / (half/2)) * (half - half/2))))
/// computed in float32 as torch does. Returns L*L values, index i * L + j (key fastest), the
/// layout of EncoderInputs::buckets. Throws Error(InvalidInput) for L < 1 or num_buckets < 4.
std::vector<int32_t> relative_position_buckets(int64_t L, int64_t num_buckets, int64_t max_distance);

/// Graph inputs.
struct T5Inputs {
    ggml_tensor* ids = nullptr;      ///< I32 {L, N}
    ggml_tensor* buckets = nullptr;  ///< I32 {L*L}: relative_position_buckets(L, cfg.num_buckets, cfg.max_distance)
    ggml_tensor* mask = nullptr;     ///< optional F32 {L, N}: 1 = attend to this key, 0 = masked (padding)
};

/// State between blocks: the hidden state, the bucket input, the additive key mask, and the
/// position bias once block 0 has computed it (null before). A segment that starts after block 0
/// receives `bias` as an input like `h`.
struct T5State {
    ggml_tensor* h = nullptr;        ///< F32 {d_model, L, N}
    ggml_tensor* buckets = nullptr;  ///< as T5Inputs::buckets
    ggml_tensor* mask_add = nullptr; ///< F32 {L, 1, 1, N}: 0 or float_min per key; null = no mask
    ggml_tensor* bias = nullptr;     ///< F32 {L, L, heads, 1 or N}: position bias (+ mask), null before block 0
    void visit_tensors(const nn::StateTensorFn& f) {
        f("h", h);
        f("buckets", buckets);
        if (mask_add) f("mask_add", mask_add);
        if (bias) f("bias", bias);
    }
};

/// Epilogue output.
struct T5Outputs {
    ggml_tensor* last_hidden_state = nullptr;  ///< final_layer_norm(h): F32 {d_model, L, N}
};

/// One encoder block (transformers T5Block of an encoder): layer.0 = self-attention, layer.1 = FFN.
class T5Block : public nn::Block {
public:
    /// `rel_bias`: this block owns a relative_attention_bias table (block 0, or every block for UMT5).
    T5Block(const T5Config& cfg, bool rel_bias);
    /// h: {d_model, L, N}; bias: {L, L, heads, 1 or N} or null when this block computes it from
    /// `buckets` (then `mask_add` is added to it). Returns {d_model, L, N}; *bias_out receives the
    /// bias used (for the next block).
    ggml_tensor* forward(nn::Ctx& c, ggml_tensor* h, ggml_tensor* buckets, ggml_tensor* mask_add, ggml_tensor* bias,
                         ggml_tensor** bias_out) const;
    bool has_rel_bias() const { return rel_ != nullptr; }

private:
    T5Config cfg_;
    nn::Linear *q_, *k_, *v_, *o_;
    nn::RMSNorm *ln0_, *ln1_;
    nn::Linear *wi0_ = nullptr, *wi1_ = nullptr, *wi_ = nullptr, *wo_;
    nn::Param* rel_ = nullptr;
};

/// T5EncoderModel as a Sequence: prologue = token embedding (+ mask conversion), blocks =
/// encoder.block.N, epilogue = encoder.final_layer_norm.
class T5Encoder : public nn::Block, public nn::Sequence<T5Inputs, T5State, T5Outputs> {
public:
    /// Throws Error(InvalidInput) for an inconsistent config.
    explicit T5Encoder(const T5Config& cfg);
    const T5Config& config() const { return cfg_; }

    int n_blocks() const override { return (int)blocks_.size(); }
    /// Embeddings; validates the inputs: ids I32 {L, N}, buckets I32 {L*L}, mask F32 {L, N}.
    /// Throws Error(InvalidInput) on a bad shape or type.
    T5State prologue(nn::Ctx& c, const T5Inputs& in) const override;
    /// Block i. Throws Error(InvalidInput) when i is out of range or the state has no position
    /// bias and block i has no table to compute it.
    T5State block(nn::Ctx& c, int i, T5State s) const override;
    T5Outputs epilogue(nn::Ctx& c, T5State s) const override;
    const nn::Block& block_params(int i) const override { return *blocks_.at((size_t)i); }

private:
    T5Config cfg_;
    nn::Embedding* embed_;
    std::vector<T5Block*> blocks_;
    nn::RMSNorm* final_ln_;
};

/// Checks host token ids before they become a graph input (ggml's get_rows would abort on an id
/// outside the table). Throws Error(InvalidInput) naming the first bad id and its position.
void check_token_ids(const std::vector<int32_t>& ids, int64_t vocab);

}  // namespace easel::models::t5
