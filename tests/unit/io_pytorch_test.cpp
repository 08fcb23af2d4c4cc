// PyTorch checkpoints: the restricted unpickler (io/pickle.h) and the zip / legacy readers behind
// WeightIndex. Fixtures: tests/data/pytorch (made by tools/make-malformed/pytorch_files.py with
// CPython's pickler, every tensor's values in expected.json), tests/data/malformed/pt_* (hostile
// and damaged files), and files written here by tests/unit/torch_writer.h.
#include "core/error.h"
#include "io/detect.h"
#include "io/pickle.h"
#include "io/weight_index.h"
#include "pytorch_expected.h"
#include "torch_writer.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>

using namespace easel;
using namespace easel::io;
namespace fs = std::filesystem;

namespace {

const fs::path kData = fs::path(EASEL_TEST_DATA);

// A pickle written as a C string literal, NUL bytes included.
#define PK(lit) std::string(lit, sizeof(lit) - 1)

std::vector<uint8_t> read_bytes(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), {});
}

std::string open_error(const fs::path& p) {
    try {
        WeightIndex::open(p);
    } catch (const Error& e) {
        return e.what();
    }
    return "no error";
}

std::string pickle_error(const std::string& bytes) {
    try {
        auto u = pickle::unpickle(std::span<const uint8_t>((const uint8_t*)bytes.data(), bytes.size()), "test.pkl");
        pickle::select_state_dict(u, "test.pkl");
    } catch (const Error& e) {
        return e.what();
    }
    return "no error";
}

pickle::Unpickled unpickle_str(const std::string& s) {
    return pickle::unpickle(std::span<const uint8_t>((const uint8_t*)s.data(), s.size()), "test.pkl");
}

fs::path temp_dir(const std::string& name) {
    fs::path d = fs::path(testing::TempDir()) / (name + "_" + std::to_string(getpid()));
    fs::remove_all(d);
    fs::create_directories(d);
    return d;
}

}  // namespace

// Every committed file reads back exactly the values its generator wrote (zip, ZIP64, protocol 4,
// every record deflated, legacy; params_ema preferred over params; a Lightning checkpoint's state_dict with its numpy
// global_step, ModelCheckpoint callback and optimizer state skipped; strided views copied
// contiguously, shared storages, size-1 dims with stride 0), from the file and from memory.
TEST(IoPytorch, CommittedFilesReadTheirExpectedValues) {
    const auto expected = nlohmann::json::parse(std::ifstream(kData / "pytorch" / "expected.json"));
    ASSERT_GE(expected.size(), 13u);
    for (auto& [file, want] : expected.items()) {
        SCOPED_TRACE(file);
        auto wi = WeightIndex::open(kData / "pytorch" / file);
        ASSERT_EQ(wi.files().size(), 1u);
        EXPECT_EQ(wi.files()[0].format, file.find("legacy") != std::string::npos ? "pytorch-legacy" : "pytorch");
        test::check_against_expected(wi, want, file);
        auto bytes = read_bytes(kData / "pytorch" / file);
        auto wm = WeightIndex::open_memory(bytes, file);
        test::check_against_expected(wm, want, file + " (memory)");
    }
}

// Contiguous tensors point into the mapped file (no copy); only strided views use the side buffer.
TEST(IoPytorch, ContiguousTensorsAreReadInPlace) {
    auto wi = WeightIndex::open(kData / "pytorch" / "strided.pth");
    EXPECT_FALSE(wi.find("whole")->side);
    EXPECT_FALSE(wi.find("rows_1_3")->side);
    EXPECT_FALSE(wi.find("expanded_row")->side);
    EXPECT_TRUE(wi.find("transposed")->side);
    EXPECT_TRUE(wi.find("every_other")->side);
    // rows 1..2 of `whole` share its storage: the same bytes of the file, 6 floats further
    EXPECT_EQ(wi.find("rows_1_3")->offset, wi.find("whole")->offset + 6 * 4);
    auto basic = WeightIndex::open(kData / "pytorch" / "basic_zip.pth");
    for (const auto& t : basic.tensors()) EXPECT_FALSE(t.side) << t.name;
    // torch aligns storage records to 64 bytes; so does the generator
    EXPECT_EQ(basic.find("t_f32")->offset % 64, 0u);
    // deflated records (re-packed files) are inflated into the side buffer
    auto deflated = WeightIndex::open(kData / "pytorch" / "basic_deflated.pth");
    for (const auto& t : deflated.tensors()) EXPECT_TRUE(t.side || t.nbytes == 0) << t.name;
}

