// CLIP text encoders: transformers' CLIPTextModel and CLIPTextModelWithProjection
// (transformers/models/clip/modeling_clip.py), as a Block tree with transformers naming and as
// an nn::Sequence (prologue = embeddings, blocks = encoder layers, epilogue = final norm +
// pooling + projection).
//
// Used by SD1.x (OpenAI CLIP ViT-L/14, quick_gelu), SD2.x (OpenCLIP ViT-H, gelu), SDXL (CLIP-L +
// OpenCLIP bigG with projection), FLUX.1 / SD3 (CLIP-L pooled output).
//
// Canonical parameter names (the tree below; a TensorSource prefix such as "text_model." or
// "cond_stage_model.transformer.text_model." is added by the key map):
//   embeddings.token_embedding.weight      [vocab, width]
//   embeddings.position_embedding.weight   [positions, width]
//   encoder.layers.N.self_attn.{q,k,v,out}_proj.{weight,bias}
//   encoder.layers.N.layer_norm{1,2}.{weight,bias}
//   encoder.layers.N.mlp.fc1.{weight,bias} [intermediate, width], mlp.fc2 [width, intermediate]
//   final_layer_norm.{weight,bias}
//   text_projection.weight                 [projection, width] (no bias; WithProjection only)
// OpenCLIP original layout (SD2.x "cond_stage_model.model.", SDXL "conditioner.embedders.1.model.")
// maps onto it: token_embedding, positional_embedding, transformer.resblocks.N.{ln_1, ln_2,
// attn.in_proj_weight/in_proj_bias (fused q|k|v rows, sliced), attn.out_proj, mlp.c_fc,
// mlp.c_proj}, ln_final, text_projection ([width, projection], transposed on load).
//
// Tensor layout (ggml order): ids I32 {L, N}; hidden states F32 {width, L, N}; pooled
// {width, N}; text_embeds {projection, N}.
#pragma once

#include "io/weight_index.h"
#include "nn/layers.h"
#include "nn/sequence.h"

#include <nlohmann/json_fwd.hpp>

#include <optional>
#include <string>
#include <vector>

