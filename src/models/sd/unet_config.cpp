// UNet structure inference from weights, config.json overrides and the LDM key map.
// Structure facts: diffusers models/unets/unet_2d_condition.py, unet_2d_blocks.py,
// transformers/transformer_2d.py; LDM names: diffusers loaders/single_file_utils.py.
#include "models/sd/unet_config.h"

#include "core/error.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <functional>
#include <set>

namespace easel::models::sd {

namespace {

// ---------------------------------------------------------------- config.json

std::optional<std::vector<int>> int_or_list(const nlohmann::json& cfg, const char* key) {
    auto it = cfg.find(key);
    if (it == cfg.end() || it->is_null()) return std::nullopt;
    std::vector<int> v;
    if (it->is_number_integer()) {
        v.push_back(it->get<int>());
    } else if (it->is_array()) {
        for (auto& e : *it) {
            if (!e.is_number_integer())
                fail(ErrorKind::InvalidInput, "UNet config.json: '{}' must be an integer or a list of integers", key);
            v.push_back(e.get<int>());
        }
    } else {
        fail(ErrorKind::InvalidInput, "UNet config.json: '{}' must be an integer or a list of integers", key);
    }
    for (int x : v)
        if (x <= 0) fail(ErrorKind::InvalidInput, "UNet config.json: '{}' has a non-positive entry {}", key, x);
    return v;
}

// ---------------------------------------------------------------- LDM names

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

// Parses "<int>." at the start of s (from pos); returns -1 if absent.
int parse_index(const std::string& s, size_t& pos) {
    int v = 0;
    auto r = std::from_chars(s.data() + pos, s.data() + s.size(), v);
    if (r.ec != std::errc() || r.ptr == s.data() + s.size() || *r.ptr != '.') return -1;
    pos = (size_t)(r.ptr - s.data()) + 1;
    return v;
}

// Resnet parameter names: diffusers -> LDM ResBlock (in_layers = [GroupNorm, SiLU, Conv],
// emb_layers = [SiLU, Linear], out_layers = [GroupNorm, SiLU, Dropout, Conv]).
std::string ldm_resnet_suffix(const std::string& rest) {
    static const std::pair<const char*, const char*> table[] = {
        {"norm1.", "in_layers.0."},  {"conv1.", "in_layers.2."},        {"norm2.", "out_layers.0."},
        {"conv2.", "out_layers.3."}, {"time_emb_proj.", "emb_layers.1."}, {"conv_shortcut.", "skip_connection."},
    };
    for (auto& [d, l] : table)
        if (starts_with(rest, d)) return l + rest.substr(std::char_traits<char>::length(d));
    return {};
}

// canonical -> LDM name, given layers_per_block L and whether up block b has attentions.
std::string ldm_key(int L, const std::function<bool(int)>& up_has_attn, const std::string& name) {
    static const std::pair<const char*, const char*> fixed[] = {
        {"time_embedding.linear_1.", "time_embed.0."}, {"time_embedding.linear_2.", "time_embed.2."},
        {"add_embedding.linear_1.", "label_emb.0.0."}, {"add_embedding.linear_2.", "label_emb.0.2."},
        {"conv_in.", "input_blocks.0.0."},             {"conv_norm_out.", "out.0."},
        {"conv_out.", "out.2."},
    };
    for (auto& [d, l] : fixed)
        if (starts_with(name, d)) return l + name.substr(std::char_traits<char>::length(d));

    const bool down = starts_with(name, "down_blocks.");
    const bool up = starts_with(name, "up_blocks.");
    if (down || up) {
        size_t pos = down ? 12 : 10;
        int b = parse_index(name, pos);
        if (b < 0) return {};
        std::string rest = name.substr(pos);
        const char* blocks = down ? "input_blocks" : "output_blocks";
        // down block b starts at input_blocks.(1 + b*(L+1)); up block b at output_blocks.(b*(L+1))
        const int base = down ? 1 + b * (L + 1) : b * (L + 1);
        auto sub = [&](const char* what) -> int {
            if (!starts_with(rest, what)) return -1;
            size_t p = std::char_traits<char>::length(what);
            int j = parse_index(rest, p);
            if (j < 0) return -1;
            rest = rest.substr(p);
            return j;
        };
        if (int j = sub("resnets."); j >= 0) {
            if (j > (down ? L - 1 : L)) return {};
            std::string r = ldm_resnet_suffix(rest);
            return r.empty() ? std::string{} : fmt::format("{}.{}.0.{}", blocks, base + j, r);
        }
        if (int j = sub("attentions."); j >= 0) {
            if (j > (down ? L - 1 : L)) return {};
            return fmt::format("{}.{}.1.{}", blocks, base + j, rest);
        }
        if (down && starts_with(rest, "downsamplers.0.conv."))
            return fmt::format("input_blocks.{}.0.op.{}", base + L, rest.substr(20));
        if (up && starts_with(rest, "upsamplers.0.conv."))
            return fmt::format("output_blocks.{}.{}.conv.{}", base + L, up_has_attn(b) ? 2 : 1, rest.substr(18));
        return {};
    }
    if (starts_with(name, "mid_block.")) {
        std::string rest = name.substr(10);
        size_t p = 0;
        if (starts_with(rest, "resnets.")) {
            p = 8;
            int j = parse_index(rest, p);
            if (j < 0) return {};
            std::string r = ldm_resnet_suffix(rest.substr(p));
            return r.empty() ? std::string{} : fmt::format("middle_block.{}.{}", 2 * j, r);
        }
        if (starts_with(rest, "attentions.")) {
            p = 11;
            int j = parse_index(rest, p);
            if (j < 0) return {};
            return fmt::format("middle_block.{}.{}", 2 * j + 1, rest.substr(p));
        }
    }
    return {};
}

// ---------------------------------------------------------------- inference

using Lookup = std::function<const io::TensorInfo*(const std::string&)>;

struct Inferer {
    Lookup find;
    std::string describe_layout;

