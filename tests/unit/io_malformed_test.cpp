// Every file of the malformed corpus (tests/data/malformed, made by tools/make-malformed/make.py)
// must raise easel::Error from WeightIndex::open and from open_memory, never crash.
#include "core/error.h"
#include "io/weight_index.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

using namespace easel;
using namespace easel::io;
namespace fs = std::filesystem;

TEST(IoMalformed, EveryCorpusFileRaisesError) {
    const fs::path dir = fs::path(EASEL_TEST_DATA) / "malformed";
    int n = 0;
    for (auto& e : fs::directory_iterator(dir)) {
        const auto p = e.path();
        ++n;
        try {
            auto wi = WeightIndex::open(p);
            ADD_FAILURE() << p.filename() << " opened without error (" << wi.tensors().size() << " tensors)";
        } catch (const Error& err) {
            const std::string msg = err.what();
            EXPECT_FALSE(msg.empty()) << p.filename();
            EXPECT_EQ(msg.find('\n'), std::string::npos) << p.filename() << ": " << msg;
        }
        if (p.string().find(".index.json") != std::string::npos) continue;
        std::ifstream f(p, std::ios::binary);
        std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), {});
        EXPECT_THROW(WeightIndex::open_memory(bytes, p.filename().string()), Error) << p.filename();
    }
    EXPECT_GE(n, 60);
}

TEST(IoMalformed, MessagesNameTheProblem) {
    const fs::path dir = fs::path(EASEL_TEST_DATA) / "malformed";
    auto msg = [&](const char* f) {
        try {
            WeightIndex::open(dir / f);
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    EXPECT_NE(msg("st_truncated_data.safetensors").find("truncated"), std::string::npos);
    EXPECT_NE(msg("st_duplicate_key.safetensors").find("twice"), std::string::npos);
    EXPECT_NE(msg("st_unknown_dtype.safetensors").find("F4"), std::string::npos);
    EXPECT_NE(msg("st_offsets_overlap.safetensors").find("overlap"), std::string::npos);
    EXPECT_NE(msg("st_deep_nesting.safetensors").find("nested"), std::string::npos);
    EXPECT_NE(msg("st_header_past_eof.safetensors").find("past the end"), std::string::npos);
    EXPECT_NE(msg("st_empty.safetensors").find("empty"), std::string::npos);
    EXPECT_NE(msg("gguf_wrong_magic.gguf").find("GGUF"), std::string::npos);
    EXPECT_NE(msg("gguf_data_past_eof.gguf").find("truncated"), std::string::npos);
    EXPECT_NE(msg("gguf_duplicate_key.gguf").find("duplicate"), std::string::npos);
}
