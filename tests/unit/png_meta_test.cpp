// PNG text chunks and A1111 infotext, on real files written by A1111, sd.cpp and kohya
// (tests/data/png, see README.md there). Expected strings were read from the files' chunks.
#include "core/error.h"
#include "pipeline/image_io.h"
#include "pipeline/png_meta.h"
#include "text/prompt_syntax.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>

using namespace easel::pipeline;
using Params = std::vector<std::pair<std::string, std::string>>;

namespace {
std::filesystem::path data(const std::string& name) { return std::filesystem::path(EASEL_TEST_DATA) / "png" / name; }
const std::string kDuck =
    "photo of a duck\nNegative prompt: monochrome\nSteps: 15, Sampler: UniPC, CFG scale: 5, Seed: 235284042, "
    "Size: 512x400, Model hash: c0d1994c73, Model: realistic_realisticVisionV20_v20";
const Params kDuckParams{{"Steps", "15"},      {"Sampler", "UniPC"},         {"CFG scale", "5"},
                         {"Seed", "235284042"}, {"Size", "512x400"},          {"Model hash", "c0d1994c73"},
                         {"Model", "realistic_realisticVisionV20_v20"}};
}  // namespace

TEST(PngMeta, Automatic1111Parameters) {
    const auto chunks = read_png_text(data("sdparsers_automatic1111_cropped.png"));
    ASSERT_EQ(chunks.size(), 1u);
    EXPECT_EQ(chunks[0].type, "tEXt");
    EXPECT_EQ(chunks[0].keyword, "parameters");
    EXPECT_FALSE(chunks[0].after_idat);
    EXPECT_EQ(chunks[0].text, kDuck);
    const auto info = parse_infotext(chunks[0].text);
    EXPECT_EQ(info.prompt, "photo of a duck");
    EXPECT_EQ(info.negative_prompt, "monochrome");
    EXPECT_EQ(info.params, kDuckParams);
    EXPECT_EQ(info.size(), (std::pair{512, 400}));
    EXPECT_EQ(info.number("CFG scale"), 5.0);
    EXPECT_EQ(sampler_from_a1111_name(*info.get("Sampler")), "uni_pc");
    // Formatting the parsed fields gives the original text back.
    EXPECT_EQ(format_infotext(info), kDuck);
}

TEST(PngMeta, ZtxtAfterIdat) {
    const auto chunks = read_png_text(data("sdparsers_bad_text_after_idat.png"));
    ASSERT_EQ(chunks.size(), 7u);
    EXPECT_EQ(chunks[0].keyword, "date:create");
    EXPECT_EQ(chunks[0].text, "2023-04-22T00:01:01+00:00");
    EXPECT_EQ(chunks[5].keyword, "filename:f");
    EXPECT_EQ(chunks[5].text, "automatic1111_cropped");
    EXPECT_EQ(chunks[6].type, "zTXt");
    EXPECT_TRUE(chunks[6].after_idat);
    EXPECT_EQ(find_png_text(chunks, "parameters"), kDuck);
    EXPECT_EQ(parse_infotext(*find_png_text(chunks, "parameters")).params, kDuckParams);
}

TEST(PngMeta, SdcppLoraTagKeptInPrompt) {
    const auto text = find_png_text(read_png_text(data("sdcpp_with_lcm_cropped.png")), "parameters");
    ASSERT_TRUE(text);
    const auto info = parse_infotext(*text);
    EXPECT_EQ(info.prompt, "a lovely cat<lora:lcm-lora-sdv1-5:1>");
    EXPECT_EQ(info.negative_prompt, "");
    EXPECT_EQ(info.params, (Params{{"Steps", "4"},
                                   {"CFG scale", "1.000000"},
                                   {"Seed", "42"},
                                   {"Size", "512x512"},
                                   {"Model", "v1-5-pruned-emaonly-ggml-model-f16.bin"},
                                   {"RNG", "cuda"},
                                   {"Sampler", "euler_a"},
                                   {"Version", "stable-diffusion.cpp"}}));
    EXPECT_EQ(sampler_from_a1111_name(*info.get("Sampler")), "euler_a");
    const auto tags = easel::text::extract_extra_networks(info.prompt);
    EXPECT_EQ(tags.text, "a lovely cat");
    ASSERT_EQ(tags.loras.size(), 1u);
    EXPECT_EQ(tags.loras[0].name, "lcm-lora-sdv1-5");
    EXPECT_EQ(tags.loras[0].multiplier, 1.0f);
}