    const std::vector<int64_t>& shape(const std::string& name, size_t rank) const {
        const io::TensorInfo* t = find(name);
        if (!t)
            fail(ErrorKind::ModelMismatch, "UNet weights ({}) lack '{}': the file is not a complete SD UNet", describe_layout,
                 name);
        if (t->shape.size() != rank)
            fail(ErrorKind::ModelMismatch, "UNet weight '{}' has {} dimensions, expected {}: not an SD UNet", name,
                 t->shape.size(), rank);
        return t->shape;
    }
    bool has(const std::string& name) const { return find(name) != nullptr; }

    ResnetSpec resnet(const std::string& p) const {
        ResnetSpec r;
        auto& c1 = shape(p + ".conv1.weight", 4);
        r.out = c1[0];
        r.in = c1[1];
        r.temb = shape(p + ".time_emb_proj.weight", 2)[1];
        r.shortcut = has(p + ".conv_shortcut.weight");
        if (!r.shortcut && r.in != r.out)
            fail(ErrorKind::ModelMismatch, "UNet resnet '{}' maps {} to {} channels but has no conv_shortcut", p, r.in, r.out);
        return r;
    }

    TransformerSpec transformer(const std::string& p) const {
        TransformerSpec t;
        const io::TensorInfo* pin = find(p + ".proj_in.weight");
        if (!pin || (pin->shape.size() != 2 && pin->shape.size() != 4))
            fail(ErrorKind::ModelMismatch, "UNet attention '{}' has no usable proj_in.weight", p);
        t.linear_proj = pin->shape.size() == 2;
        t.inner = pin->shape[0];
        t.channels = pin->shape[1];
        t.depth = 0;
        while (has(fmt::format("{}.transformer_blocks.{}.attn1.to_q.weight", p, t.depth))) ++t.depth;
        if (t.depth == 0) fail(ErrorKind::ModelMismatch, "UNet attention '{}' has no transformer_blocks", p);
        t.context_dim = shape(p + ".transformer_blocks.0.attn2.to_k.weight", 2)[1];
        t.ff_inner = shape(p + ".transformer_blocks.0.ff.net.2.weight", 2)[1];
        return t;
    }

