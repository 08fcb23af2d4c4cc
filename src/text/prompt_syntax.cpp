#include "text/prompt_syntax.h"

#include "core/error.h"
#include "core/log.h"
#include "text/unicode.h"

#include <algorithm>
#include <charconv>
#include <cmath>

namespace easel::text {
namespace {

bool is_word(char32_t c) { return c == U'_' || is_letter(c) || is_number(c); }

// Python float() on an ASCII string matching [+-]?[.0-9]+ ; nullopt if it is not a number.
std::optional<double> parse_double(std::string_view s) {
    if (!s.empty() && s[0] == '+') s.remove_prefix(1);
    if (s.empty()) return std::nullopt;
    double v = 0;
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
    return v;
}

// re.split(r"\s*\bBREAK\b\s*", text): the parts between matches (always matches+1 parts).
std::vector<std::u32string> split_break(std::u32string_view s) {
    static constexpr std::u32string_view kBreak = U"BREAK";
    std::vector<std::u32string> parts;
    size_t part_start = 0;  // also the end of the previous match
    size_t k = 0;
    while ((k = s.find(kBreak, k)) != std::u32string_view::npos) {
        const size_t after = k + kBreak.size();
        const bool left_ok = k == 0 || !is_word(s[k - 1]);
        const bool right_ok = after == s.size() || !is_word(s[after]);
        if (!left_ok || !right_ok) {
            ++k;
            continue;
        }
        size_t start = k;
        while (start > part_start && is_space(s[start - 1])) --start;
        size_t end = after;
        while (end < s.size() && is_space(s[end])) ++end;
        parts.emplace_back(s.substr(part_start, start - part_start));
        part_start = end;
        k = end;
    }
    parts.emplace_back(s.substr(part_start));
    return parts;
}

// Matches ":\s*([+-]?[.\d]+)\s*\)" at s[i] (s[i] == ':'). Returns the end and the number text.
std::optional<std::pair<size_t, std::u32string_view>> match_weight(std::u32string_view s, size_t i) {
    size_t j = i + 1;
    while (j < s.size() && is_space(s[j])) ++j;
    const size_t num_start = j;
    if (j < s.size() && (s[j] == U'+' || s[j] == U'-')) ++j;
    const size_t digits = j;
    while (j < s.size() && (s[j] == U'.' || (s[j] >= U'0' && s[j] <= U'9'))) ++j;
    if (j == digits) return std::nullopt;
    const size_t num_end = j;
    while (j < s.size() && is_space(s[j])) ++j;
    if (j >= s.size() || s[j] != U')') return std::nullopt;
    return std::pair{j + 1, s.substr(num_start, num_end - num_start)};
}

std::optional<float> parse_multiplier(const std::string& v) {
    // Python float(): surrounding whitespace allowed; accept the usual decimal forms.
    size_t a = v.find_first_not_of(" \t"), b = v.find_last_not_of(" \t");
    if (a == std::string::npos) return std::nullopt;
    std::string_view s(v.data() + a, b - a + 1);
    if (!s.empty() && s[0] == '+') s.remove_prefix(1);
    double d = 0;
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), d);
    if (ec != std::errc() || ptr != s.data() + s.size() || !std::isfinite(d)) return std::nullopt;
    return static_cast<float>(d);
}

}  // namespace

