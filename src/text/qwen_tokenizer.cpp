// Qwen byte-level BPE tokenizer (see qwen_tokenizer.h). Behaviour facts from Hugging Face
// tokenizers (BPE model, ByteLevel pre-tokenizer/decoder, Split with behaviour Isolated,
// AddedVocabulary leftmost-longest matching) and Qwen3's tokenizer.json; GGUF keys from llama.cpp.
#include "text/qwen_tokenizer.h"
#include "core/platform.h"

#include "core/error.h"
#include "text/unicode.h"

#include <nlohmann/json.hpp>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

extern "C" const unsigned char easel_qwen3_tokenizer_gz[];
extern "C" const unsigned long easel_qwen3_tokenizer_gz_size;

namespace easel::text {
namespace {

// Inflates gzip (or zlib) data. Throws Error(InvalidInput) on corrupt input.
std::string gunzip(const unsigned char* data, size_t size, const std::string& what) {
    z_stream zs{};
    if (inflateInit2(&zs, 15 + 32) != Z_OK) fail(ErrorKind::Internal, "zlib inflateInit2 failed while reading {}", what);
    zs.next_in = const_cast<Bytef*>(data);
    zs.avail_in = static_cast<uInt>(size);
    std::string out;
    std::array<char, 1 << 16> buf;
    int rc = Z_OK;
    while (rc != Z_STREAM_END) {
        zs.next_out = reinterpret_cast<Bytef*>(buf.data());
        zs.avail_out = static_cast<uInt>(buf.size());
        rc = inflate(&zs, Z_NO_FLUSH);
        if (rc != Z_OK && rc != Z_STREAM_END) {
            inflateEnd(&zs);
            fail(ErrorKind::InvalidInput, "{} is not valid gzip data (zlib error {}); re-download the file", what, rc);
        }
        out.append(buf.data(), buf.size() - zs.avail_out);
        if (rc == Z_OK && zs.avail_in == 0 && zs.avail_out != 0) {
            inflateEnd(&zs);
            fail(ErrorKind::InvalidInput, "{} is truncated gzip data; re-download the file", what);
        }
    }
    inflateEnd(&zs);
    return out;
}

// GPT-2 bytes_to_unicode: printable bytes map to themselves, the others to 256 + n in byte order.
std::array<char32_t, 256> byte_to_cp() {
    std::array<char32_t, 256> m{};
    int n = 0;
    for (int b = 0; b < 256; ++b) {
        const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        m[b] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
    }
    return m;
}

// Unicode White_Space (Oniguruma's \s for UTF-8 patterns).
bool is_ws(char32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}
bool is_nl(char32_t c) { return c == '\r' || c == '\n'; }
// Case folding for the (?i:'s|'t|'re|'ve|'m|'ll|'d) group: ASCII letters and U+017F LONG S (folds to s).
char32_t fold(char32_t c) {
    if (c >= 'A' && c <= 'Z') return c + 32;
    if (c == 0x17F) return 's';
    return c;
}

// Length (code points) of the regex match starting at i (see the header's pattern); >= 1.
size_t match_at(const std::u32string& s, size_t i) {
    const size_t n = s.size();
    // 1. contractions
    if (s[i] == '\'' && i + 1 < n) {
        const char32_t a = fold(s[i + 1]);
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
        if (i + 2 < n) {
            const char32_t b = fold(s[i + 2]);
            if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
        }
    }
    // 2. [^\r\n\p{L}\p{N}]?\p{L}+
    {
        size_t j = i;
        if (!is_letter(s[i]) && !is_number(s[i]) && !is_nl(s[i]) && i + 1 < n && is_letter(s[i + 1])) j = i + 1;
        if (is_letter(s[j])) {
            while (j < n && is_letter(s[j])) ++j;
            return j - i;
        }
    }
    // 3. \p{N}
    if (is_number(s[i])) return 1;
    // 4.  ?[^\s\p{L}\p{N}]+[\r\n]*
    {
        auto other = [](char32_t c) { return !is_ws(c) && !is_letter(c) && !is_number(c); };
        size_t j = i;
        if (s[j] == ' ' && j + 1 < n && other(s[j + 1])) ++j;
        if (other(s[j])) {
            while (j < n && other(s[j])) ++j;
            while (j < n && is_nl(s[j])) ++j;
            return j - i;
        }
    }
    if (is_ws(s[i])) {
        size_t e = i;
        while (e < n && is_ws(s[e])) ++e;
        // 5. \s*[\r\n]+ : up to the last line break of the whitespace run
        size_t last = SIZE_MAX;
        for (size_t k = i; k < e; ++k)
            if (is_nl(s[k])) last = k;
        if (last != SIZE_MAX) return last + 1 - i;
        // 6. \s+(?!\S) : the whole run at the end of the text, else all but its last character
        if (e == n) return e - i;
        if (e - i >= 2) return e - i - 1;
        // 7. \s+
        return e - i;
    }
    return 1;  // not reachable: every code point is L, N, \s or "other"
}

std::vector<std::u32string> split_pieces(const std::u32string& s) {
    std::vector<std::u32string> out;
    for (size_t i = 0; i < s.size();) {
        const size_t len = match_at(s, i);
        out.emplace_back(s.substr(i, len));
        i += len;
    }
    return out;
}

uint64_t pair_key(int32_t a, int32_t b) { return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b); }

}  // namespace

