// Qwen3 text encoder: transformers' Qwen3Model (transformers/models/qwen3/modeling_qwen3.py), the
// decoder-only LLM whose hidden states condition Z-Image (Qwen3-4B, hidden_states[-2]) and
// FLUX.2 [klein] (Qwen3-4B / Qwen3-8B, hidden_states[9], [18], [27] stacked per token).
//
// Architecture (pre-norm decoder layer, no biases):
//   h = embed_tokens(ids)
//   per layer:  x = input_layernorm(h)                                  RMSNorm(hidden)
//               q = q_norm(q_proj(x) per head), k = k_norm(k_proj(x) per head)   RMSNorm(head_dim)
//               q, k = RoPE(q, k, positions 0..L-1, theta)               rotate-half (GPT-NeoX) form
//               h = h + o_proj(attention(q, k, v_proj(x), causal + padding mask))   GQA
//               h = h + down_proj(silu(gate_proj(x2)) * up_proj(x2)),  x2 = post_attention_layernorm(h)
//   last_hidden_state = norm(h)
// Every size is inferred from the weights: vocab/hidden from embed_tokens, head_dim from
// q_norm, heads = q_proj rows / head_dim, kv heads = k_proj rows / head_dim, intermediate from
// gate_proj, layers by counting. rope_theta (default 1e6) and rms_norm_eps (default 1e-6) come
// from GGUF metadata (qwen3.rope.freq_base, qwen3.attention.layer_norm_rms_epsilon) or a
// config.json (rope_theta or rope_parameters.rope_theta, rms_norm_eps) when present.
//
// Canonical parameter names (transformers Qwen3Model; a Qwen3ForCausalLM file stores them under
// "model.", and lm_head.weight is ignored):
//   embed_tokens.weight                          [vocab, hidden]
//   layers.N.input_layernorm.weight              [hidden]
//   layers.N.self_attn.q_proj.weight             [heads * head_dim, hidden]
//   layers.N.self_attn.k_proj.weight             [kv_heads * head_dim, hidden]   (v_proj alike)
//   layers.N.self_attn.o_proj.weight             [hidden, heads * head_dim]
//   layers.N.self_attn.q_norm.weight             [head_dim]                      (k_norm alike)
//   layers.N.post_attention_layernorm.weight     [hidden]
//   layers.N.mlp.gate_proj.weight                [intermediate, hidden]          (up_proj alike)
//   layers.N.mlp.down_proj.weight                [hidden, intermediate]
//   norm.weight                                  [hidden]
// GGUF (llama.cpp names, arch "qwen3"): token_embd, blk.N.{attn_norm, attn_q, attn_k, attn_v,
// attn_output, attn_q_norm, attn_k_norm, ffn_norm, ffn_gate, ffn_up, ffn_down}, output_norm
// (output.weight = lm_head, ignored). llama.cpp's converter (convert_hf_to_gguf.py, Qwen3Model
// derives from Qwen2Model) does not permute q/k rows for Qwen2/Qwen3, so no un-permute is needed.
//
// Tensor layout (ggml order, innermost first): ids I32 {L, N}; hidden states F32 {hidden, L, N};
// attention mask F32 {L, L, 1, N} (key index fastest); positions I32 {L}.
#pragma once

#include "io/weight_index.h"
#include "nn/layers.h"
#include "nn/sequence.h"
#include "runtime/graph_runner.h"

#include <nlohmann/json_fwd.hpp>

#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace easel::models::qwen3 {

/// Architecture of one Qwen3 model (inferred from the weights, see infer_config()).
struct Qwen3Config {
    int64_t vocab = 0;         ///< embed_tokens rows
    int64_t hidden = 0;        ///< hidden_size
    int64_t layers = 0;        ///< num_hidden_layers
    int64_t heads = 0;         ///< num_attention_heads
    int64_t kv_heads = 0;      ///< num_key_value_heads (heads is a multiple of it)
    int64_t head_dim = 0;      ///< head_dim (Qwen3-4B: 128 with hidden 2560, so heads*head_dim != hidden)
    int64_t intermediate = 0;  ///< intermediate_size
    float eps = 1e-6f;         ///< rms_norm_eps (all RMSNorms)
    float rope_theta = 1e6f;   ///< RoPE base
};

/// Values that override the inferred ones (config.json, GGUF metadata, tests).
struct Qwen3Overrides {
    std::optional<float> eps;
    std::optional<float> rope_theta;
    /// Build and load only the first n layers (the rest of the file is ignored). The model is
    /// then an n-layer model: hidden-state index n means norm(output of layer n-1), and -2 the raw
    /// output of layer n-2, so keep the full depth when HF indices of the full model are wanted.
    std::optional<int> layers;
};