std::vector<WeightedText> parse_prompt_attention(std::string_view prompt) {
    const std::u32string s = utf8_decode(prompt);
    std::vector<std::pair<std::u32string, double>> res;
    std::vector<size_t> round, square;
    const double round_mult = 1.1, square_mult = 1 / 1.1;
    auto multiply_range = [&](size_t start, double m) {
        for (size_t p = start; p < res.size(); ++p) res[p].second *= m;
    };
    auto add_text = [&](std::u32string_view text) {
        const auto parts = split_break(text);
        for (size_t i = 0; i < parts.size(); ++i) {
            if (i > 0) res.emplace_back(U"BREAK", -1.0);
            res.emplace_back(parts[i], 1.0);
        }
    };
    const std::u32string_view sv(s);
    size_t i = 0;
    while (i < s.size()) {
        const char32_t c = s[i];
        if (c == U'\\') {
            if (i + 1 < s.size() && (s[i + 1] == U'(' || s[i + 1] == U')' || s[i + 1] == U'[' ||
                                     s[i + 1] == U']' || s[i + 1] == U'\\')) {
                res.emplace_back(std::u32string(1, s[i + 1]), 1.0);
                i += 2;
            } else {
                res.emplace_back(U"", 1.0);  // a lone backslash: text[1:] is empty
                i += 1;
            }
        } else if (c == U'(') {
            round.push_back(res.size());
            ++i;
        } else if (c == U'[') {
            square.push_back(res.size());
            ++i;
        } else if (c == U':') {
            auto m = match_weight(sv, i);
            if (m && !round.empty()) {
                const std::string num = utf8_encode(m->second);
                const auto w = parse_double(num);
                if (!w)
                    fail(ErrorKind::InvalidInput,
                         "prompt weight '{}' in '{}' is not a number; write a weight like (text:1.2)", num,
                         utf8_encode(sv.substr(i, m->first - i)));
                const size_t start = round.back();
                round.pop_back();
                multiply_range(start, *w);
                i = m->first;
            } else if (m) {
                add_text(sv.substr(i, m->first - i));
                i = m->first;
            } else {
                add_text(U":");
                ++i;
            }
        } else if (c == U')' && !round.empty()) {
            const size_t start = round.back();
            round.pop_back();
            multiply_range(start, round_mult);
            ++i;
        } else if (c == U']' && !square.empty()) {
            const size_t start = square.back();
            square.pop_back();
            multiply_range(start, square_mult);
            ++i;
        } else if (c == U')' || c == U']') {
            add_text(sv.substr(i, 1));
            ++i;
        } else {
            size_t j = i + 1;
            while (j < s.size() && s[j] != U'\\' && s[j] != U'(' && s[j] != U')' && s[j] != U'[' &&
                   s[j] != U']' && s[j] != U':')
                ++j;
            add_text(sv.substr(i, j - i));
            i = j;
        }
    }
    for (size_t pos : round) multiply_range(pos, round_mult);
    for (size_t pos : square) multiply_range(pos, square_mult);
    if (res.empty()) res.emplace_back(U"", 1.0);
    for (size_t k = 0; k + 1 < res.size();) {
        if (res[k].second == res[k + 1].second) {
            res[k].first += res[k + 1].first;
            res.erase(res.begin() + static_cast<std::ptrdiff_t>(k) + 1);
        } else {
            ++k;
        }
    }
    std::vector<WeightedText> out;
    out.reserve(res.size());
    for (auto& [t, w] : res) out.push_back({utf8_encode(t), w});
    return out;
}

PromptTags extract_extra_networks(std::string_view prompt) {
    const std::u32string s = utf8_decode(prompt);
    PromptTags out;
    std::u32string text;
    size_t i = 0;
    while (i < s.size()) {
        // <(\w+):([^>]+)>
        if (s[i] == U'<') {
            size_t j = i + 1;
            while (j < s.size() && is_word(s[j])) ++j;
            if (j > i + 1 && j < s.size() && s[j] == U':') {
                size_t k = j + 1;
                while (k < s.size() && s[k] != U'>') ++k;
                if (k < s.size() && k > j + 1) {
                    ExtraNetworkTag tag;
                    tag.kind = utf8_encode(std::u32string_view(s).substr(i + 1, j - i - 1));
                    const std::string args = utf8_encode(std::u32string_view(s).substr(j + 1, k - j - 1));
                    for (size_t p = 0;;) {
                        size_t q = args.find(':', p);
                        tag.args.push_back(args.substr(p, q == std::string::npos ? std::string::npos : q - p));
                        if (q == std::string::npos) break;
                        p = q + 1;
                    }
                    const std::string whole = utf8_encode(std::u32string_view(s).substr(i, k - i + 1));
                    if (tag.kind == "lora" || tag.kind == "lyco") {
                        std::vector<std::string> positional;
                        std::optional<std::string> te, unet, dyn;
                        for (const auto& a : tag.args) {
                            // A1111 ExtraNetworkParams: item.split('=', 2) of length 2 is named
                            const size_t eq = a.find('=');
                            if (eq == std::string::npos || a.find('=', eq + 1) != std::string::npos) {
                                positional.push_back(a);
                                continue;
                            }
                            const std::string key = a.substr(0, eq), val = a.substr(eq + 1);
                            if (key == "te") te = val;
                            else if (key == "unet") unet = val;
                            else if (key == "dyn") dyn = val;
                        }
                        if (positional.empty() || positional[0].empty())
                            fail(ErrorKind::InvalidInput, "extra-network tag {} has no name; write <lora:name:1.0>", whole);
                        tag.name = positional[0];
                        auto num = [&](const std::string& v) {
                            auto f = parse_multiplier(v);
                            if (!f)
                                fail(ErrorKind::InvalidInput,
                                     "LoRA tag {} has multiplier '{}' that is not a number; write e.g. <lora:{}:0.8>",
                                     whole, v, tag.name);
                            return *f;
                        };
                        tag.multiplier = positional.size() > 1 ? num(positional[1]) : 1.0f;
                        if (te) tag.multiplier = num(*te);
                        tag.unet_multiplier = positional.size() > 2 ? num(positional[2]) : tag.multiplier;
                        if (unet) tag.unet_multiplier = num(*unet);
                        std::optional<std::string> d = positional.size() > 3 ? std::optional(positional[3]) : dyn;
                        if (dyn) d = dyn;
                        if (d) {
                            int v = 0;
                            auto [ptr, ec] = std::from_chars(d->data(), d->data() + d->size(), v);
                            if (ec != std::errc() || ptr != d->data() + d->size())
                                fail(ErrorKind::InvalidInput, "LoRA tag {} has dyn '{}' that is not an integer", whole, *d);
                            tag.dyn_dim = v;
                        }
                        out.loras.push_back(std::move(tag));
                    } else {
                        tag.name = tag.args.empty() ? std::string() : tag.args[0];
                        log::warn("prompt tag {} is of unknown kind '{}' (only lora/lyco are supported); removed from the prompt",
                                  whole, tag.kind);
                        out.others.push_back(std::move(tag));
                    }
                    // the whitespace the tag leaves behind goes with it: "a cat <lora:x:1>" -> "a cat"
                    // (CLIP ignores it; Qwen3 and T5 would encode the extra space)
                    i = k + 1;
                    const bool at_start = std::all_of(text.begin(), text.end(), is_space);
                    if (at_start) {
                        text.clear();
                        while (i < s.size() && is_space(s[i])) ++i;
                    } else if (i == s.size() || is_space(s[i])) {
                        while (!text.empty() && is_space(text.back())) text.pop_back();
                    }
                    continue;
                }
            }
        }
        text.push_back(s[i]);
        ++i;
    }
    out.text = utf8_encode(text);
    return out;
}