struct QwenTokenizer::Impl {
    std::vector<std::string> vocab;                    // id -> stored token ("" for unused ids)
    std::unordered_map<std::string, int32_t> ids;      // stored token -> id
    struct Merge {
        int32_t rank;
        int32_t id;
    };
    std::unordered_map<uint64_t, Merge> merges;        // (left id, right id) -> rank, merged id
    std::vector<std::pair<std::string, int32_t>> added;  // added tokens (raw text), longest first
    std::unordered_set<int32_t> added_ids;
    std::array<char32_t, 256> b2cp = byte_to_cp();
    std::unordered_map<char32_t, uint8_t> cp2b;
    std::array<int32_t, 256> byte_id{};                // id of each single-byte symbol
    mutable std::mutex cache_mutex;
    mutable std::unordered_map<std::string, std::vector<int32_t>> cache;

    void set_token(int32_t id, const std::string& tok, const char* what) {
        if (id < 0 || id > 10'000'000) fail(ErrorKind::InvalidInput, "{}: token id {} is out of range", what, id);
        if (vocab.size() <= (size_t)id) vocab.resize((size_t)id + 1);
        vocab[(size_t)id] = tok;
        ids.emplace(tok, id);
    }

    void add_merge(const std::string& a, const std::string& b, const char* what) {
        auto ia = ids.find(a), ib = ids.find(b), im = ids.find(a + b);
        if (ia == ids.end() || ib == ids.end() || im == ids.end())
            fail(ErrorKind::InvalidInput, "{}: merge '{} {}' names a token that is not in the vocabulary", what, a, b);
        merges.emplace(pair_key(ia->second, ib->second), Merge{static_cast<int32_t>(merges.size()), im->second});
    }

    void finish(const char* what) {
        for (int b = 0; b < 256; ++b) {
            cp2b[b2cp[b]] = static_cast<uint8_t>(b);
            std::string sym;
            utf8_append(sym, b2cp[b]);
            auto it = ids.find(sym);
            if (it == ids.end())
                fail(ErrorKind::InvalidInput, "{}: the vocabulary lacks the byte symbol of byte {}; not a byte-level BPE vocabulary", what, b);
            byte_id[b] = it->second;
        }
        std::sort(added.begin(), added.end(), [](auto& x, auto& y) { return x.first.size() > y.first.size(); });
        for (auto& [t, id] : added) added_ids.insert(id);
    }

