// What users pass (lora/request.h): --lora FILE[:WEIGHT], <lora:NAME:W> tags resolved inside
// --lora-model-dir (extensions, subfolders, names that escape the folder, ambiguous names),
// several LoRAs and repeated names, weight 0, --lora-apply-mode; A1111's LoRA hash (sha256 of a
// safetensors file's data after its header, of any other file's bytes; sshs_model_hash first)
// against the SHA-256 test vector of "abc"; and the "Lora hashes" PNG field.
#include "lora/request.h"

#include "core/error.h"
#include "lora_test_support.h"
#include "pipeline/png_meta.h"

#include <gtest/gtest.h>

#include <fstream>

using namespace easel;
using namespace easel::lora;
namespace fs = std::filesystem;

namespace {

void touch(const fs::path& p, const std::string& bytes = "x") {
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << bytes;
}

std::string error_of(const std::function<void()>& f, ErrorKind kind) {
    try {
        f();
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), kind) << e.what();
        return e.what();
    }
    return "(no error)";
}

}  // namespace

TEST(LoraRequest, LoraFlag) {
    const fs::path d = lora_test::temp_dir("lora_flag");
    touch(d / "a.safetensors");
    touch(d / "odd:name.gguf");
    LoraRequest r = parse_lora_flag((d / "a.safetensors").string() + ":0.6");
    EXPECT_EQ(r.path, d / "a.safetensors");
    EXPECT_EQ(r.name, "a");
    EXPECT_FLOAT_EQ(r.te_weight, 0.6f);
    EXPECT_FLOAT_EQ(r.diffusion_weight, 0.6f);
    EXPECT_FLOAT_EQ(parse_lora_flag((d / "a.safetensors").string()).diffusion_weight, 1.0f);
    EXPECT_FLOAT_EQ(parse_lora_flag((d / "a.safetensors").string() + ":-1.5").te_weight, -1.5f);
    EXPECT_FALSE(parse_lora_flag((d / "a.safetensors").string() + ":0").active());
    EXPECT_EQ(parse_lora_flag((d / "odd:name.gguf").string()).path, d / "odd:name.gguf");  // a ':' in an existing file name
    const std::string bad = (d / "a.safetensors").string() + ":strong";
    EXPECT_EQ(error_of([&] { parse_lora_flag(bad); }, ErrorKind::InvalidInput),
              fmt::format("--lora '{}': weight 'strong' is not a number; write --lora FILE or --lora FILE:0.8", bad));
    EXPECT_NE(error_of([&] { parse_lora_flag((d / "nope.safetensors").string()); }, ErrorKind::Io).find("not found"), std::string::npos);
    EXPECT_NE(error_of([&] { parse_lora_flag((d / "a.safetensors").string() + ":nan"); }, ErrorKind::InvalidInput).find("not a number"),
              std::string::npos);
    fs::remove_all(d);
}

TEST(LoraRequest, NamesResolveInsideTheFolderOnly) {
    const fs::path d = lora_test::temp_dir("lora_dir");
    const fs::path root = d / "loras";
    touch(root / "style.safetensors");
    touch(root / "style.gguf");  // .safetensors is tried first
    touch(root / "q.gguf");
    touch(root / "old.pt");
    touch(root / "sub" / "deep.safetensors");
    touch(root / "x" / "dup.safetensors");
    touch(root / "y" / "dup.safetensors");
    touch(root / "notes.txt");
    touch(d / "outside.safetensors");
    fs::create_symlink(d / "outside.safetensors", root / "link.safetensors");
    EXPECT_EQ(resolve_lora_name(root, "style"), root / "style.safetensors");
    EXPECT_EQ(resolve_lora_name(root, "style.gguf"), root / "style.gguf");
    EXPECT_EQ(resolve_lora_name(root, "q"), root / "q.gguf");
    EXPECT_EQ(resolve_lora_name(root, "old"), root / "old.pt");
    EXPECT_EQ(resolve_lora_name(root, "sub/deep"), root / "sub" / "deep.safetensors");
    EXPECT_EQ(resolve_lora_name(root, "deep"), root / "sub" / "deep.safetensors");  // found in a subfolder by file name
    EXPECT_EQ(resolve_lora_name(root, "x/dup"), root / "x" / "dup.safetensors");
    EXPECT_NE(error_of([&] { resolve_lora_name(root, "dup"); }, ErrorKind::InvalidInput).find("matches 2 files"), std::string::npos);
    EXPECT_NE(error_of([&] { resolve_lora_name(root, "../outside"); }, ErrorKind::InvalidInput).find("leaves --lora-model-dir"),
              std::string::npos);
    EXPECT_NE(error_of([&] { resolve_lora_name(root, (d / "outside").string()); }, ErrorKind::InvalidInput).find("not a path"),
              std::string::npos);
    EXPECT_NE(error_of([&] { resolve_lora_name(root, "link"); }, ErrorKind::InvalidInput).find("outside --lora-model-dir"), std::string::npos);
    EXPECT_NE(error_of([&] { resolve_lora_name(root, "notes"); }, ErrorKind::Io).find("LoRA 'notes' not found in --lora-model-dir"),
              std::string::npos);
    EXPECT_NE(error_of([&] { resolve_lora_name(d / "missing", "style"); }, ErrorKind::Io).find("is not a folder"), std::string::npos);
    fs::remove_all(d);
}

