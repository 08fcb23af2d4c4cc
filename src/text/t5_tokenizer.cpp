#include "text/t5_tokenizer.h"
#include "core/platform.h"

#include "core/error.h"

#include <nlohmann/json.hpp>
#include <sentencepiece_processor.h>
#include <zlib.h>

#include <array>
#include <cstring>
#include <fstream>
#include <sstream>
#include <unordered_map>

extern "C" const unsigned char easel_t5_vocab_gz[];
extern "C" const unsigned long easel_t5_vocab_gz_size;

namespace easel::text {
namespace {

// Inflates gzip (or zlib) data. Throws Error(InvalidInput) on corrupt input.
std::string gunzip(const unsigned char* data, size_t size, const std::string& what) {
    z_stream zs{};
    if (inflateInit2(&zs, 15 + 32) != Z_OK)  // +32: detect gzip or zlib header
        fail(ErrorKind::Internal, "zlib inflateInit2 failed while reading {}", what);
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

// RFC 4648 base64 (standard alphabet, '=' padding, whitespace ignored).
std::string base64_decode(std::string_view s) {
    auto val = [](char c) -> int {
        if (c >= 'A' && c <= 'Z') return c - 'A';
        if (c >= 'a' && c <= 'z') return c - 'a' + 26;
        if (c >= '0' && c <= '9') return c - '0' + 52;
        if (c == '+') return 62;
        if (c == '/') return 63;
        return -1;
    };
    std::string out;
    out.reserve(s.size() / 4 * 3);
    uint32_t acc = 0;
    int bits = 0;
    for (char c : s) {
        if (c == '=' ) break;
        if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
        int v = val(c);
        if (v < 0) fail(ErrorKind::InvalidInput, "tokenizer.json: precompiled_charsmap is not base64 (byte 0x{:02x}); use an unmodified tokenizer.json", (unsigned char)c);
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out.push_back((char)((acc >> bits) & 0xFF));
        }
    }
    return out;
}

// Minimal protobuf wire-format writer (developers.google.com/protocol-buffers/docs/encoding):
// varint (wire type 0), 32-bit (5) and length-delimited (2) fields; that is all ModelProto needs.
struct Proto {
    std::string b;
    void varint(uint64_t v) {
        while (v >= 0x80) {
            b.push_back((char)((v & 0x7F) | 0x80));
            v >>= 7;
        }
        b.push_back((char)v);
    }
    void tag(int field, int wire) { varint(((uint64_t)field << 3) | (uint64_t)wire); }
    // int32 fields encode negative values as their 64-bit two's complement (10 bytes).
    void int_field(int field, int64_t v) {
        tag(field, 0);
        varint((uint64_t)v);
    }
    void float_field(int field, float v) {
        tag(field, 5);
        char raw[4];
        std::memcpy(raw, &v, 4);  // little-endian host (x86-64, arm64)
        b.append(raw, 4);
    }
    void bytes_field(int field, std::string_view v) {
        tag(field, 2);
        varint(v.size());
        b.append(v);
    }
};

// Field numbers and enum values of sentencepiece_model.proto (SentencePiece 0.1.x):
//   ModelProto { repeated SentencePiece pieces = 1; TrainerSpec trainer_spec = 2;
//                NormalizerSpec normalizer_spec = 3; }
//   SentencePiece { string piece = 1; float score = 2; Type type = 3; }
//     Type: NORMAL 1, UNKNOWN 2, CONTROL 3, USER_DEFINED 4, UNUSED 5, BYTE 6
//   TrainerSpec { ModelType model_type = 3 (UNIGRAM 1); int32 vocab_size = 4; int32 unk_id = 40;
//                 int32 bos_id = 41; int32 eos_id = 42; int32 pad_id = 43; }
//   NormalizerSpec { string name = 1; bytes precompiled_charsmap = 2; bool add_dummy_prefix = 3;
//                    bool remove_extra_whitespaces = 4; bool escape_whitespaces = 5; }
// The values are those of T5's spiece.model: unk 2, eos 1, pad 0, no bos, "nmt_nfkc" with a
// dummy prefix, extra whitespace removed and spaces escaped as U+2581 -- which is what the HF
// pipeline WhitespaceSplit + Metaspace(add_prefix_space) does after the Precompiled normalizer.
enum PieceType { kNormal = 1, kUnknown = 2, kControl = 3, kUnused = 5 };

std::string model_proto(const std::vector<std::string>& pieces, const std::vector<float>& scores,
                        const std::vector<int>& types, int unk_id, std::string_view charsmap) {
    Proto m;
    for (size_t i = 0; i < pieces.size(); ++i) {
        Proto p;
        p.bytes_field(1, pieces[i]);
        p.float_field(2, scores[i]);
        p.int_field(3, types[i]);
        m.bytes_field(1, p.b);
    }
    Proto t;
    t.int_field(3, 1);  // UNIGRAM
    t.int_field(4, (int64_t)pieces.size());
    t.int_field(40, unk_id);
    t.int_field(41, -1);
    t.int_field(42, T5Tokenizer::kEos);
    t.int_field(43, T5Tokenizer::kPad);
    m.bytes_field(2, t.b);
    Proto n;
    n.bytes_field(1, "nmt_nfkc");
    if (!charsmap.empty()) n.bytes_field(2, charsmap);
    n.int_field(3, 1);
    n.int_field(4, 1);
    n.int_field(5, 1);
    m.bytes_field(3, n.b);
    return m.b;
}

bool is_extra_id(std::string_view p) { return p.size() > 11 && p.starts_with("<extra_id_") && p.back() == '>'; }

}  // namespace

struct T5Tokenizer::Impl {
    sentencepiece::SentencePieceProcessor sp;
    std::vector<std::string> pieces;
    std::vector<float> scores;
    std::vector<int> types;
    std::unordered_map<std::string, int32_t> ids;
    int32_t unk = kUnk;
};

T5Tokenizer::T5Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
T5Tokenizer::T5Tokenizer(T5Tokenizer&&) noexcept = default;
T5Tokenizer& T5Tokenizer::operator=(T5Tokenizer&&) noexcept = default;
T5Tokenizer::~T5Tokenizer() = default;

T5Tokenizer T5Tokenizer::from_json_text(std::string_view text) {
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        fail(ErrorKind::InvalidInput, "tokenizer.json is not valid JSON ({}); use the tokenizer.json of a T5 model", e.what());
    }
    if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
        fail(ErrorKind::InvalidInput, "tokenizer.json has no \"model\" object; use the tokenizer.json of a T5 model");
    const auto& model = j["model"];
    if (model.contains("type") && model["type"] != "Unigram")
        fail(ErrorKind::InvalidInput, "tokenizer.json holds a {} model, not the Unigram model of T5; give a T5 tokenizer.json",
             model["type"].dump());
    if (!model.contains("vocab") || !model["vocab"].is_array() || model["vocab"].empty())
        fail(ErrorKind::InvalidInput, "tokenizer.json: model.vocab is missing or empty; give a T5 (Unigram) tokenizer.json");
    std::string charsmap;
    if (j.contains("normalizer") && !j["normalizer"].is_null()) {
        const auto& n = j["normalizer"];
        if (!n.is_object() || n.value("type", "") != "Precompiled")
            fail(ErrorKind::InvalidInput,
                 "tokenizer.json: normalizer {} is not supported (only T5's Precompiled charsmap); give a T5 tokenizer.json",
                 n.is_object() ? n.value("type", "?") : n.dump());
        if (!n.contains("precompiled_charsmap") || !n["precompiled_charsmap"].is_string())
            fail(ErrorKind::InvalidInput, "tokenizer.json: the Precompiled normalizer has no precompiled_charsmap string");
        charsmap = base64_decode(n["precompiled_charsmap"].get<std::string>());
        if (charsmap.size() < 4)
            fail(ErrorKind::InvalidInput, "tokenizer.json: precompiled_charsmap is too short ({} bytes)", charsmap.size());
        uint32_t trie_bytes = 0;
        std::memcpy(&trie_bytes, charsmap.data(), 4);
        if (trie_bytes % 4 != 0 || (uint64_t)trie_bytes + 4 > charsmap.size())
            fail(ErrorKind::InvalidInput, "tokenizer.json: precompiled_charsmap declares a {}-byte trie in {} bytes", trie_bytes,
                 charsmap.size());
    }
    auto impl = std::make_unique<Impl>();
    const auto& vocab = model["vocab"];
    const int64_t n = (int64_t)vocab.size();
    int64_t unk = model.contains("unk_id") && model["unk_id"].is_number_integer() ? model["unk_id"].get<int64_t>() : kUnk;
    if (unk < 0 || unk >= n) fail(ErrorKind::InvalidInput, "tokenizer.json: unk_id {} is outside the {} pieces", unk, n);
    impl->unk = (int32_t)unk;
    for (int64_t i = 0; i < n; ++i) {
        const auto& e = vocab[(size_t)i];
        if (!e.is_array() || e.size() != 2 || !e[0].is_string() || !e[1].is_number())
            fail(ErrorKind::InvalidInput, "tokenizer.json: model.vocab[{}] is not a [piece, score] pair", i);
        std::string p = e[0].get<std::string>();
        if (p.empty()) fail(ErrorKind::InvalidInput, "tokenizer.json: model.vocab[{}] is an empty piece", i);
        int type = kNormal;
        if (i == unk) type = kUnknown;
        else if (p == "<pad>" || p == "</s>" || p == "<s>") type = kControl;
        else if (is_extra_id(p)) type = kUnused;
        if (!impl->ids.emplace(p, (int32_t)i).second)
            fail(ErrorKind::InvalidInput, "tokenizer.json: piece \"{}\" appears twice in model.vocab (ids {} and {})", p,
                 impl->ids[p], i);
        impl->pieces.push_back(std::move(p));
        impl->scores.push_back(e[1].get<float>());
        impl->types.push_back(type);
    }
    const std::string proto = model_proto(impl->pieces, impl->scores, impl->types, (int)unk, charsmap);
    const auto st = impl->sp.LoadFromSerializedProto(proto);
    if (!st.ok())
        fail(ErrorKind::InvalidInput, "tokenizer.json: SentencePiece rejected the model built from it ({})", st.ToString());
    return T5Tokenizer(std::move(impl));
}