    std::vector<int32_t> bpe(const std::string& piece) const {
        {
            std::lock_guard lock(cache_mutex);
            if (auto it = cache.find(piece); it != cache.end()) return it->second;
        }
        std::vector<int32_t> w;
        w.reserve(piece.size());
        for (unsigned char b : piece) w.push_back(byte_id[b]);
        while (w.size() > 1) {
            int32_t best = INT32_MAX, merged = -1;
            size_t at = 0;
            for (size_t i = 0; i + 1 < w.size(); ++i) {
                auto it = merges.find(pair_key(w[i], w[i + 1]));
                if (it != merges.end() && it->second.rank < best) {
                    best = it->second.rank;
                    merged = it->second.id;
                    at = i;
                }
            }
            if (merged < 0) break;
            w[at] = merged;
            w.erase(w.begin() + (std::ptrdiff_t)at + 1);
        }
        {
            std::lock_guard lock(cache_mutex);
            if (cache.size() > 200'000) cache.clear();
            cache.emplace(piece, w);
        }
        return w;
    }

    void encode_plain(std::string_view text, std::vector<int32_t>& out) const {
        if (text.empty()) return;
        const std::u32string norm = nfc(utf8_decode(text));
        for (const std::u32string& p : split_pieces(norm)) {
            std::vector<int32_t> t = bpe(utf8_encode(p));
            out.insert(out.end(), t.begin(), t.end());
        }
    }
};

QwenTokenizer::QwenTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
QwenTokenizer::QwenTokenizer(QwenTokenizer&&) noexcept = default;
QwenTokenizer& QwenTokenizer::operator=(QwenTokenizer&&) noexcept = default;
QwenTokenizer::~QwenTokenizer() = default;

QwenTokenizer QwenTokenizer::from_tokenizer_json(std::string_view json_text) {
    const char* what = "tokenizer.json";
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(json_text);
    } catch (const nlohmann::json::exception& e) {
        fail(ErrorKind::InvalidInput, "tokenizer.json is not valid JSON ({})", e.what());
    }
    if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
        fail(ErrorKind::InvalidInput, "tokenizer.json has no \"model\" object; not a Hugging Face tokenizers file");
    const auto& m = j["model"];
    if (!m.contains("type") || m["type"] != "BPE")
        fail(ErrorKind::InvalidInput, "tokenizer.json: model.type is not \"BPE\"; only byte-level BPE (Qwen) vocabularies are supported");
    if (!m.contains("vocab") || !m["vocab"].is_object() || !m.contains("merges") || !m["merges"].is_array())
        fail(ErrorKind::InvalidInput, "tokenizer.json: model.vocab (object) or model.merges (array) is missing");
    auto impl = std::make_unique<Impl>();
    impl->ids.reserve(m["vocab"].size() + 64);
    for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
        if (!it.value().is_number_integer()) fail(ErrorKind::InvalidInput, "tokenizer.json: vocab entry '{}' has no integer id", it.key());
        impl->set_token(it.value().get<int32_t>(), it.key(), what);
    }
    if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
        for (const auto& a : j["added_tokens"]) {
            if (!a.contains("id") || !a.contains("content") || !a["id"].is_number_integer() || !a["content"].is_string())
                fail(ErrorKind::InvalidInput, "tokenizer.json: an added_tokens entry lacks id or content");
            const int32_t id = a["id"].get<int32_t>();
            const std::string content = a["content"].get<std::string>();
            impl->set_token(id, content, what);
            if (!content.empty()) impl->added.emplace_back(content, id);
        }
    }
    impl->merges.reserve(m["merges"].size());
    for (const auto& e : m["merges"]) {
        if (e.is_string()) {
            const std::string s = e.get<std::string>();
            const size_t sp = s.find(' ');
            if (sp == std::string::npos || sp == 0 || sp + 1 >= s.size())
                fail(ErrorKind::InvalidInput, "tokenizer.json: merge '{}' is not of the form \"a b\"", s);
            impl->add_merge(s.substr(0, sp), s.substr(sp + 1), what);
        } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
            impl->add_merge(e[0].get<std::string>(), e[1].get<std::string>(), what);
        } else {
            fail(ErrorKind::InvalidInput, "tokenizer.json: a merge is neither \"a b\" nor [a, b]");
        }
    }
    impl->finish(what);
    return QwenTokenizer(std::move(impl));
}