// The classic payload (GLOBAL posix.system + REDUCE) and its relatives are refused by name, and
// nothing runs: the payload would write /tmp/easel_pwned.
TEST(IoPytorch, HostilePicklesAreRefusedNamingTheGlobal) {
    const fs::path dir = kData / "malformed";
    fs::remove("/tmp/easel_pwned");
    auto m = open_error(dir / "pt_os_system.pth");
    EXPECT_NE(m.find("'posix.system'"), std::string::npos) << m;
    EXPECT_NE(m.find("nothing in the file was run"), std::string::npos) << m;
    EXPECT_NE(open_error(dir / "pt_os_system_legacy.pt").find("'posix.system'"), std::string::npos);
    EXPECT_NE(open_error(dir / "pt_os_system_protocol0.pth").find("'os.system'"), std::string::npos);
    EXPECT_NE(open_error(dir / "pt_eval.pth").find("'builtins.eval'"), std::string::npos);
    EXPECT_NE(open_error(dir / "pt_stack_global_popen.pth").find("'subprocess.Popen'"), std::string::npos);
    EXPECT_NE(open_error(dir / "pt_numpy_ndarray.pth").find("'numpy.core.multiarray._reconstruct'"), std::string::npos);
    EXPECT_NE(open_error(dir / "pt_inst.pth").find("INST"), std::string::npos);
    EXPECT_NE(open_error(dir / "pt_ext1.pth").find("extension registry"), std::string::npos);
    EXPECT_NE(open_error(dir / "pt_torchscript.pt").find("TorchScript"), std::string::npos);
    EXPECT_NE(open_error(dir / "pt_reduce_storage_type.pth").find("REDUCE"), std::string::npos);
    EXPECT_NE(open_error(dir / "pt_build_on_list.pth").find("BUILD"), std::string::npos);
    EXPECT_FALSE(fs::exists("/tmp/easel_pwned"));
}

TEST(IoPytorch, DamagedFilesGiveOneClearLine) {
    const fs::path dir = kData / "malformed";
    auto has = [&](const char* f, const char* part) {
        const std::string m = open_error(dir / f);
        EXPECT_NE(m.find(part), std::string::npos) << f << ": " << m;
    };
    has("pt_deep_nesting.pth", "deeper than 64");
    has("pt_cycle.pth", "cycle");
    has("pt_deep_mark.pth", "no tensors");
    has("pt_huge_size.pth", "overflows 64 bits");
    has("pt_size_past_storage.pth", "reaches element");
    has("pt_offset_out_of_range.pth", "storage offset out of range");
    has("pt_negative_size.pth", "negative");
    has("pt_too_many_dims.pth", "12 dimensions");
    has("pt_broadcast.pth", "broadcast");
    has("pt_storage_short.pth", "truncated");
    has("pt_storage_missing.pth", "not in the zip");
    has("pt_storage_huge_numel.pth", "truncated");
    has("pt_deflate_bad_crc.pth", "CRC-32");
    has("pt_deflate_damaged.pth", "damaged or truncated");
    has("pt_deflate_short.pth", "does not inflate to its 32 bytes");
    has("pt_deflate_ratio.pth", "claims 1000000000 bytes");
    has("pt_zip_method_12.pth", "compression method 12");
    has("pt_big_endian.pth", "big-endian");
    has("pt_truncated_zip.pth", "truncated");
    has("pt_truncated_end.pth", "truncated");
    has("pt_truncated_pickle.pth", "truncated");
    has("pt_local_name_mismatch.pth", "names another file");
    has("pt_cd_outside.pth", "outside the file");
    has("pt_no_data_pkl.pth", "data.pkl");
    has("pt_empty_zip.pth", "empty zip");
    has("pt_no_tensors.pth", "no tensors");
    has("pt_list_root.pth", "not a state dict");
    has("pt_no_stop.pth", "STOP");
    has("pt_get_unknown.pth", "never stored");
    has("pt_bad_opcode.pth", "opcode 0xff");
    has("pt_protocol_9.pth", "protocol 9");
    has("pt_string_past_end.pth", "past the end");
    has("pt_not_utf8.pth", "UTF-8");
    has("pt_persid_not_storage.pth", "persistent id");
    has("pt_text.pth", "neither with a zip header");
    has("pt_tar.pth", "tar-format");
    has("pt_legacy_truncated.pt", "truncated");
    has("pt_legacy_bad_protocol.pt", "protocol version 999");
    has("pt_legacy_key_unnamed.pt", "never named");
}