    template <class Spec>
    void fill_block(Spec& s, const std::string& p, int max_layers) const {
        for (int j = 0; j < max_layers && has(fmt::format("{}.resnets.{}.conv1.weight", p, j)); ++j)
            s.resnets.push_back(resnet(fmt::format("{}.resnets.{}", p, j)));
        for (int j = 0; j < max_layers && has(fmt::format("{}.attentions.{}.proj_in.weight", p, j)); ++j)
            s.attentions.push_back(transformer(fmt::format("{}.attentions.{}", p, j)));
    }
};

void assign_heads(TransformerSpec& t, int heads, const std::string& where) {
    if (heads <= 0 || t.inner % heads != 0)
        fail(ErrorKind::InvalidInput,
             "UNet {}: {} channels do not split into {} attention heads; give the right heads "
             "(diffusers config.json attention_head_dim / num_attention_heads)",
             where, t.inner, heads);
    t.heads = heads;
    t.head_dim = t.inner / heads;
}

void check_groups(int64_t channels, int groups, const std::string& where) {
    if (groups <= 0 || channels % groups != 0)
        fail(ErrorKind::InvalidInput,
             "UNet {}: {} channels do not divide into {} GroupNorm groups; give the right norm_num_groups "
             "(diffusers config.json)",
             where, channels, groups);
}

// Follows the channels and the skip stack through the whole network, as
// UNet2DConditionModel.forward does, and checks that every block's weights fit.
void validate_flow(const UNetConfig& c) {
    auto mismatch = [](const std::string& where, int64_t want, int64_t got) {
        fail(ErrorKind::ModelMismatch, "UNet {}: expects {} input channels but receives {}: inconsistent weights", where,
             got, want);
    };
    int64_t h = c.model_channels;
    std::vector<int64_t> skips{h};
    for (size_t b = 0; b < c.down.size(); ++b) {
        auto& d = c.down[b];
        for (size_t j = 0; j < d.resnets.size(); ++j) {
            auto& r = d.resnets[j];
            if (r.in != h) mismatch(fmt::format("down_blocks.{}.resnets.{}", b, j), h, r.in);
            h = r.out;
            if (j < d.attentions.size() && d.attentions[j].channels != h)
                mismatch(fmt::format("down_blocks.{}.attentions.{}", b, j), h, d.attentions[j].channels);
            skips.push_back(h);
        }
        if (d.downsample) skips.push_back(h);
    }
    if (c.mid.present) {
        for (size_t j = 0; j < c.mid.resnets.size(); ++j) {
            if (c.mid.resnets[j].in != h) mismatch(fmt::format("mid_block.resnets.{}", j), h, c.mid.resnets[j].in);
            h = c.mid.resnets[j].out;
            if (j < c.mid.attentions.size() && c.mid.attentions[j].channels != h)
                mismatch(fmt::format("mid_block.attentions.{}", j), h, c.mid.attentions[j].channels);
        }
    }
    for (size_t b = 0; b < c.up.size(); ++b) {
        auto& u = c.up[b];
        for (size_t j = 0; j < u.resnets.size(); ++j) {
            if (skips.empty())
                fail(ErrorKind::ModelMismatch, "UNet up_blocks.{}.resnets.{} has no skip connection left: inconsistent weights",
                     b, j);
            const int64_t in = h + skips.back();
            skips.pop_back();
            if (u.resnets[j].in != in) mismatch(fmt::format("up_blocks.{}.resnets.{}", b, j), in, u.resnets[j].in);
            h = u.resnets[j].out;
            if (j < u.attentions.size() && u.attentions[j].channels != h)
                mismatch(fmt::format("up_blocks.{}.attentions.{}", b, j), h, u.attentions[j].channels);
        }
    }
    if (!skips.empty())
        fail(ErrorKind::ModelMismatch, "UNet up blocks use {} fewer skip connections than the down blocks make: inconsistent weights",
             skips.size());
    if (h != c.model_channels) mismatch("conv_norm_out", c.model_channels, h);
}

}  // namespace

// ---------------------------------------------------------------- public

UNetOverrides unet_overrides_from_diffusers_config(const nlohmann::json& cfg) {
    if (!cfg.is_object()) fail(ErrorKind::InvalidInput, "UNet config.json: expected a JSON object");
    UNetOverrides o;
    o.source = "config.json";
    // diffusers: num_attention_heads = num_attention_heads or attention_head_dim (naming quirk)
    o.num_heads = int_or_list(cfg, "num_attention_heads");
    if (!o.num_heads) o.num_heads = int_or_list(cfg, "attention_head_dim");
    auto num = [&](const char* key) -> std::optional<double> {
        auto it = cfg.find(key);
        if (it == cfg.end() || it->is_null()) return std::nullopt;
        if (!it->is_number()) fail(ErrorKind::InvalidInput, "UNet config.json: '{}' must be a number", key);
        return it->get<double>();
    };
    if (auto g = num("norm_num_groups")) o.norm_groups = (int)*g;
    if (auto e = num("norm_eps")) o.norm_eps = (float)*e;
    if (auto f = num("freq_shift")) o.freq_shift = (float)*f;
    if (auto t = num("addition_time_embed_dim")) o.addition_time_embed_dim = (int)*t;
    if (auto it = cfg.find("addition_embed_type"); it != cfg.end() && !it->is_null()) {
        if (!it->is_string() || it->get<std::string>() != "text_time")
            fail(ErrorKind::Unsupported, "UNet config.json: addition_embed_type {} is not supported (only \"text_time\", SDXL's)", it->dump());
    }
    if (auto it = cfg.find("flip_sin_to_cos"); it != cfg.end() && !it->is_null()) {
        if (!it->is_boolean()) fail(ErrorKind::InvalidInput, "UNet config.json: 'flip_sin_to_cos' must be true or false");
        o.flip_sin_to_cos = it->get<bool>();
    }
    return o;
}

UNetOverrides unet_overrides_from_file(const std::filesystem::path& path) {
    std::ifstream f(path);
    if (!f) fail(ErrorKind::Io, "cannot open UNet config '{}'", path.string());
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(f);
    } catch (const std::exception& e) {
        fail(ErrorKind::InvalidInput, "UNet config '{}' is not valid JSON: {}", path.string(), e.what());
    }
    auto o = unet_overrides_from_diffusers_config(j);
    o.source = path.string();
    return o;
}