QwenTokenizer QwenTokenizer::from_file(const std::filesystem::path& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) fail(ErrorKind::Io, "cannot open tokenizer file '{}'", platform::path_utf8(path));
    std::ostringstream ss;
    ss << f.rdbuf();
    std::string data = ss.str();
    if (data.size() >= 2 && static_cast<unsigned char>(data[0]) == 0x1F && static_cast<unsigned char>(data[1]) == 0x8B)
        data = gunzip(reinterpret_cast<const unsigned char*>(data.data()), data.size(), platform::path_utf8(path));
    return from_tokenizer_json(data);
}

const QwenTokenizer& QwenTokenizer::builtin() {
    static const QwenTokenizer tok = [] {
        std::string json = gunzip(easel_qwen3_tokenizer_gz, easel_qwen3_tokenizer_gz_size, "the embedded Qwen3 tokenizer");
        return from_tokenizer_json(json);
    }();
    return tok;
}

bool QwenTokenizer::gguf_has_tokenizer(const std::map<std::string, io::MetaValue>& meta) {
    auto it = meta.find("tokenizer.ggml.model");
    if (it == meta.end() || it->second.kind != io::MetaValue::Kind::String || it->second.s != "gpt2") return false;
    auto pre = meta.find("tokenizer.ggml.pre");
    if (pre != meta.end() && (pre->second.kind != io::MetaValue::Kind::String || pre->second.s != "qwen2")) return false;
    auto t = meta.find("tokenizer.ggml.tokens"), m = meta.find("tokenizer.ggml.merges");
    return t != meta.end() && t->second.kind == io::MetaValue::Kind::StringArray && m != meta.end() &&
           m->second.kind == io::MetaValue::Kind::StringArray;
}

QwenTokenizer QwenTokenizer::from_gguf_metadata(const std::map<std::string, io::MetaValue>& meta) {
    const char* what = "GGUF tokenizer";
    auto get = [&](const char* key) -> const io::MetaValue* {
        auto it = meta.find(key);
        return it == meta.end() ? nullptr : &it->second;
    };
    const io::MetaValue* model = get("tokenizer.ggml.model");
    if (!model || model->kind != io::MetaValue::Kind::String)
        fail(ErrorKind::InvalidInput, "GGUF file has no tokenizer.ggml.model; it carries no tokenizer");
    if (model->s != "gpt2")
        fail(ErrorKind::InvalidInput, "GGUF tokenizer.ggml.model is '{}'; the Qwen tokenizer needs 'gpt2' (byte-level BPE)", model->s);
    if (const io::MetaValue* pre = get("tokenizer.ggml.pre"); pre && (pre->kind != io::MetaValue::Kind::String || pre->s != "qwen2"))
        fail(ErrorKind::InvalidInput, "GGUF tokenizer.ggml.pre is '{}'; only the 'qwen2' pre-tokenizer is implemented", pre->s);
    const io::MetaValue* tokens = get("tokenizer.ggml.tokens");
    const io::MetaValue* merges = get("tokenizer.ggml.merges");
    if (!tokens || tokens->kind != io::MetaValue::Kind::StringArray)
        fail(ErrorKind::InvalidInput, "GGUF tokenizer.ggml.tokens is missing or not a string array");
    if (!merges || merges->kind != io::MetaValue::Kind::StringArray)
        fail(ErrorKind::InvalidInput, "GGUF tokenizer.ggml.merges is missing or not a string array");
    const io::MetaValue* types = get("tokenizer.ggml.token_type");
    if (types && (types->kind != io::MetaValue::Kind::IntArray || types->ia.size() != tokens->sa.size()))
        fail(ErrorKind::InvalidInput, "GGUF tokenizer.ggml.token_type must be an integer array as long as tokenizer.ggml.tokens");
    auto impl = std::make_unique<Impl>();
    impl->ids.reserve(tokens->sa.size());
    for (size_t i = 0; i < tokens->sa.size(); ++i) {
        const int64_t type = types ? types->ia[i] : 1;
        if (type == 5) {  // UNUSED (llama.cpp's [PADn] fillers): keep the id, never produce it
            if (impl->vocab.size() <= i) impl->vocab.resize(i + 1);
            impl->vocab[i] = tokens->sa[i];
            continue;
        }
        impl->set_token(static_cast<int32_t>(i), tokens->sa[i], what);
        if ((type == 3 || type == 4) && !tokens->sa[i].empty()) impl->added.emplace_back(tokens->sa[i], static_cast<int32_t>(i));
    }
    impl->merges.reserve(merges->sa.size());
    for (const std::string& s : merges->sa) {
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || sp == 0 || sp + 1 >= s.size())
            fail(ErrorKind::InvalidInput, "GGUF tokenizer.ggml.merges entry '{}' is not of the form \"a b\"", s);
        impl->add_merge(s.substr(0, sp), s.substr(sp + 1), what);
    }
    impl->finish(what);
    return QwenTokenizer(std::move(impl));
}