/// Reads rms_norm_eps and rope_theta (or rope_parameters.rope_theta) from a transformers
/// Qwen3Config JSON object. Unknown or absent fields are left unset.
Qwen3Overrides overrides_from_config_json(const nlohmann::json& config);

/// Where a Qwen3 model's tensors are in a weight index.
struct Qwen3Keys {
    enum class Layout { Transformers, Gguf } layout = Layout::Transformers;
    std::string prefix;  ///< "" or "model." (Qwen3ForCausalLM) or a checkpoint's text-encoder prefix; Gguf: ""
};

/// Finds a Qwen3 model in `index`: transformers naming is recognised by
/// "<p>embed_tokens.weight" + "<p>layers.0.self_attn.q_norm.weight" (the shortest such prefix
/// wins), llama.cpp naming by "token_embd.weight" + "blk.0.attn_q_norm.weight".
/// Returns nullopt when there is none.
std::optional<Qwen3Keys> find_qwen3(const io::WeightIndex& index);

/// Infers the configuration from tensor shapes (see the file comment), then applies GGUF
/// metadata, index.config() (config.json) and finally `ov`. Throws Error(ModelMismatch) when a
/// needed tensor is missing or shapes disagree (e.g. q_proj rows not a multiple of head_dim),
/// Error(InvalidInput) for an impossible override.
Qwen3Config infer_config(const io::WeightIndex& index, const Qwen3Keys& keys, const Qwen3Overrides& ov = {});

/// A TensorSource binding the canonical names of Qwen3Model(cfg) under `keys` (prefix, or the
/// llama.cpp renames for GGUF).
nn::TensorSource make_tensor_source(const io::WeightIndex& index, const Qwen3Keys& keys, const Qwen3Config& cfg);

/// Load options ignoring what a text encoder does not use: lm_head.weight / output.weight,
/// rotary inv_freq buffers, layers beyond cfg.layers, and reference-fixture entries ("__*").
nn::LoadOptions default_load_options(const Qwen3Keys& keys, const Qwen3Config& cfg, const io::WeightIndex& index);

/// Graph inputs.
struct Qwen3Inputs {
    ggml_tensor* ids = nullptr;   ///< I32 {L, N}
    ggml_tensor* mask = nullptr;  ///< F32 {L, L, 1, N} additive (see attention_mask()); null = causal only (built in the graph)
    ggml_tensor* pos = nullptr;   ///< I32 {L}: positions 0..L-1 (see positions())
};

/// State between decoder layers: the hidden state plus the mask and positions every layer
/// reads (inputs, passed through unchanged).
struct Qwen3State {
    ggml_tensor* h = nullptr;     ///< F32 {hidden, L, N}
    ggml_tensor* mask = nullptr;  ///< F32 {L, L} or {L, L, 1, N}
    ggml_tensor* pos = nullptr;   ///< I32 {L}
    void visit_tensors(const nn::StateTensorFn& f) {
        f("h", h);
        f("mask", mask);
        f("pos", pos);
    }
};

/// Epilogue output.
struct Qwen3Outputs {
    ggml_tensor* last_hidden_state = nullptr;  ///< norm(h): F32 {hidden, L, N}
};

/// One decoder layer (transformers Qwen3DecoderLayer).
class Qwen3DecoderLayer : public nn::Block {
public:
    explicit Qwen3DecoderLayer(const Qwen3Config& cfg);
    /// h: {hidden, L, N}; mask {L, L} or {L, L, 1, N}; pos I32 {L}. Returns {hidden, L, N}.
    ggml_tensor* forward(nn::Ctx& c, ggml_tensor* h, ggml_tensor* mask, ggml_tensor* pos) const;

private:
    Qwen3Config cfg_;
    nn::Linear *q_, *k_, *v_, *o_, *gate_, *up_, *down_;
    nn::RMSNorm *q_norm_, *k_norm_, *ln1_, *ln2_;
};

/// Qwen3Model as a Block tree with transformers naming and as an nn::Sequence
/// (prologue = embed_tokens, block i = layers.i, epilogue = final norm).
class Qwen3Model : public nn::Block, public nn::Sequence<Qwen3Inputs, Qwen3State, Qwen3Outputs> {
public:
    /// Throws Error(InvalidInput) on an inconsistent config (heads not a multiple of kv_heads...).
    explicit Qwen3Model(const Qwen3Config& cfg);
    const Qwen3Config& config() const { return cfg_; }

    int n_blocks() const override { return (int)layers_.size(); }
    /// embed_tokens(ids); mask = in.mask or a causal {L, L} mask; pos = in.pos.
    /// Throws Error(InvalidInput) when ids are not I32 {L, N}, pos is not I32 {L}, or the mask
    /// is not F32 {L, L, 1, N}.
    Qwen3State prologue(nn::Ctx& c, const Qwen3Inputs& in) const override;
    Qwen3State block(nn::Ctx& c, int i, Qwen3State s) const override;
    /// Final RMSNorm.
    Qwen3Outputs epilogue(nn::Ctx& c, Qwen3State s) const override;
    const nn::Block& block_params(int i) const override { return *layers_.at((size_t)i); }