TEST(PngMeta, SdcppUtf8InTextAndGarbageEta) {
    const auto chunks = read_png_text(data("sdcpp_wan2.2_14B_t2i_cropped.png"));
    ASSERT_EQ(chunks.size(), 1u);
    EXPECT_EQ(chunks[0].type, "tEXt");  // UTF-8 inside tEXt: decoded as UTF-8, not Latin-1
    const auto info = parse_infotext(chunks[0].text);
    EXPECT_EQ(info.prompt, "a lovely cat");
    EXPECT_TRUE(info.negative_prompt.starts_with("色调艳丽，过曝，静态，细节模糊不清，字幕，风格"));
    EXPECT_TRUE(info.negative_prompt.ends_with("三条腿，背景人很多，倒着走"));
    // Steps, CFG scale, Guidance, Eta, Seed, Size, Model, RNG, Sampler, TE, Unet, VAE, Version
    EXPECT_EQ(info.params.size(), 13u);
    EXPECT_EQ(info.get("Eta"), "73772809195389597528358912000.000000");  // kept verbatim
    EXPECT_DOUBLE_EQ(*info.number("Eta"), 7.3772809195389597528358912e28);
    EXPECT_EQ(info.get("Model"), "");  // "Model: ," -> empty value
    EXPECT_EQ(info.get("Guidance"), "3.500000");
    EXPECT_EQ(info.get("TE"), "umt5-xxl-encoder-Q8_0.gguf");
    EXPECT_EQ(info.get("Version"), "stable-diffusion.cpp");
    EXPECT_EQ(info.size(), (std::pair{832, 480}));
}

TEST(PngMeta, SdcppJsonValueWithCommas) {
    const auto text = find_png_text(read_png_text(data("sdcpp_longcat_example_cropped.png")), "parameters");
    ASSERT_TRUE(text);
    const auto info = parse_infotext(*text);
    EXPECT_EQ(info.prompt, "a lovely cat holding a sign says 'longcat.cpp'");
    ASSERT_EQ(info.params.size(), 14u);
    EXPECT_EQ(info.params.back().first, "SDCPP");
    EXPECT_EQ(info.get("Eta"), "inf");
    EXPECT_FALSE(info.number("Eta").has_value());  // not finite
    EXPECT_EQ(info.get("Sampler"), "euler discrete");
    EXPECT_EQ(sampler_from_a1111_name("euler discrete"), "euler");
    const auto j = nlohmann::json::parse(*info.get("SDCPP"));
    EXPECT_EQ(j.at("schema"), "sdcpp.image.params/v1");
    EXPECT_EQ(j.at("sampling").at("steps"), 20);
    EXPECT_EQ(j.at("sampling").at("guidance").at("slg").at("layers"), nlohmann::json({7, 8, 9}));
    EXPECT_EQ(j.at("prompt").at("positive"), "a lovely cat holding a sign says 'longcat.cpp'");
}

TEST(PngMeta, KohyaOneChunkPerField) {
    const auto chunks = read_png_text(data("kohya_gen_img_example_cropped.png"));
    ASSERT_EQ(chunks.size(), 6u);
    EXPECT_FALSE(find_png_text(chunks, "parameters").has_value());
    EXPECT_EQ(find_png_text(chunks, "prompt"), "Wikipe-tan, [[cowboy shot, beautiful dress, smile, in park]]");
    EXPECT_EQ(find_png_text(chunks, "seed"), "478163327");
    EXPECT_EQ(find_png_text(chunks, "sampler"), "ddim");
    EXPECT_EQ(find_png_text(chunks, "scale"), "12.0");
    EXPECT_TRUE(find_png_text(chunks, "negative-prompt")->starts_with("[[snuggled, poor drawing,"));
}