int64_t UNetConfig::downsample_factor() const {
    int64_t f = 1;
    for (auto& d : down)
        if (d.downsample) f *= 2;
    return f;
}

std::string UNetConfig::summary() const {
    std::vector<std::string> blocks;
    for (auto& d : down) {
        std::string s = fmt::format("{}x{}", d.resnets.size(), d.resnets.empty() ? 0 : d.resnets.back().out);
        if (!d.attentions.empty())
            s += fmt::format("+attn(h{} d{} depth{})", d.attentions[0].heads, d.attentions[0].head_dim, d.attentions[0].depth);
        blocks.push_back(s);
    }
    std::string mid_s = "none";
    if (mid.present) mid_s = mid.attentions.empty() ? "resnets" : fmt::format("attn depth{}", mid.attentions[0].depth);
    return fmt::format("UNet {} layout, in {} out {}, channels {}, down [{}], mid {}, context {}{}, "
                       "{} groups, heads from {}",
                       layout == UNetKeyLayout::Ldm ? "LDM" : "diffusers", in_channels, out_channels, model_channels,
                       fmt::join(blocks, ", "), mid_s, context_dim,
                       has_add_embedding ? fmt::format(", text_time (pooled {} + {} ids x {})", add_text_dim, add_time_ids, add_time_dim)
                                         : std::string(),
                       norm_groups, heads_source);
}

std::string unet_ldm_key(const UNetConfig& cfg, const std::string& canonical) {
    return ldm_key(cfg.layers_per_block,
                   [&](int b) { return b >= 0 && b < (int)cfg.up.size() && !cfg.up[b].attentions.empty(); }, canonical);
}

nn::TensorSource make_unet_source(const io::WeightIndex& index, const UNetConfig& cfg) {
    nn::TensorSource src(index, cfg.prefix);
    if (cfg.layout == UNetKeyLayout::Ldm) {
        // copy what the mapper needs: the source may outlive cfg
        const int L = cfg.layers_per_block;
        std::vector<bool> up_attn;
        for (auto& u : cfg.up) up_attn.push_back(!u.attentions.empty());
        src.set_mapper([L, up_attn](const std::string& name) {
            return ldm_key(L, [&](int b) { return b >= 0 && b < (int)up_attn.size() && up_attn[b]; }, name);
        });
    }
    return src;
}