WeightedChunks tokenize_weighted(const ClipTokenizer& tokenizer, std::string_view prompt, const ChunkOptions& opt) {
    if (opt.chunk_length < 1)
        fail(ErrorKind::InvalidInput, "chunk length {} must be at least 1 (CLIP uses 75)", opt.chunk_length);
    const std::vector<WeightedText> parsed =
        opt.parse_attention ? parse_prompt_attention(prompt) : std::vector<WeightedText>{{std::string(prompt), 1.0}};
    const int32_t comma = tokenizer.token_id(",</w>").value_or(-1);
    const size_t len = static_cast<size_t>(opt.chunk_length);

    WeightedChunks out;
    std::vector<int32_t> tokens;
    std::vector<float> mults;
    std::vector<EmbeddingFix> fixes;  // offsets into `tokens` (BOS not counted yet)
    long last_comma = -1;
    auto next_chunk = [&](bool is_last) {
        out.token_count += is_last ? static_cast<int>(tokens.size()) : opt.chunk_length;
        if (tokens.size() < len) {
            mults.resize(len, 1.0f);
            tokens.resize(len, ClipTokenizer::kEos);
        }
        std::vector<int32_t> ids;
        ids.reserve(len + 2);
        ids.push_back(ClipTokenizer::kBos);
        ids.insert(ids.end(), tokens.begin(), tokens.end());
        ids.push_back(ClipTokenizer::kEos);
        if (opt.pad_id != ClipTokenizer::kEos) {  // process_tokens: everything after the first EOS
            size_t first = 0;
            while (ids[first] != ClipTokenizer::kEos) ++first;
            for (size_t p = first + 1; p < ids.size(); ++p) ids[p] = opt.pad_id;
        }
        std::vector<float> w;
        w.reserve(len + 2);
        w.push_back(1.0f);
        w.insert(w.end(), mults.begin(), mults.end());
        w.push_back(1.0f);
        out.ids.push_back(std::move(ids));
        out.weights.push_back(std::move(w));
        for (auto& f : fixes) ++f.offset;  // BOS
        out.fixes.push_back(std::move(fixes));
        fixes.clear();
        tokens.clear();
        mults.clear();
        last_comma = -1;
    };

    for (const WeightedText& part : parsed) {
        if (part.is_break()) {
            next_chunk(false);
            continue;
        }
        const std::vector<int32_t> ids = tokenizer.encode(part.text);
        const float weight = static_cast<float>(part.weight);
        for (size_t pos = 0; pos < ids.size();) {
            const int32_t token = ids[pos];
            if (token == comma) {
                last_comma = static_cast<long>(tokens.size());
            } else if (opt.comma_padding_backtrack != 0 && tokens.size() == len && last_comma != -1 &&
                       static_cast<long>(tokens.size()) - last_comma <= opt.comma_padding_backtrack) {
                const size_t at = static_cast<size_t>(last_comma) + 1;
                std::vector<int32_t> reloc_t(tokens.begin() + at, tokens.end());
                std::vector<float> reloc_m(mults.begin() + at, mults.end());
                std::vector<EmbeddingFix> reloc_f;
                for (auto it = fixes.begin(); it != fixes.end();)
                    if (it->offset >= at) {
                        reloc_f.push_back({it->offset - at, it->index, it->vectors});
                        it = fixes.erase(it);
                    } else {
                        ++it;
                    }
                tokens.resize(at);
                mults.resize(at);
                next_chunk(false);
                tokens = std::move(reloc_t);
                mults = std::move(reloc_m);
                fixes = std::move(reloc_f);
            }
            if (tokens.size() == len) next_chunk(false);
            const std::optional<EmbeddingMatch> emb = opt.embeddings ? opt.embeddings->find_at(ids, pos) : std::nullopt;
            if (!emb) {
                tokens.push_back(token);
                mults.push_back(weight);
                ++pos;
                continue;
            }
            const size_t n = static_cast<size_t>(emb->vectors);
            if (n > len)
                fail(ErrorKind::InvalidInput, "embedding {} has {} vectors, more than the {} tokens of a window", emb->index, n, len);
            if (tokens.size() + n > len) next_chunk(false);
            fixes.push_back({tokens.size(), emb->index, emb->vectors});
            tokens.insert(tokens.end(), n, 0);
            mults.insert(mults.end(), n, weight);
            pos += emb->name_tokens;
        }
    }
    if (!tokens.empty() || out.ids.empty()) next_chunk(true);
    return out;
}