T5Tokenizer T5Tokenizer::from_file(const std::filesystem::path& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) fail(ErrorKind::Io, "cannot open T5 tokenizer file {}", platform::path_utf8(path));
    std::stringstream ss;
    ss << f.rdbuf();
    std::string data = ss.str();
    if (data.size() >= 2 && static_cast<unsigned char>(data[0]) == 0x1F && static_cast<unsigned char>(data[1]) == 0x8B)
        data = gunzip(reinterpret_cast<const unsigned char*>(data.data()), data.size(), platform::path_utf8(path));
    return from_json_text(data);
}

const T5Tokenizer& T5Tokenizer::builtin() {
    static const T5Tokenizer tok = [] {
        const std::string text = gunzip(easel_t5_vocab_gz, easel_t5_vocab_gz_size, "the embedded T5 vocabulary");
        return from_json_text(text);
    }();
    return tok;
}

std::vector<int32_t> T5Tokenizer::encode(std::string_view text) const {
    std::vector<int> ids;
    const auto st = impl_->sp.Encode(text, &ids);
    if (!st.ok()) fail(ErrorKind::InvalidInput, "T5 tokenizer could not encode the prompt ({})", st.ToString());
    return std::vector<int32_t>(ids.begin(), ids.end());
}

std::vector<int32_t> T5Tokenizer::encode_with_eos(std::string_view text) const {
    auto ids = encode(text);
    ids.push_back(kEos);
    return ids;
}