namespace easel::models::clip {

/// MLP activation of the encoder layers. QuickGelu: x * sigmoid(1.702 x) (OpenAI CLIP);
/// Gelu: exact erf GELU (OpenCLIP ViT-H/bigG; transformers "gelu").
enum class Activation { QuickGelu, Gelu };

/// Architecture of one CLIP text encoder. Every size is inferred from the weights
/// (infer_config); heads, activation, eps and the eos id come from config.json when given.
struct ClipConfig {
    int64_t vocab = 0;          ///< token_embedding rows
    int64_t width = 0;          ///< hidden size
    int64_t layers = 0;         ///< encoder layers
    int64_t positions = 0;      ///< max_position_embeddings
    int64_t intermediate = 0;   ///< fc1 rows
    int64_t heads = 0;          ///< attention heads (default width / 64)
    int64_t projection = 0;     ///< text_projection rows; 0 = no projection (CLIPTextModel)
    Activation act = Activation::QuickGelu;
    float eps = 1e-5f;          ///< layer_norm_eps
    /// eos_token_id: the pooled output is taken at the first position holding it; the legacy
    /// value 2 selects argmax(ids) instead, as transformers does.
    int64_t eos_token_id = 49407;
};

/// Values that override the inferred ones (from config.json, or tests).
struct ClipOverrides {
    std::optional<int64_t> heads;
    std::optional<Activation> act;
    std::optional<float> eps;
    std::optional<int64_t> eos_token_id;
    std::optional<int> layers;  ///< use only the first n layers (diffusers' SD2 text encoder drops the last)
};

/// Reads num_attention_heads, hidden_act ("quick_gelu" / "gelu"), layer_norm_eps and
/// eos_token_id from a transformers CLIPTextConfig JSON object (config.json, or the "config"
/// of a fixture sidecar). Throws Error(InvalidInput) on an unknown hidden_act.
ClipOverrides overrides_from_config_json(const nlohmann::json& config);

/// Where one CLIP text encoder's tensors are in a weight file.
struct ClipKeys {
    enum class Layout { Transformers, OpenClip } layout = Layout::Transformers;
    std::string prefix;             ///< prefix of the text model's tensors ("", "text_model.", "cond_stage_model.model."...)
    std::string projection_name;    ///< full stored name of the text projection; empty if none
};

/// Every CLIP text encoder found in `index` (SDXL single files hold two), ordered by prefix.
/// Transformers layout is recognised by "<p>embeddings.token_embedding.weight", OpenCLIP by
/// "<p>transformer.resblocks.0.attn.in_proj_weight" + "<p>token_embedding.weight".
std::vector<ClipKeys> find_clip_text_encoders(const io::WeightIndex& index);

/// Infers the configuration from tensor shapes under `keys`, then applies `ov`. Defaults not in
/// the weights: heads = width / 64 (1 if width is not a multiple of 64); act = Gelu for the
/// OpenCLIP layout and for widths 1024 / 1280 (OpenCLIP H / bigG converted to transformers
/// naming), QuickGelu otherwise (OpenAI CLIP); eps 1e-5; eos 49407. Throws Error(ModelMismatch) when a
/// needed tensor is missing or shapes disagree, Error(InvalidInput) for an impossible override.
ClipConfig infer_config(const io::WeightIndex& index, const ClipKeys& keys, const ClipOverrides& ov = {});

/// A TensorSource for the canonical names of a ClipTextModel(cfg) under `keys` (prefix, the
/// OpenCLIP mapper with fused-qkv slices and the transposed projection, the projection name).
nn::TensorSource make_tensor_source(const io::WeightIndex& index, const ClipKeys& keys, const ClipConfig& cfg);
/// Load options that ignore buffers CLIP files carry (position_ids, logit_scale, attn_mask)
/// and, when cfg uses fewer layers than the file, the unused layers.
nn::LoadOptions default_load_options(const ClipKeys& keys, const ClipConfig& cfg, const io::WeightIndex& index);

/// Graph inputs. pool_index: I32 {N}, the flat row (n * L + position) of each sequence's pooled
/// token (see pool_indices()); may be null when no pooled output is wanted.
struct ClipInputs {
    ggml_tensor* ids = nullptr;         ///< I32 {L, N}, L <= positions
    ggml_tensor* pool_index = nullptr;  ///< I32 {N} or null
    /// Textual-inversion vectors (text::embedding_inputs): the token embeddings become
    /// token_embedding(ids) * embed_keep + embed_fix before the positions are added (A1111
    /// EmbeddingsWithFixes). embed_keep F32 {1, L, N} (0 where a vector goes, 1 elsewhere),
    /// embed_fix F32 {width, L, N}; both or neither.
    ggml_tensor* embed_keep = nullptr;
    ggml_tensor* embed_fix = nullptr;
};

/// State between encoder layers: h and the causal mask (a function of L only, built in the
/// prologue; a segment may rebuild it with causal_mask()) and the pool index input.
struct ClipState {
    ggml_tensor* h = nullptr;           ///< F32 {width, L, N}
    ggml_tensor* mask = nullptr;        ///< F32 {L, L}: 0 on and below the diagonal, -inf above
    ggml_tensor* pool_index = nullptr;  ///< as ClipInputs::pool_index
    void visit_tensors(const nn::StateTensorFn& f) {
        f("h", h);
        f("mask", mask);
        if (pool_index) f("pool_index", pool_index);
    }
};

/// Epilogue outputs.
struct ClipOutputs {
    ggml_tensor* last_hidden_state = nullptr;  ///< final_layer_norm(h): {width, L, N}
    ggml_tensor* pooler_output = nullptr;      ///< last_hidden_state at the pooled token: {width, N} (null without pool_index)
    ggml_tensor* text_embeds = nullptr;        ///< text_projection(pooler_output): {projection, N} (null without projection)
};

/// What encode() returns besides the epilogue outputs.
struct ClipEncoded {
    ClipOutputs out;
    /// The prompt conditioning after clip skip (see ClipEncodeOptions): {width, L, N}.
    ggml_tensor* context = nullptr;
    /// hidden_states[0..layers] when asked for: [0] = embeddings, [i] = output of layer i.
    std::vector<ggml_tensor*> hidden_states;
};

/// Options of ClipTextModel::encode().
struct ClipEncodeOptions {
    /// sd-cli / A1111 convention: clip_skip k >= 2 takes hidden_states[-k] (k = 2: penultimate
    /// layer) as the context; k <= 1 takes the last layer. diffusers' StableDiffusionPipeline
    /// argument clip_skip = c selects hidden_states[-(c + 1)], i.e. our k = c + 1.
    int clip_skip = 0;
    /// Apply final_layer_norm to a skipped context (SD1.x/SD2.x pipelines do; SDXL does not).
    bool final_norm_on_skip = true;
    /// Also return every hidden state (costs no compute; keeps them alive in the graph).
    bool all_hidden_states = false;
};

/// One encoder layer (transformers CLIPEncoderLayer): pre-norm self-attention with a causal
/// mask, then a pre-norm MLP fc1 -> act -> fc2; both with residuals.
class ClipEncoderLayer : public nn::Block {
public:
    explicit ClipEncoderLayer(const ClipConfig& cfg);
    /// h: {width, L, N}; mask {L, L}. Returns {width, L, N}.
    ggml_tensor* forward(nn::Ctx& c, ggml_tensor* h, ggml_tensor* mask) const;

private:
    ClipConfig cfg_;
    nn::Linear *q_, *k_, *v_, *o_, *fc1_, *fc2_;
    nn::LayerNorm *ln1_, *ln2_;
};

/// CLIPTextModel (cfg.projection == 0) or CLIPTextModelWithProjection (cfg.projection > 0).
class ClipTextModel : public nn::Block, public nn::Sequence<ClipInputs, ClipState, ClipOutputs> {
public:
    explicit ClipTextModel(const ClipConfig& cfg);
    const ClipConfig& config() const { return cfg_; }