EmbeddingInputs embedding_inputs(const WeightedChunks& c, size_t chunk, const std::vector<const std::vector<float>*>& vectors,
                                 int64_t width) {
    if (chunk >= c.ids.size()) fail(ErrorKind::InvalidInput, "embedding inputs: no window {}", chunk);
    const size_t L = c.ids[chunk].size();
    EmbeddingInputs in;
    in.keep.assign(L, 1.0f);
    in.fix.assign(L * static_cast<size_t>(width), 0.0f);
    if (chunk >= c.fixes.size()) return in;
    for (const EmbeddingFix& f : c.fixes[chunk]) {
        const std::vector<float>* v = f.index >= 0 && static_cast<size_t>(f.index) < vectors.size() ? vectors[static_cast<size_t>(f.index)] : nullptr;
        if (!v || v->size() < static_cast<size_t>(f.vectors) * static_cast<size_t>(width) || f.offset + static_cast<size_t>(f.vectors) > L)
            fail(ErrorKind::InvalidInput, "embedding {} has no {} vectors of width {} for window {}", f.index, f.vectors, width, chunk);
        for (int j = 0; j < f.vectors; ++j) {
            const size_t p = f.offset + static_cast<size_t>(j);
            in.keep[p] = 0.0f;
            std::copy_n(v->begin() + static_cast<std::ptrdiff_t>(j) * width, width, in.fix.begin() + static_cast<std::ptrdiff_t>(p) * width);
        }
    }
    return in;
}

void apply_emphasis_original(std::span<float> z, size_t n_tokens, size_t dim, std::span<const float> multipliers) {
    if (z.size() != n_tokens * dim || multipliers.size() != n_tokens)
        fail(ErrorKind::InvalidInput,
             "emphasis: hidden states have {} values and {} multipliers for {} tokens x {} dims; sizes must match",
             z.size(), multipliers.size(), n_tokens, dim);
    if (z.empty()) return;
    double before = 0, after = 0;
    for (float v : z) before += v;
    for (size_t t = 0; t < n_tokens; ++t)
        for (size_t d = 0; d < dim; ++d) {
            float& v = z[t * dim + d];
            v *= multipliers[t];
            after += v;
        }
    if (after == 0) return;
    const float scale = static_cast<float>(before / after);
    for (float& v : z) v *= scale;
}

}  // namespace easel::text