std::vector<int32_t> T5Tokenizer::encode_padded(std::string_view text, int length, std::vector<int32_t>* mask) const {
    if (length < 1) fail(ErrorKind::InvalidInput, "T5 sequence length must be at least 1 (got {})", length);
    auto ids = encode(text);
    if (ids.size() > (size_t)length - 1) ids.resize((size_t)length - 1);
    ids.push_back(kEos);
    const size_t used = ids.size();
    ids.resize((size_t)length, kPad);
    if (mask) {
        mask->assign((size_t)length, 0);
        std::fill(mask->begin(), mask->begin() + (ptrdiff_t)used, 1);
    }
    return ids;
}

std::string T5Tokenizer::normalize(std::string_view text) const {
    std::vector<std::string> pieces;
    const auto st = impl_->sp.Encode(text, &pieces);
    if (!st.ok()) fail(ErrorKind::InvalidInput, "T5 tokenizer could not normalize the prompt ({})", st.ToString());
    std::string out;
    for (auto& p : pieces) out += p;  // unknown pieces carry their normalized text
    return out;
}

std::string T5Tokenizer::decode(std::span<const int32_t> ids) const {
    static const std::string kMeta = "\xE2\x96\x81";  // U+2581
    std::string s;
    for (int32_t id : ids) {
        const std::string& p = piece(id);
        const int t = impl_->types[(size_t)id];
        if (t == kControl || t == kUnused) continue;
        if (t == kUnknown) {
            s += " \xE2\x81\x87 ";  // " ⁇ "
            continue;
        }
        for (size_t i = 0; i < p.size();) {
            if (p.compare(i, kMeta.size(), kMeta) == 0) {
                s.push_back(' ');
                i += kMeta.size();
            } else {
                s.push_back(p[i++]);
            }
        }
    }
    if (!s.empty() && s[0] == ' ') s.erase(0, 1);
    return s;
}

std::optional<int32_t> T5Tokenizer::piece_id(std::string_view p) const {
    auto it = impl_->ids.find(std::string(p));
    if (it == impl_->ids.end()) return std::nullopt;
    return it->second;
}

const std::string& T5Tokenizer::piece(int32_t id) const {
    if (id < 0 || (size_t)id >= impl_->pieces.size())
        fail(ErrorKind::InvalidInput, "T5 token id {} is outside the vocabulary [0, {})", id, impl_->pieces.size());
    return impl_->pieces[(size_t)id];
}

float T5Tokenizer::score(int32_t id) const {
    piece(id);  // range check
    return impl_->scores[(size_t)id];
}

size_t T5Tokenizer::vocab_size() const { return impl_->pieces.size(); }

}  // namespace easel::text