UNetConfig infer_unet_config(const io::WeightIndex& index, const UNetOverrides& given) {
    // fields not given fall back to the config.json found beside the weights (diffusers folder)
    UNetOverrides ov = given;
    if (const nlohmann::json* j = index.config(); j && j->is_object() && j->contains("block_out_channels")) {
        UNetOverrides f = unet_overrides_from_diffusers_config(*j);
        if (!ov.num_heads && !ov.head_dim) {
            ov.num_heads = f.num_heads;
            if (ov.num_heads) ov.source = "config.json";
        }
        if (!ov.norm_groups) ov.norm_groups = f.norm_groups;
        if (!ov.norm_eps) ov.norm_eps = f.norm_eps;
        if (!ov.flip_sin_to_cos) ov.flip_sin_to_cos = f.flip_sin_to_cos;
        if (!ov.freq_shift) ov.freq_shift = f.freq_shift;
        if (!ov.addition_time_embed_dim) ov.addition_time_embed_dim = f.addition_time_embed_dim;
    }
    UNetConfig c;
    // 1. layout and prefix
    static const char* prefixes[] = {"", "model.diffusion_model.", "diffusion_model.", "unet."};
    bool found = false;
    for (const char* p : prefixes) {
        if (index.contains(std::string(p) + "conv_in.weight")) {
            c.layout = UNetKeyLayout::Diffusers;
        } else if (index.contains(std::string(p) + "input_blocks.0.0.weight")) {
            c.layout = UNetKeyLayout::Ldm;
        } else {
            continue;
        }
        c.prefix = p;
        found = true;
        break;
    }
    if (!found)
        fail(ErrorKind::ModelMismatch,
             "no UNet found: the weights have neither conv_in.weight (diffusers) nor "
             "input_blocks.0.0.weight (LDM), with or without the model.diffusion_model. prefix");

    // 2. for LDM names, layers_per_block from the position of the first downsampler
    //    (input_blocks.(L+1).0.op) or, without one, from the number of input blocks.
    int ldm_L = 0;
    if (c.layout == UNetKeyLayout::Ldm) {
        int first_op = -1, n_in = 0;
        const std::string ib = c.prefix + "input_blocks.";
        for (auto& t : index.tensors()) {
            if (!starts_with(t.name, ib)) continue;
            size_t pos = ib.size();
            int n = parse_index(t.name, pos);
            if (n < 0) continue;
            n_in = std::max(n_in, n + 1);
            if (t.name.compare(pos, 5, "0.op.") == 0 && (first_op < 0 || n < first_op)) first_op = n;
        }
        ldm_L = first_op > 0 ? first_op - 1 : n_in - 1;
        if (ldm_L <= 0) fail(ErrorKind::ModelMismatch, "LDM UNet has no resnets in input_blocks: not an SD UNet");
    }

    Inferer inf;
    inf.describe_layout = c.layout == UNetKeyLayout::Ldm ? "LDM layout" : "diffusers layout";
    if (c.layout == UNetKeyLayout::Ldm) {
        inf.find = [&index, &c, ldm_L](const std::string& name) -> const io::TensorInfo* {
            std::string k = ldm_key(ldm_L, [&](int b) { return b < (int)c.up.size() && !c.up[b].attentions.empty(); }, name);
            return k.empty() ? nullptr : index.find(c.prefix + k);
        };
    } else {
        inf.find = [&index, &c](const std::string& name) { return index.find(c.prefix + name); };
    }

    // 3. stem and time embedding
    auto& ci = inf.shape("conv_in.weight", 4);
    c.model_channels = ci[0];
    c.in_channels = ci[1];
    c.conv_in_kernel = (int)ci[2];
    auto& t1 = inf.shape("time_embedding.linear_1.weight", 2);
    c.time_embed_dim = t1[0];
    c.time_proj_dim = t1[1];
    auto& co = inf.shape("conv_out.weight", 4);
    c.out_channels = co[0];
    c.conv_out_kernel = (int)co[2];
    if (co[1] != c.model_channels)
        fail(ErrorKind::ModelMismatch, "UNet conv_out takes {} channels but conv_in makes {}: inconsistent weights", co[1],
             c.model_channels);
    if (c.conv_in_kernel % 2 == 0 || c.conv_out_kernel % 2 == 0 || ci[2] != ci[3] || co[2] != co[3])
        fail(ErrorKind::ModelMismatch, "UNet conv_in/conv_out kernels must be square and odd");
    c.has_add_embedding = inf.has("add_embedding.linear_1.weight");
    if (c.has_add_embedding) {
        auto& a1 = inf.shape("add_embedding.linear_1.weight", 2);
        auto& a2 = inf.shape("add_embedding.linear_2.weight", 2);
        if (a1[0] != c.time_embed_dim || a2[0] != c.time_embed_dim || a2[1] != c.time_embed_dim)
            fail(ErrorKind::ModelMismatch, "UNet add_embedding [{}, {}] / [{}, {}] does not match the time embedding width {}", a1[0],
                 a1[1], a2[0], a2[1], c.time_embed_dim);
        c.add_embed_in = a1[1];
        c.add_time_dim = ov.addition_time_embed_dim.value_or(256);
        if (c.add_time_dim <= 0 || c.add_time_dim % 2 != 0)
            fail(ErrorKind::InvalidInput, "UNet addition_time_embed_dim {} must be a positive even number", c.add_time_dim);
        // SDXL base: 6 ids (original size, crop, target size); the refiner: 5 (original size,
        // crop, aesthetic score) with a 1280 pooled embedding (2560 = 1280 + 5 * 256).
        c.add_time_ids = c.add_embed_in - 5 * c.add_time_dim == 1280 ? 5 : 6;
        c.add_text_dim = c.add_embed_in - c.add_time_ids * c.add_time_dim;
        if (c.add_text_dim <= 0)
            fail(ErrorKind::ModelMismatch,
                 "UNet add_embedding takes {} values, fewer than {} time ids x {}: give addition_time_embed_dim (diffusers config.json)",
                 c.add_embed_in, c.add_time_ids, c.add_time_dim);
    }

    // 4. blocks
    const int max_down = c.layout == UNetKeyLayout::Ldm ? ldm_L : 1 << 20;
    for (int b = 0; inf.has(fmt::format("down_blocks.{}.resnets.0.conv1.weight", b)); ++b) {
        DownBlockSpec d;
        const std::string p = fmt::format("down_blocks.{}", b);
        inf.fill_block(d, p, max_down);
        d.downsample = inf.has(p + ".downsamplers.0.conv.weight");
        c.down.push_back(std::move(d));
    }
    if (c.down.empty()) fail(ErrorKind::ModelMismatch, "UNet has no down blocks");
    c.layers_per_block = (int)c.down[0].resnets.size();
    if (c.layout == UNetKeyLayout::Ldm) {
        for (auto& d : c.down)
            if ((int)d.resnets.size() != ldm_L)
                fail(ErrorKind::ModelMismatch, "LDM UNet down blocks have different numbers of resnets; not supported");
    }
    c.mid.present = inf.has("mid_block.resnets.0.conv1.weight");
    if (c.mid.present) {
        inf.fill_block(c.mid, "mid_block", 1 << 20);
        if (!c.mid.attentions.empty() && c.mid.attentions.size() + 1 != c.mid.resnets.size())
            fail(ErrorKind::ModelMismatch, "UNet mid block has {} resnets and {} attentions; expected one attention between each pair",
                 c.mid.resnets.size(), c.mid.attentions.size());
    }
    const int max_up = c.layout == UNetKeyLayout::Ldm ? ldm_L + 1 : 1 << 20;
    for (int b = 0; inf.has(fmt::format("up_blocks.{}.resnets.0.conv1.weight", b)); ++b) {
        UpBlockSpec u;
        const std::string p = fmt::format("up_blocks.{}", b);
        inf.fill_block(u, p, max_up);
        c.up.push_back(std::move(u));  // attentions known before the LDM upsampler lookup below
        c.up.back().upsample = inf.has(p + ".upsamplers.0.conv.weight");
    }
    if (c.up.size() != c.down.size())
        fail(ErrorKind::ModelMismatch, "UNet has {} down blocks but {} up blocks: inconsistent weights", c.down.size(),
             c.up.size());
    auto check_attn_count = [](size_t n_attn, size_t n_res, const std::string& where) {
        if (n_attn != 0 && n_attn != n_res)
            fail(ErrorKind::ModelMismatch, "UNet {} has {} resnets but {} attentions", where, n_res, n_attn);
    };
    for (size_t b = 0; b < c.down.size(); ++b)
        check_attn_count(c.down[b].attentions.size(), c.down[b].resnets.size(), fmt::format("down_blocks.{}", b));
    for (size_t b = 0; b < c.up.size(); ++b)
        check_attn_count(c.up[b].attentions.size(), c.up[b].resnets.size(), fmt::format("up_blocks.{}", b));

    // 5. settings not in the weights
    bool any_linear = false;
    auto each_attention = [&](const std::function<void(TransformerSpec&, int heads_index, const std::string&)>& fn) {
        const int n = (int)c.down.size();
        for (int b = 0; b < n; ++b)
            for (size_t j = 0; j < c.down[b].attentions.size(); ++j)
                fn(c.down[b].attentions[j], b, fmt::format("down_blocks.{}.attentions.{}", b, j));
        for (size_t j = 0; j < c.mid.attentions.size(); ++j)
            fn(c.mid.attentions[j], n - 1, fmt::format("mid_block.attentions.{}", j));
        for (int b = 0; b < n; ++b)
            for (size_t j = 0; j < c.up[b].attentions.size(); ++j)
                fn(c.up[b].attentions[j], n - 1 - b, fmt::format("up_blocks.{}.attentions.{}", b, j));
    };
    each_attention([&](TransformerSpec& t, int, const std::string&) {
        any_linear |= t.linear_proj;
        if (c.context_dim == 0) c.context_dim = t.context_dim;
    });

    if (ov.num_heads) {
        std::vector<int> heads = *ov.num_heads;
        if (heads.size() == 1) heads.assign(c.down.size(), heads[0]);
        if (heads.size() != c.down.size())
            fail(ErrorKind::InvalidInput, "UNet heads: {} entries given for {} down blocks", heads.size(), c.down.size());
        each_attention([&](TransformerSpec& t, int hi, const std::string& w) { assign_heads(t, heads[hi], w); });
        c.heads_source = ov.source.empty() ? "override" : ov.source;
    } else if (ov.head_dim) {
        each_attention([&](TransformerSpec& t, int, const std::string& w) {
            if (*ov.head_dim <= 0 || t.inner % *ov.head_dim != 0)
                fail(ErrorKind::InvalidInput, "UNet {}: {} channels are not a multiple of head size {}", w, t.inner, *ov.head_dim);
            assign_heads(t, (int)(t.inner / *ov.head_dim), w);
        });
        c.heads_source = ov.source.empty() ? "override" : ov.source;
    } else if (any_linear) {
        // SD2.x / SDXL convention: head size 64
        each_attention([&](TransformerSpec& t, int, const std::string& w) {
            if (t.inner % 64 != 0)
                fail(ErrorKind::InvalidInput,
                     "UNet {}: {} channels are not a multiple of 64, so the SD2.x head size cannot apply; "
                     "give the heads (diffusers config.json)",
                     w, t.inner);
            assign_heads(t, (int)(t.inner / 64), w);
        });
        c.heads_source = "SD2.x convention (head size 64)";
    } else {
        each_attention([&](TransformerSpec& t, int, const std::string& w) { assign_heads(t, 8, w); });
        c.heads_source = "SD1.x convention (8 heads)";
    }

    c.norm_groups = ov.norm_groups.value_or(32);
    c.norm_eps = ov.norm_eps.value_or(1e-5f);
    c.flip_sin_to_cos = ov.flip_sin_to_cos.value_or(true);
    c.freq_shift = ov.freq_shift.value_or(0.0f);
    if (!(c.norm_eps > 0.0f)) fail(ErrorKind::InvalidInput, "UNet norm_eps must be positive, got {}", c.norm_eps);

    // every GroupNorm must split evenly
    check_groups(c.model_channels, c.norm_groups, "conv_norm_out");
    auto groups_of = [&](const std::vector<ResnetSpec>& rs, const std::string& where) {
        for (size_t j = 0; j < rs.size(); ++j) {
            check_groups(rs[j].in, c.norm_groups, fmt::format("{}.resnets.{}.norm1", where, j));
            check_groups(rs[j].out, c.norm_groups, fmt::format("{}.resnets.{}.norm2", where, j));
        }
    };
    for (size_t b = 0; b < c.down.size(); ++b) groups_of(c.down[b].resnets, fmt::format("down_blocks.{}", b));
    groups_of(c.mid.resnets, "mid_block");
    for (size_t b = 0; b < c.up.size(); ++b) groups_of(c.up[b].resnets, fmt::format("up_blocks.{}", b));
    each_attention([&](TransformerSpec& t, int, const std::string& w) { check_groups(t.channels, c.norm_groups, w + ".norm"); });

    validate_flow(c);
    return c;
}

bool uses_linear_projection(const UNetConfig& cfg) {
    for (const auto& d : cfg.down)
        for (const auto& t : d.attentions)
            if (t.linear_proj) return true;
    for (const auto& t : cfg.mid.attentions)
        if (t.linear_proj) return true;
    for (const auto& u : cfg.up)
        for (const auto& t : u.attentions)
            if (t.linear_proj) return true;
    return false;
}

}  // namespace easel::models::sd