// The unpickler on hand-written pickles: protocol 0 text opcodes, LONG1 / LONG4, floats, the memo
// shared by reference (an APPEND after a GET mutates the stored list), MEMOIZE and FRAME.
TEST(IoPytorch, UnpicklerReadsEveryProtocol) {
    {  // protocol 0: (dp0\nS'a'\np1\nI12\nsS'b'\nF1.5\nsV\xe9\u00e9\nL99L\ns.
        auto u = unpickle_str("(dp0\nS'a\\n'\np1\nI12\nsS'b'\nF1.5\nsVx\\u00e9\nL-99L\nsS'flag'\nI01\ns.");
        const auto& d = u.at(u.root);
        ASSERT_EQ(d.kind, pickle::Node::Kind::Dict);
        ASSERT_EQ(d.items.size(), 8u);
        EXPECT_EQ(u.at(d.items[0]).s, "a\n");
        EXPECT_EQ(u.at(d.items[1]).i, 12);
        EXPECT_EQ(u.at(d.items[3]).f, 1.5);
        EXPECT_EQ(u.at(d.items[4]).s, "x\xc3\xa9");
        EXPECT_EQ(u.at(d.items[5]).i, -99);
        EXPECT_EQ(u.at(d.items[7]).kind, pickle::Node::Kind::Bool);
        EXPECT_TRUE(u.at(d.items[7]).b);
    }
    {  // protocol 2: LONG1 -2 (0xfe), LONG1 2^40, LONG4 of 9 bytes (a big int), BINFLOAT 2.5
        std::string s = PK("\x80\x02](\x8a\x01\xfe\x8a\x06\x00\x00\x00\x00\x00\x01\x8b\x09\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x01"
                           "G\x40\x04\x00\x00\x00\x00\x00\x00" "e.");
        auto u = unpickle_str(s);
        const auto& l = u.at(u.root);
        ASSERT_EQ(l.items.size(), 4u);
        EXPECT_EQ(u.at(l.items[0]).i, -2);
        EXPECT_EQ(u.at(l.items[1]).i, 1ll << 40);
        EXPECT_EQ(u.at(l.items[2]).kind, pickle::Node::Kind::BigInt);
        EXPECT_EQ(u.at(l.items[3]).f, 2.5);
    }
    {  // memo by reference: a list stored, fetched, appended to: the dict sees the element
        std::string s = PK("\x80\x02}q\x00X\x01\x00\x00\x00" "a]q\x01sh\x01K\x07" "a0.");
        auto u = unpickle_str(s);
        const auto& d = u.at(u.root);
        const auto& l = u.at(d.items[1]);
        ASSERT_EQ(l.items.size(), 1u);
        EXPECT_EQ(u.at(l.items[0]).i, 7);
    }
    {  // protocol 4: FRAME, SHORT_BINUNICODE, MEMOIZE, EMPTY_SET + ADDITEMS, TUPLE3
        std::string s = PK("\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x01k\x94\x8f(K\x01K\x02\x90K\x03K\x04K\x05\x87\x86s.");
        // stack after ADDITEMS: dict, 'k', set{1,2}, 3, 4, 5 -> TUPLE3 (3,4,5) -> TUPLE2 (set, (3,4,5)) -> SETITEM
        auto u = unpickle_str(s);
        const auto& d = u.at(u.root);
        ASSERT_EQ(d.items.size(), 2u);
        const auto& t = u.at(d.items[1]);
        ASSERT_EQ(t.kind, pickle::Node::Kind::Tuple);
        EXPECT_EQ(u.at(t.items[0]).items.size(), 2u);
        EXPECT_EQ(u.at(t.items[1]).items.size(), 3u);
    }
    // opcodes that need what is not there
    EXPECT_NE(pickle_error("\x80\x02" "a."), "no error");
    EXPECT_NE(pickle_error("\x80\x02" "1."), "no error");
    EXPECT_NE(pickle_error("\x80\x02" "]."), "no error");  // a list root: not a state dict
    EXPECT_NE(pickle_error("\x80\x02" "(."), "no error");  // STOP with nothing on the stack but a MARK
    EXPECT_NE(pickle_error(PK("\x80\x02}X\x01\x00\x00\x00" "a\x8b\xff\xff\xff\xff")), "no error");  // LONG4 negative length
}