std::vector<int32_t> QwenTokenizer::encode(std::string_view text, bool parse_special) const {
    std::vector<int32_t> out;
    if (!parse_special || impl_->added.empty()) {
        impl_->encode_plain(text, out);
        return out;
    }
    size_t start = 0;  // start of the pending plain segment
    for (size_t i = 0; i < text.size();) {
        const std::pair<std::string, int32_t>* hit = nullptr;
        for (const auto& a : impl_->added)  // longest first: the first hit is the longest at i
            if (text.compare(i, a.first.size(), a.first) == 0) {
                hit = &a;
                break;
            }
        if (!hit) {
            ++i;
            continue;
        }
        impl_->encode_plain(text.substr(start, i - start), out);
        out.push_back(hit->second);
        i += hit->first.size();
        start = i;
    }
    impl_->encode_plain(text.substr(start), out);
    return out;
}

std::string QwenTokenizer::decode(std::span<const int32_t> ids) const {
    std::string out;
    for (int32_t id : ids) {
        if (id < 0 || static_cast<size_t>(id) >= impl_->vocab.size())
            fail(ErrorKind::InvalidInput, "token id {} is outside the Qwen vocabulary of {}", id, impl_->vocab.size());
        const std::string& t = impl_->vocab[(size_t)id];
        if (impl_->added_ids.count(id)) {
            out += t;
            continue;
        }
        for (char32_t cp : utf8_decode(t)) {
            auto it = impl_->cp2b.find(cp);
            if (it != impl_->cp2b.end()) out.push_back(static_cast<char>(it->second));
            else utf8_append(out, cp);
        }
    }
    return out;
}

std::optional<int32_t> QwenTokenizer::token_id(std::string_view token) const {
    auto it = impl_->ids.find(std::string(token));
    if (it == impl_->ids.end()) return std::nullopt;
    return it->second;
}

const std::string& QwenTokenizer::token(int32_t id) const {
    if (id < 0 || static_cast<size_t>(id) >= impl_->vocab.size())
        fail(ErrorKind::InvalidInput, "token id {} is outside the Qwen vocabulary of {}", id, impl_->vocab.size());
    return impl_->vocab[(size_t)id];
}

size_t QwenTokenizer::vocab_size() const { return impl_->vocab.size(); }
size_t QwenTokenizer::merge_count() const { return impl_->merges.size(); }

std::vector<std::string> QwenTokenizer::pre_tokenize(std::string_view normalized) {
    std::vector<std::string> out;
    for (const std::u32string& p : split_pieces(utf8_decode(normalized))) out.push_back(utf8_encode(p));
    return out;
}

std::string QwenTokenizer::chat_prompt(std::string_view user, bool empty_think) {
    std::string s = "<|im_start|>user\n";
    s += user;
    s += "<|im_end|>\n<|im_start|>assistant\n";
    if (empty_think) s += "<think>\n\n</think>\n\n";
    return s;
}

}  // namespace easel::text
