// Textual-inversion embeddings (see embeddings.h).
#include "text/embeddings.h"

#include "core/error.h"
#include "io/weight_index.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

namespace easel::text {

namespace fs = std::filesystem;

const std::vector<float>* Embedding::for_width(int64_t w) const {
    for (const char* key : {"", "clip_l", "clip_g"}) {
        auto it = width.find(key);
        if (it != width.end() && it->second == w) return &vectors.at(key);
    }
    return nullptr;
}

Embedding read_embedding(const fs::path& file) {
    const io::WeightIndex idx = io::WeightIndex::open(file);
    Embedding e;
    e.name = file.stem().string();
    e.path = file;
    const auto& ts = idx.tensors();
    auto describe = [&]() {
        std::vector<std::string> n;
        for (size_t i = 0; i < ts.size() && i < 3; ++i) n.push_back(ts[i].name);
        return fmt::format("{} tensors ({}{})", ts.size(), fmt::join(n, ", "), ts.size() > 3 ? ", ..." : "");
    };
    auto take = [&](const std::string& key, const io::TensorInfo& t) {
        if (t.shape.empty() || t.shape.size() > 2 || t.numel() == 0)
            fail(ErrorKind::InvalidInput, "{}: embedding tensor '{}' is not [vectors, width]", file.string(), t.name);
        const int64_t n = t.shape.size() == 2 ? t.shape[0] : 1, w = t.shape.back();
        if (n > 75) fail(ErrorKind::InvalidInput, "{}: embedding has {} vectors, more than the 75 tokens of a CLIP window", file.string(), n);
        if (e.n_vectors && e.n_vectors != n)
            fail(ErrorKind::InvalidInput, "{}: clip_l and clip_g have different vector counts ({} and {})", file.string(), e.n_vectors, n);
        std::vector<float> v = idx.read_f32(t);
        for (float x : v)
            if (!std::isfinite(x)) fail(ErrorKind::InvalidInput, "{}: embedding '{}' holds a non-finite value", file.string(), t.name);
        e.n_vectors = n;
        e.vectors[key] = std::move(v);
        e.width[key] = w;
    };
    const io::TensorInfo *l = idx.find("clip_l"), *g = idx.find("clip_g");
    if (l && g) {  // SDXL pair
        take("clip_l", *l);
        take("clip_g", *g);
        return e;
    }
    if (const io::TensorInfo* p = idx.find("emb_params")) {
        take("", *p);
        return e;
    }
    std::vector<const io::TensorInfo*> s2p;
    for (auto& t : ts)
        if (t.name.rfind("string_to_param.", 0) == 0) s2p.push_back(&t);
    if (s2p.size() > 1) fail(ErrorKind::InvalidInput, "{}: embedding file has {} terms in string_to_param; one expected", file.string(), s2p.size());
    if (s2p.size() == 1) {
        take("", *s2p[0]);
        return e;
    }
    if (ts.size() == 1) {  // diffusers learned_embeds: {"<token>": vector(s)}
        take("", ts[0]);
        return e;
    }
    fail(ErrorKind::InvalidInput, "{} is not a textual-inversion embedding: {}", file.string(), describe());
}

std::map<std::string, fs::path> list_embeddings(const fs::path& dir) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) fail(ErrorKind::Io, "--embd-dir '{}' is not a folder", dir.string());
    std::vector<fs::path> files;
    for (auto it = fs::recursive_directory_iterator(dir, fs::directory_options::skip_permission_denied, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
        if (!it->is_regular_file(ec)) continue;
        const std::string x = it->path().extension().string();
        if (x == ".safetensors" || x == ".pt" || x == ".bin") files.push_back(it->path());
    }
    std::sort(files.begin(), files.end());
    std::map<std::string, fs::path> out;
    for (auto& f : files) out.emplace(f.stem().string(), f);
    return out;
}

void EmbeddingLookup::add(const ClipTokenizer& tok, int index, const std::string& name, int vectors) {
    std::vector<int32_t> ids = tok.encode(name);
    if (ids.empty()) return;
    auto& v = by_first_[ids[0]];
    v.push_back({std::move(ids), index, vectors});
    std::stable_sort(v.begin(), v.end(), [](const Entry& a, const Entry& b) { return a.ids.size() > b.ids.size(); });
}

std::optional<EmbeddingMatch> EmbeddingLookup::find_at(const std::vector<int32_t>& tokens, size_t pos) const {
    if (pos >= tokens.size()) return std::nullopt;
    auto it = by_first_.find(tokens[pos]);
    if (it == by_first_.end()) return std::nullopt;
    for (const Entry& e : it->second)
        if (pos + e.ids.size() <= tokens.size() && std::equal(e.ids.begin(), e.ids.end(), tokens.begin() + (std::ptrdiff_t)pos))
            return EmbeddingMatch{e.index, e.ids.size(), e.vectors};
    return std::nullopt;
}

}  // namespace easel::text