// A checkpoint made by the test writer from a safetensors fixture holds the same tensors, byte
// for byte, in both formats and under a wrapper key, and is detected as the same model.
TEST(IoPytorch, SafetensorsAndPthOfTheSameWeightsAgree) {
    auto st = WeightIndex::open(kData / "reference" / "autoencoder_kl_sd_tiny.safetensors");
    const auto ts = test::tensors_of(st);
    const fs::path dir = temp_dir("io_pytorch_roundtrip");
    for (bool legacy : {false, true})
        for (std::string wrapper : {"", "state_dict"}) {
            const fs::path p = dir / (std::string(legacy ? "legacy" : "zip") + (wrapper.empty() ? "" : "_wrapped") + ".ckpt");
            test::torch_save_file(p, ts, wrapper, legacy, {{"global_step", 1234}});
            auto wi = WeightIndex::open(p);
            ASSERT_EQ(wi.tensors().size(), st.tensors().size()) << p;
            for (const auto& t : st.tensors()) {
                const TensorInfo* o = wi.find(t.name);
                ASSERT_NE(o, nullptr) << t.name;
                EXPECT_EQ(o->shape, t.shape);
                EXPECT_EQ(o->dtype, t.dtype);
                auto a = st.bytes(t), b = wi.bytes(*o);
                ASSERT_EQ(a.size(), b.size());
                EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size()), 0) << t.name;
            }
            const auto d1 = detect(st), d2 = detect(wi);
            EXPECT_EQ(d1.family, d2.family);
            EXPECT_EQ(d1.variant, d2.variant);
            if (!wrapper.empty()) {
                EXPECT_EQ(wi.metadata().at("global_step").s, "1234");
            }
        }
    fs::remove_all(dir);
}

// Older diffusers / transformers folders hold PyTorch weights: diffusion_pytorch_model.bin is
// picked when no safetensors file is there, and config.json is read beside it.
TEST(IoPytorch, FolderWithBinWeightsOpens) {
    auto st = WeightIndex::open(kData / "reference" / "autoencoder_kl_sd_tiny.safetensors");
    const fs::path dir = temp_dir("io_pytorch_folder");
    test::torch_save_file(dir / "diffusion_pytorch_model.bin", test::tensors_of(st));
    std::ofstream(dir / "config.json") << "{\"_class_name\": \"AutoencoderKL\"}";
    auto wi = WeightIndex::open(dir);
    EXPECT_EQ(wi.tensors().size(), st.tensors().size());
    ASSERT_NE(wi.config(), nullptr);
    EXPECT_EQ(wi.files()[0].path.filename(), "diffusion_pytorch_model.bin");
    fs::remove_all(dir);
}

// A truncated checkpoint at every length is refused with an Error, never a crash.
TEST(IoPytorch, EveryTruncationIsRefused) {
    for (const char* f : {"basic_zip.pth", "basic_legacy.pt", "strided_legacy.pt"}) {
        const auto bytes = read_bytes(kData / "pytorch" / f);
        int refused = 0;
        for (size_t n = 0; n + 1 < bytes.size(); n += 7) {
            try {
                WeightIndex::open_memory(std::span<const uint8_t>(bytes.data(), n), f);
            } catch (const Error&) {
                ++refused;
            }
        }
        EXPECT_EQ(refused, (int)((bytes.size() - 2) / 7 + 1)) << f;
    }
}