    /// Hidden states with transformers' output_hidden_states semantics, one tensor
    /// {hidden, L, N} per requested index, in the order asked: index 0 = embeddings, index i
    /// (1 <= i < layers) = raw output of layer i-1, index `layers` = norm(output of the last
    /// layer) = last_hidden_state. Negative indices count from the end as in Python
    /// (-1 = last_hidden_state, -2 = output of layer layers-2: Z-Image's choice). Only the layers
    /// up to the highest requested index are built. Throws Error(InvalidInput) for an index
    /// outside [-(layers+1), layers] or an empty list.
    std::vector<ggml_tensor*> hidden_states(nn::Ctx& c, const Qwen3Inputs& in, std::span<const int> indices) const;

    /// The index in [0, layers] that `index` (possibly negative) denotes; throws as above.
    int resolve_index(int index) const;

private:
    Qwen3Config cfg_;
    nn::Embedding* tok_;
    std::vector<Qwen3DecoderLayer*> layers_;
    nn::RMSNorm* norm_;
};

/// Host-side additive attention mask for Qwen3Inputs::mask, as transformers combines a causal
/// mask with a padding mask: entry [n][q][k] (ggml {k, q, 1, n}) is 0 when k <= q and
/// mask01[n*L + k] != 0, else -inf. A query row with no visible key (a left-padded query)
/// keeps its causal entries instead, so that softmax stays finite (its output is at a padded
/// position, which callers discard). mask01: N rows of L values (1 = token, 0 = padding).
/// Throws Error(InvalidInput) if mask01.size() != N * L.
std::vector<float> attention_mask(std::span<const int32_t> mask01, int64_t L, int64_t N);

/// 0, 1, ..., L-1 (transformers' default position_ids; padding does not shift them).
std::vector<int32_t> positions(int64_t L);

/// Concatenates hidden states along the feature axis per token: k tensors {D_i, L, N} ->
/// {sum D_i, L, N}, as FLUX.2 klein's torch.stack(dim=1).permute(0, 2, 1, 3).reshape(B, L, k*D)
/// (diffusers pipeline_flux2_klein.py). Throws Error(InvalidInput) when L or N differ.
runtime::HostTensor stack_hidden_states(std::span<const runtime::HostTensor> hs);

/// Options of Qwen3TextEncoder.
struct Qwen3RunOptions {
    ggml_backend_dev_t device = nullptr;    ///< nullptr: the CPU
    int threads = 0;                        ///< CPU threads (0: all)
    ggml_type weight_type = GGML_TYPE_COUNT;  ///< matmul weight type (sd-cli --type); COUNT = as stored
    bool flash_attn = true;                 ///< use ggml_flash_attn_ext where supported
    Qwen3Overrides overrides;               ///< applied after the inferred config
};

/// Host-level runner: finds the Qwen3 model in a weight file, loads it onto one device and
/// returns hidden states for token ids.
class Qwen3TextEncoder {
public:
    /// Opens `path` (safetensors, shard index, GGUF, or a folder) and loads the model.
    /// Throws Error(ModelMismatch) when no Qwen3 model is found or keys/shapes disagree,
    /// Error(Io)/Error(InvalidInput) for unreadable/malformed files, Error(OutOfMemory).
    static Qwen3TextEncoder open(const std::filesystem::path& path, const Qwen3RunOptions& opt = {});
    /// Loads the model found in an opened index (the index may be dropped afterwards).
    explicit Qwen3TextEncoder(const io::WeightIndex& index, const Qwen3RunOptions& opt = {});
    Qwen3TextEncoder(Qwen3TextEncoder&&) noexcept;
    Qwen3TextEncoder& operator=(Qwen3TextEncoder&&) noexcept;
    ~Qwen3TextEncoder();

    const Qwen3Config& config() const;
    const Qwen3Model& model() const;
    /// Bytes of the loaded parameters.
    size_t param_bytes() const;
    /// The runner (backend) the model runs on; last_compute_bytes() after run().
    runtime::GraphRunner& runner() const;

    /// ids: B rows of L token ids (row-major [B, L]); mask01: [B, L] with 1 = token, 0 = padding
    /// (empty = no padding); indices: hidden-state indices as Qwen3Model::hidden_states().
    /// Returns one HostTensor per index, ne {hidden, L, B} (= PyTorch [B, L, hidden] row-major).
    /// Throws Error(InvalidInput) for sizes that disagree or ids outside the vocabulary.
    std::vector<runtime::HostTensor> run(std::span<const int32_t> ids, std::span<const int32_t> mask01, int64_t B,
                                         int64_t L, std::span<const int> indices) const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace easel::models::qwen3