TEST(PngMeta, BadFiles) {
    try {
        read_png_text(data("sdparsers_bad_empty_file.png"));
        FAIL() << "no error";
    } catch (const easel::Error& e) {
        EXPECT_EQ(e.kind(), easel::ErrorKind::InvalidInput);
    }
    EXPECT_THROW(read_png_text(data("sdparsers_automatic1111_cropped.jpg")), easel::Error);  // not a PNG
    try {
        read_png_text(data("does_not_exist.png"));
        FAIL() << "no error";
    } catch (const easel::Error& e) {
        EXPECT_EQ(e.kind(), easel::ErrorKind::Io);
    }
    // Truncated: a chunk that runs past the end.
    auto bytes = std::vector<uint8_t>{0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n', 0, 0, 1, 0, 't', 'E', 'X', 't', 'a'};
    EXPECT_THROW(read_png_text(bytes), easel::Error);
}

TEST(Infotext, QuoteAndParseRules) {
    EXPECT_EQ(infotext_quote("Euler a"), "Euler a");
    EXPECT_EQ(infotext_quote("lcm: abc, x: def"), "\"lcm: abc, x: def\"");
    EXPECT_EQ(infotext_quote("say \"hi\", ok"), "\"say \\\"hi\\\", ok\"");
    EXPECT_EQ(infotext_quote("猫, 犬"), "\"猫, 犬\"");  // json.dumps(ensure_ascii=False)
    // Fewer than 3 settings on the last line: it is prompt text.
    const auto a = parse_infotext("just a prompt\nSteps: 20, Seed: 1");
    EXPECT_EQ(a.prompt, "just a prompt\nSteps: 20, Seed: 1");
    EXPECT_TRUE(a.params.empty());
    // Multi-line prompt and negative; quoted value with escapes; key equal to value.
    const auto b = parse_infotext(
        "line one\n line two \nNegative prompt: bad\nworse\nSteps: 3, Lora hashes: \"a: 1, b: 2\", Hires fix, "
        "Note: \"say \\\"x\\\"\"");
    EXPECT_EQ(b.prompt, "line one\nline two");
    EXPECT_EQ(b.negative_prompt, "bad\nworse");
    EXPECT_EQ(b.params, (Params{{"Steps", "3"}, {"Lora hashes", "a: 1, b: 2"}, {"Note", "say \"x\""}}));
    EXPECT_TRUE(parse_infotext("").params.empty());
}

TEST(Infotext, MakeFormatsA1111Order) {
    GenerationInfo g;
    g.prompt = "a cat, (masterpiece:1.2)";
    g.negative_prompt = "blurry";
    g.steps = 20;
    g.sampler = a1111_sampler_name("euler_a");
    g.scheduler = a1111_scheduler_name("karras");
    g.cfg_scale = 7;
    g.seed = 1;
    g.width = 512;
    g.height = 768;
    g.model_hash = "0123456789";
    g.model = "sd15";
    g.clip_skip = 2;
    g.extra = {{"Lora hashes", "lcm: abcdef123456"}};
    const std::string want =
        "a cat, (masterpiece:1.2)\nNegative prompt: blurry\nSteps: 20, Sampler: Euler a, Schedule type: Karras, "
        "CFG scale: 7, Seed: 1, Size: 512x768, Model hash: 0123456789, Model: sd15, Clip skip: 2, "
        "Lora hashes: \"lcm: abcdef123456\", Version: easel 0.1.0";
    const auto info = make_infotext(g);
    EXPECT_EQ(format_infotext(info), want);
    // Round trip: parse(format(x)) has the same fields.
    const auto back = parse_infotext(format_infotext(info));
    EXPECT_EQ(back.prompt, info.prompt);
    EXPECT_EQ(back.negative_prompt, info.negative_prompt);
    EXPECT_EQ(back.params, info.params);
    // Clip skip 1 and empty negative prompt are omitted; fractional CFG printed shortest.
    g.clip_skip = 1;
    g.negative_prompt.clear();
    g.cfg_scale = 4.5;
    g.extra.clear();
    g.model_hash.clear();
    g.model.clear();
    EXPECT_EQ(format_infotext(make_infotext(g)),
              "a cat, (masterpiece:1.2)\nSteps: 20, Sampler: Euler a, Schedule type: Karras, CFG scale: 4.5, Seed: 1, "
              "Size: 512x768, Version: easel 0.1.0");
    EXPECT_EQ(a1111_sampler_name("dpm++2m"), "DPM++ 2M");
    EXPECT_EQ(a1111_sampler_name("dpm++2s_a"), "DPM++ 2S a");
    EXPECT_EQ(a1111_sampler_name("lcm"), "LCM");
    EXPECT_EQ(a1111_sampler_name("ddim_trailing"), "ddim_trailing");  // A1111's DDIM is leading-spacing ddim
    EXPECT_EQ(a1111_sampler_name("ddim"), "DDIM");
    EXPECT_EQ(a1111_sampler_name("dpm++2m_sde_bt"), "DPM++ 2M SDE");
    EXPECT_EQ(sampler_from_a1111_name("DPM++ 2M Karras"), "dpm++2m");
    EXPECT_EQ(sampler_from_a1111_name("DDIM"), "ddim");
    EXPECT_EQ(sampler_from_a1111_name("DPM++ 2M SDE Karras"), "dpm++2m_sde_bt");
    EXPECT_FALSE(sampler_from_a1111_name("no such sampler").has_value());
}

TEST(Infotext, PngRoundTripLatin1AndUtf8) {
    Image img;
    img.width = 3;
    img.height = 2;
    img.channels = 3;
    for (int i = 0; i < 18; ++i) img.pixels.push_back(static_cast<uint8_t>(i * 14));
    GenerationInfo g;
    g.prompt = "café au lait";          // Latin-1 representable -> tEXt
    g.negative_prompt = "低质量, 模糊";   // not Latin-1 -> iTXt
    g.sampler = "Euler";
    const std::string params = format_infotext(make_infotext(g));
    const std::vector<PngTextEntry> a{{"parameters", "café au lait\nSteps: 20, Sampler: Euler, Seed: 0"}};
    const std::vector<PngTextEntry> b{{"parameters", params}, {"Software", "easel"}};

    const auto pa = read_png_text(encode_png(img, a));
    ASSERT_EQ(pa.size(), 1u);
    EXPECT_EQ(pa[0].type, "tEXt");
    EXPECT_EQ(pa[0].text, a[0].text);

    const auto bytes = encode_png(img, b);
    const auto pb = read_png_text(bytes);
    ASSERT_EQ(pb.size(), 2u);
    EXPECT_EQ(pb[0].type, "iTXt");
    EXPECT_EQ(pb[0].text, params);
    EXPECT_EQ(pb[1].type, "tEXt");
    const auto info = parse_infotext(pb[0].text);
    EXPECT_EQ(info.prompt, "café au lait");
    EXPECT_EQ(info.negative_prompt, "低质量, 模糊");
    EXPECT_EQ(info.get("Sampler"), "Euler");
    // The pixels survive too.
    const auto dec = decode_image(bytes, 3);
    EXPECT_EQ(dec.width, 3);
    EXPECT_EQ(dec.height, 2);
    EXPECT_EQ(dec.pixels, img.pixels);

    EXPECT_THROW(encode_png(img, std::vector<PngTextEntry>{{"", "x"}}), easel::Error);
    EXPECT_THROW(encode_png(img, std::vector<PngTextEntry>{{"猫", "x"}}), easel::Error);
    EXPECT_THROW(encode_png(img, std::vector<PngTextEntry>{{"k", "\xff\xfe"}}), easel::Error);
}