TEST(LoraRequest, CollectFlagsAndTags) {
    const fs::path d = lora_test::temp_dir("lora_collect");
    touch(d / "a.safetensors");
    touch(d / "b.safetensors");
    const auto pos = text::extract_extra_networks("a cat <lora:a:0.5> <lora:b:1:0.25>, <lora:a:0.25>");
    const auto neg = text::extract_extra_networks("blurry <lora:b:0>");
    auto rs = collect_loras({(d / "b.safetensors").string() + ":2"}, pos, neg, d);
    ASSERT_EQ(rs.size(), 2u);
    EXPECT_EQ(rs[0].name, "b");  // the --lora flag first
    EXPECT_FLOAT_EQ(rs[0].te_weight, 3.0f);          // 2 + 1 + 0
    EXPECT_FLOAT_EQ(rs[0].diffusion_weight, 2.25f);  // 2 + 0.25 + 0
    EXPECT_EQ(rs[1].name, "a");
    EXPECT_FLOAT_EQ(rs[1].te_weight, 0.75f);  // a tag named twice: the weights add up
    EXPECT_EQ(rs[1].origin, "prompt");
    // a weight of 0 is kept, inactive
    auto off = collect_loras({}, text::extract_extra_networks("<lora:a:0>"), {}, d);
    ASSERT_EQ(off.size(), 1u);
    EXPECT_FALSE(off[0].active());
    EXPECT_EQ(error_of([&] { collect_loras({}, pos, {}, ""); }, ErrorKind::InvalidInput),
              "the prompt names LoRA 'a' (<lora:a>) but no --lora-model-dir is given");
    EXPECT_EQ(error_of([&] { text::extract_extra_networks("<lora:a:heavy>"); }, ErrorKind::InvalidInput),
              "LoRA tag <lora:a:heavy> has multiplier 'heavy' that is not a number; write e.g. <lora:a:0.8>");
    EXPECT_EQ(parse_apply_mode("at_runtime"), ApplyMode::AtRuntime);
    EXPECT_EQ(parse_apply_mode("immediately"), ApplyMode::Immediately);
    EXPECT_EQ(error_of([&] { parse_apply_mode("later"); }, ErrorKind::InvalidInput),
              "--lora-apply-mode 'later' is not one of auto, immediately, at_runtime");
    fs::remove_all(d);
}

TEST(LoraRequest, A1111Hashes) {
    // SHA-256("abc") = ba7816bf...; a safetensors file hashes the bytes after its header
    const fs::path d = lora_test::temp_dir("lora_hash");
    const std::string header = "{}      ";  // 8 bytes
    std::string st(8, '\0');
    st[0] = (char)header.size();
    touch(d / "h.safetensors", st + header + "abc");
    touch(d / "h.pt", "abc");
    EXPECT_EQ(lora_sha256(d / "h.safetensors"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    EXPECT_EQ(lora_sha256(d / "h.pt"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    EXPECT_EQ(a1111_short_hash(d / "h.pt"), "ba7816bf8f01");
    // the empty message's digest: a header and nothing after it
    touch(d / "e.safetensors", st + header);
    EXPECT_EQ(lora_sha256(d / "e.safetensors"), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    // kohya's sshs_model_hash metadata wins (A1111 reads it first)
    lora_test::write_safetensors(d / "m.safetensors", {{"a.alpha", {}, {1}}},
                                 {{"sshs_model_hash", "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}});
    EXPECT_EQ(a1111_short_hash(d / "m.safetensors"), "0123456789ab");
    EXPECT_EQ(error_of([&] { lora_sha256(d / "none.pt"); }, ErrorKind::Io), fmt::format("cannot read '{}' to hash it", (d / "none.pt").string()));
    // A1111's infotext field: names without ':' and ',', joined by ", "; quoted by make_infotext
    const std::string v = pipeline::lora_hashes_value({{"style", "ba7816bf8f01"}, {"a:b,c", "0123456789ab"}, {"", "x"}, {"style", "e3b0c44298fc"}});
    EXPECT_EQ(v, "style: e3b0c44298fc, abc: 0123456789ab");
    pipeline::GenerationInfo gi;
    gi.prompt = "a <lora:style:1>";
    gi.extra.push_back({"Lora hashes", v});
    gi.version = "v";
    const std::string text = pipeline::format_infotext(pipeline::make_infotext(gi));
    EXPECT_NE(text.find(", Lora hashes: \"style: e3b0c44298fc, abc: 0123456789ab\", Version: v"), std::string::npos) << text;
    fs::remove_all(d);
}