    int n_blocks() const override { return (int)layers_.size(); }
    /// Embeddings: token_embedding(ids) (with the textual-inversion vectors of embed_keep /
    /// embed_fix) + position_embedding[0..L). Throws Error(InvalidInput) when ids are not I32
    /// {L, N} with L <= positions, or the embedding inputs do not match them.
    ClipState prologue(nn::Ctx& c, const ClipInputs& in) const override;
    ClipState block(nn::Ctx& c, int i, ClipState s) const override;
    /// final_layer_norm, pooled output (get_rows at pool_index), text_projection.
    ClipOutputs epilogue(nn::Ctx& c, ClipState s) const override;
    const nn::Block& block_params(int i) const override { return *layers_.at((size_t)i); }

    /// The whole encoder with clip skip (runs only the layers needed when the pooled output
    /// is not asked for: no pool_index and no all_hidden_states).
    ClipEncoded encode(nn::Ctx& c, const ClipInputs& in, const ClipEncodeOptions& opt = {}) const;

    /// F32 {L, L} causal mask built in the graph (no host data): 0 where key <= query, -inf above.
    static ggml_tensor* causal_mask(nn::Ctx& c, int64_t L);

private:
    ClipConfig cfg_;
    nn::Embedding* tok_;
    nn::Embedding* pos_;
    std::vector<ClipEncoderLayer*> layers_;
    nn::LayerNorm* final_ln_;
    nn::Linear* proj_ = nullptr;
};

/// Checks host token ids before they become a graph input (ggml's get_rows would abort on an id
/// outside the table). Throws Error(InvalidInput) naming the first bad id and its position.
void check_token_ids(const std::vector<int32_t>& ids, int64_t vocab);

/// Host-side pooled-token rows for ClipInputs::pool_index, as transformers' CLIPTextTransformer:
/// for each sequence n the first position whose id equals eos_token_id (position 0 if none), or
/// argmax(ids) when eos_token_id == 2 (legacy configs). ids: N rows of L ids, row-major.
/// Returns n * L + position for each n.
std::vector<int32_t> pool_indices(const std::vector<int32_t>& ids, int64_t L, int64_t N, int64_t eos_token_id);

}  // namespace easel::models::clip
