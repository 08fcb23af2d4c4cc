// The server's request layer without HTTP: base64 (RFC 4648 vectors), sampler names (A1111
// display names, aliases, old "<sampler> <schedule>" names), and the parsers of the A1111,
// OpenAI, sd.cpp and easel bodies: values taken, defaults left to the server, and every refusal
// naming its field with the status the API answers.
#include "pipeline/image_io.h"
#include "server/base64.h"
#include "server/job_request.h"
#include "server/preview.h"
#include "server/samplers.h"

#include <gtest/gtest.h>

#include <string>

namespace {

using namespace easel::server;
using nlohmann::json;

std::vector<uint8_t> bytes(std::string_view s) { return std::vector<uint8_t>(s.begin(), s.end()); }

/// A tiny RGB or RGBA PNG as base64.
std::string png_b64(int w, int h, int channels = 3, uint8_t value = 128) {
    easel::pipeline::Image im;
    im.width = w;
    im.height = h;
    im.channels = channels;
    im.pixels.assign((size_t)w * h * channels, value);
    return base64_encode(easel::pipeline::encode_png(im));
}

/// Runs f, expecting ApiError with this status and field.
template <class F>
void expect_refused(F&& f, int status, const std::string& field) {
    try {
        f();
        ADD_FAILURE() << "no ApiError; expected " << status << " naming " << field;
    } catch (const ApiError& e) {
        EXPECT_EQ(e.status(), status) << e.what();
        EXPECT_EQ(e.field(), field) << e.what();
        if (!field.empty()) { EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what(); }
    }
}

TEST(ServerBase64, Rfc4648Vectors) {
    const std::pair<const char*, const char*> v[] = {{"", ""},         {"f", "Zg=="},         {"fo", "Zm8="},        {"foo", "Zm9v"},
                                                      {"foob", "Zm9vYg=="}, {"fooba", "Zm9vYmE="}, {"foobar", "Zm9vYmFy"}};
    for (auto [plain, enc] : v) {
        EXPECT_EQ(base64_encode(bytes(plain)), enc);
        auto d = base64_decode(enc, 100);
        ASSERT_TRUE(d) << enc;
        EXPECT_EQ(std::string(d->begin(), d->end()), plain);
    }
    // no padding, whitespace, URL-safe alphabet, data URL
    EXPECT_EQ(*base64_decode("Zm9vYg", 100), bytes("foob"));
    EXPECT_EQ(*base64_decode("Zm9v\nYmFy", 100), bytes("foobar"));
    EXPECT_EQ(*base64_decode("-_8=", 100), (std::vector<uint8_t>{0xfb, 0xff}));
    EXPECT_EQ(*base64_decode("data:image/png;base64,Zm9v", 100), bytes("foo"));
}

TEST(ServerBase64, RefusesMalformedAndOversized) {
    EXPECT_FALSE(base64_decode("Zm9v!", 100));      // foreign character
    EXPECT_FALSE(base64_decode("Z", 100));          // one character left over
    EXPECT_FALSE(base64_decode("Zg==Zg==", 100));   // data after padding
    EXPECT_FALSE(base64_decode("Zg===", 100));      // three '='
    EXPECT_FALSE(base64_decode("data:image/png,Zm9v", 100));  // not base64
    EXPECT_FALSE(base64_decode("Zm9vYmFy", 5));     // 6 bytes > 5
    EXPECT_TRUE(base64_decode("Zm9vYmFy", 6));
}

TEST(ServerSamplers, A1111NamesAliasesAndSchedules) {
    EXPECT_EQ(lookup_a1111_sampler("Euler a").value_or(""), "euler_a");
    EXPECT_EQ(lookup_a1111_sampler("k_euler_ancestral").value_or(""), "euler_a");
    EXPECT_EQ(lookup_a1111_sampler("DPM++ 2M").value_or(""), "dpm++2m");
    EXPECT_EQ(lookup_a1111_sampler("dpm++2s_a").value_or(""), "dpm++2s_a");
    EXPECT_EQ(lookup_a1111_sampler("DDIM").value_or(""), "ddim");
    EXPECT_EQ(lookup_a1111_sampler("UniPC").value_or(""), "uni_pc");  // the sampling layer's one table
    EXPECT_FALSE(lookup_a1111_sampler("Nonsense Sampler"));
    // A1111's automatic schedule of DPM++ 2M is Karras (sd_samplers_kdiffusion.py)
    EXPECT_EQ(map_sampler("DPM++ 2M", "", "sampler_name", "scheduler").scheduler, "karras");
    auto c = map_sampler("DPM++ 2M Karras", "", "sampler_name", "scheduler");
    EXPECT_EQ(c.method, "dpm++2m");
    EXPECT_EQ(c.scheduler, "karras");
    c = map_sampler("Euler", "Karras", "sampler_name", "scheduler");
    EXPECT_EQ(c.method, "euler");
    EXPECT_EQ(c.scheduler, "karras");
    c = map_sampler("", "automatic", "sampler_name", "scheduler");
    EXPECT_EQ(c.method, "");
    EXPECT_EQ(c.scheduler, "");
    c = map_sampler("Euler a", "normal", "sampler_name", "scheduler");
    EXPECT_EQ(c.scheduler, "discrete");
    expect_refused([] { map_sampler("Nonsense Sampler", "", "sampler_name", "scheduler"); }, 400, "sampler_name");
    expect_refused([] { map_sampler("Euler", "no_such_schedule", "sampler_name", "scheduler"); }, 400, "scheduler");
    EXPECT_EQ(map_sampler("Euler", "align_your_steps", "sampler_name", "scheduler").scheduler, "ays");
    expect_refused([] { map_sampler("DPM++ 2M Karras", "exponential", "sampler_name", "scheduler"); }, 400, "scheduler");
    // every listed sampler maps to itself and runs
    for (const auto& e : sampler_entries()) EXPECT_EQ(map_sampler(e.name, "", "s", "t").method, e.method);
}

TEST(ServerRequest, A1111Txt2imgAsDocumented) {
    const Limits lim;
    const json body = json::parse(R"({"prompt": "a red circle", "negative_prompt": "blurry", "steps": 5, "cfg_scale": 5,
        "width": 64, "height": 128, "seed": 7, "sampler_name": "Euler a", "scheduler": "Karras", "batch_size": 2, "n_iter": 2,
        "override_settings": {"CLIP_stop_at_last_layers": 2}, "restore_faces": false, "send_images": true, "save_images": false,
        "script_args": [], "alwayson_scripts": {}, "some_future_field": 1})");
    JobRequest r = parse_a1111(body, false, lim);
    EXPECT_EQ(r.type, "txt2img");
    EXPECT_EQ(r.prompt, "a red circle");
    EXPECT_EQ(r.negative_prompt, "blurry");
    EXPECT_EQ(r.steps.value_or(0), 5);
    EXPECT_EQ(r.cfg_scale.value_or(0), 5.0);
    EXPECT_EQ(r.width, 64);
    EXPECT_EQ(r.height, 128);
    EXPECT_EQ(r.seed, 7);
    EXPECT_EQ(r.sampler, "euler_a");
    EXPECT_EQ(r.scheduler, "karras");
    EXPECT_EQ(r.batch, 4);
    EXPECT_EQ(r.clip_skip.value_or(0), 2);
    EXPECT_EQ(r.parameters["prompt"], "a red circle");
    // left out: the server's defaults
    JobRequest d = parse_a1111(json::object(), false, lim);
    EXPECT_FALSE(d.steps);
    EXPECT_FALSE(d.cfg_scale);
    EXPECT_EQ(d.width, 0);
    EXPECT_EQ(d.seed, -1);
    EXPECT_EQ(d.sampler, "");
    // round trip through the store's JSON
    JobRequest back = JobRequest::from_json(r.to_json());
    EXPECT_EQ(back.to_json(), r.to_json());
}

TEST(ServerRequest, A1111HiresFix) {
    const Limits lim;
    // A1111's txt2img hires fields; denoising_strength defaults to A1111's 0.75
    JobRequest r = parse_a1111(json::parse(R"j({"prompt": "p", "enable_hr": true, "hr_scale": 1.5, "hr_upscaler": "Latent (nearest)",
        "hr_second_pass_steps": 6, "hr_resize_x": 0, "hr_resize_y": 0, "hr_sampler_name": null, "hr_prompt": ""})j"), false, lim);
    EXPECT_TRUE(r.hires);
    EXPECT_EQ(r.hr_scale, 1.5);
    EXPECT_EQ(r.hr_upscaler, "Latent (nearest)");
    EXPECT_EQ(r.hr_steps, 6);
    EXPECT_EQ(r.hires_strength, 0.75);
    JobRequest back = JobRequest::from_json(r.to_json());
    EXPECT_TRUE(back.hires);
    EXPECT_EQ(back.to_json(), r.to_json());
    r = parse_a1111(json::parse(R"({"enable_hr": true, "denoising_strength": 0.3, "hr_resize_x": 1024, "hr_resize_y": 768})"), false, lim);
    EXPECT_EQ(r.hires_strength, 0.3);
    EXPECT_EQ(r.hr_resize_x, 1024);
    EXPECT_EQ(r.hr_resize_y, 768);
    EXPECT_EQ(r.hr_upscaler, "");  // the server's default: Latent
    // off: the hr_* fields are not used, and the stored request has no hires entry
    r = parse_a1111(json::parse(R"({"enable_hr": false, "hr_scale": 3})"), false, lim);
    EXPECT_FALSE(r.hires);
    EXPECT_FALSE(r.to_json().contains("hires"));
}

TEST(ServerRequest, A1111RefusalsNameTheField) {
    const Limits lim;
    auto a = [&](const char* body, bool img2img = false) { return [&lim, body, img2img] { parse_a1111(json::parse(body), img2img, lim); }; };
    expect_refused(a(R"({"steps": "20"})"), 400, "steps");
    expect_refused(a(R"({"steps": 20.5})"), 400, "steps");
    expect_refused(a(R"({"steps": 100000})"), 400, "steps");
    expect_refused(a(R"({"width": 100000})"), 400, "width");
    expect_refused(a(R"({"width": -64})"), 400, "width");
    expect_refused(a(R"({"cfg_scale": "high"})"), 400, "cfg_scale");
    expect_refused(a(R"({"prompt": 5})"), 400, "prompt");
    expect_refused(a(R"({"batch_size": 8, "n_iter": 8})"), 400, "batch_size");
    expect_refused(a(R"({"enable_hr": true, "hr_scale": "2"})"), 400, "hr_scale");
    expect_refused(a(R"({"enable_hr": true, "hr_scale": 0})"), 400, "hr_scale");
    expect_refused(a(R"({"enable_hr": true, "denoising_strength": 0})"), 400, "denoising_strength");
    expect_refused(a(R"({"enable_hr": true, "hr_second_pass_steps": -1})"), 400, "hr_second_pass_steps");
    expect_refused(a(R"({"enable_hr": true, "hr_sampler_name": "Euler"})"), 400, "hr_sampler_name");
    expect_refused(a(R"({"enable_hr": true, "hr_prompt": "other"})"), 400, "hr_prompt");
    expect_refused(a(R"({"enable_hr": "yes"})"), 400, "enable_hr");
    expect_refused(a(R"({"restore_faces": true})"), 400, "restore_faces");
    expect_refused(a(R"({"sampler_name": "Nope"})"), 400, "sampler_name");
    expect_refused(a(R"({"override_settings": {"sd_vae": "other.vae.pt"}})"), 400, "override_settings.sd_vae");
    expect_refused(a(R"({"override_settings": {"unknown_opt": 1}})"), 400, "override_settings.unknown_opt");
    expect_refused(a(R"({"force_task_id": "../../etc"})"), 400, "force_task_id");
    expect_refused(a(R"({"seed": 18446744073709551615})"), 400, "seed");
    expect_refused(a(R"({})", true), 400, "init_images");
    expect_refused(a(R"({"init_images": ["not base64!"]})", true), 400, "init_images[0]");
    expect_refused(a(R"({"init_images": ["aGVsbG8="]})", true), 400, "init_images[0]");  // "hello": not an image
    expect_refused(a(R"({"init_images": [5]})", true), 400, "init_images[0]");
    const std::string big_prompt = json({{"prompt", std::string(lim.max_prompt_bytes + 1, 'a')}}).dump();
    expect_refused([&] { parse_a1111(json::parse(big_prompt), false, lim); }, 413, "prompt");
}

TEST(ServerRequest, A1111Img2imgWithMaskFields) {
    Limits lim;
    const json body = {{"init_images", {"data:image/png;base64," + png_b64(32, 16)}}, {"mask", png_b64(32, 16, 1, 255)},
                       {"denoising_strength", 0.5}, {"mask_blur", 2}, {"inpainting_mask_invert", 1}, {"inpainting_fill", 1},
                       {"inpaint_full_res", false}, {"resize_mode", 0}, {"include_init_images", false}};
    JobRequest r = parse_a1111(body, true, lim);
    EXPECT_EQ(r.type, "img2img");
    EXPECT_FALSE(r.init_image.empty());
    EXPECT_FALSE(r.mask.empty());
    EXPECT_EQ(r.strength.value_or(0), 0.5);
    EXPECT_EQ(r.mask_blur, 2);
    EXPECT_TRUE(r.mask_invert);
    EXPECT_TRUE(r.parameters["init_images"].is_null());  // not echoed without include_init_images
    json bad = body;
    bad["inpainting_fill"] = 0;
    expect_refused([&] { parse_a1111(bad, true, lim); }, 400, "inpainting_fill");
    bad = body;
    bad["inpaint_full_res"] = true;
    expect_refused([&] { parse_a1111(bad, true, lim); }, 400, "inpaint_full_res");
    bad = body;
    bad["denoising_strength"] = 1.5;
    expect_refused([&] { parse_a1111(bad, true, lim); }, 400, "denoising_strength");
    // an image over the pixel bound: 413 naming it, found from the header alone
    lim.max_image_pixels = 100;
    expect_refused([&] { parse_a1111(body, true, lim); }, 413, "init_images[0]");
}

TEST(ServerRequest, JsonBodyBounds) {
    Limits lim;
    expect_refused([&] { parse_json_body("", lim); }, 400, "");
    expect_refused([&] { parse_json_body("{\"prompt\": ", lim); }, 400, "");
    expect_refused([&] { parse_json_body("[1, 2]", lim); }, 400, "");
    expect_refused([&] { parse_json_body(std::string(40, '[') + std::string(40, ']'), lim); }, 400, "");
    EXPECT_NO_THROW(parse_json_body(R"({"a": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["})", lim));  // brackets inside strings
    lim.max_body_bytes = 10;
    expect_refused([&] { parse_json_body(R"({"prompt": "abcdef"})", lim); }, 413, "");
}

TEST(ServerRequest, OpenAIGeneration) {
    const Limits lim;
    OpenAIRequest o = parse_openai_generation(json::parse(R"({"model": "dall-e-3", "prompt": "a cat", "n": 2, "size": "256x128",
        "response_format": "b64_json", "quality": "standard"})"), lim);
    EXPECT_EQ(o.job.prompt, "a cat");
    EXPECT_EQ(o.job.batch, 2);
    EXPECT_EQ(o.job.width, 256);
    EXPECT_EQ(o.job.height, 128);
    EXPECT_EQ(o.response_format, "b64_json");
    // sd-server's extra arguments in the prompt
    o = parse_openai_generation(json::parse(R"({"prompt": "a cat <sd_cpp_extra_args>{\"seed\": 5, \"negative_prompt\": \"dog\", \"sample_params\": {\"sample_steps\": 3, \"sample_method\": \"euler\", \"guidance\": {\"txt_cfg\": 4.5}}}</sd_cpp_extra_args>"})"), lim);
    EXPECT_EQ(o.job.prompt, "a cat ");
    EXPECT_EQ(o.job.seed, 5);
    EXPECT_EQ(o.job.negative_prompt, "dog");
    EXPECT_EQ(o.job.steps.value_or(0), 3);
    EXPECT_EQ(o.job.sampler, "euler");
    EXPECT_EQ(o.job.cfg_scale.value_or(0), 4.5);
    auto g = [&](const char* body) { return [&lim, body] { parse_openai_generation(json::parse(body), lim); }; };
    expect_refused(g(R"({"n": 1})"), 400, "prompt");
    expect_refused(g(R"({"prompt": "x", "n": 0})"), 400, "n");
    expect_refused(g(R"({"prompt": "x", "n": 1000})"), 400, "n");
    expect_refused(g(R"({"prompt": "x", "size": "big"})"), 400, "size");
    expect_refused(g(R"({"prompt": "x", "size": "99999x64"})"), 400, "size");
    expect_refused(g(R"({"prompt": "x", "response_format": "jpeg"})"), 400, "response_format");
    expect_refused(g(R"({"prompt": "x", "output_format": "webp"})"), 400, "output_format");
    expect_refused(g(R"({"prompt": "x <sd_cpp_extra_args>{bad</sd_cpp_extra_args>"})"), 400, "prompt");
}

TEST(ServerRequest, OpenAIEditMultipart) {
    const Limits lim;
    auto img = base64_decode(png_b64(32, 32), 1 << 20);
    auto mask_rgba = base64_decode(png_b64(32, 32, 4, 0), 1 << 20);
    auto mask_gray = base64_decode(png_b64(32, 32, 1, 255), 1 << 20);
    std::vector<FormPart> parts = {{"prompt", "", "", "a hat"},
                                   {"image", "in.png", "image/png", std::string(img->begin(), img->end())},
                                   {"mask", "mask.png", "image/png", std::string(mask_rgba->begin(), mask_rgba->end())},
                                   {"n", "", "", "1"},
                                   {"size", "", "", "32x32"}};
    OpenAIRequest o = parse_openai_edit(parts, lim);
    EXPECT_EQ(o.job.type, "img2img");
    EXPECT_TRUE(o.job.mask_from_alpha);  // RGBA mask: OpenAI's transparent = edit
    parts[2].content = std::string(mask_gray->begin(), mask_gray->end());
    EXPECT_FALSE(parse_openai_edit(parts, lim).job.mask_from_alpha);  // grey mask: white = edit (sd-server)
    auto without = [&](const std::string& name) {
        std::vector<FormPart> r;
        for (const auto& p : parts)
            if (p.name != name) r.push_back(p);
        return r;
    };
    expect_refused([&] { parse_openai_edit(without("image"), lim); }, 400, "image");
    expect_refused([&] { parse_openai_edit(without("prompt"), lim); }, 400, "prompt");
    auto trunc = parts;
    trunc[1].content.resize(20);  // a PNG cut off inside its header
    expect_refused([&] { parse_openai_edit(trunc, lim); }, 400, "image");
    auto nbad = parts;
    nbad[3].content = "two";
    expect_refused([&] { parse_openai_edit(nbad, lim); }, 400, "n");
    auto msize = parts;
    auto small = base64_decode(png_b64(16, 16, 1), 1 << 20);
    msize[2].content = std::string(small->begin(), small->end());
    expect_refused([&] { parse_openai_edit(msize, lim); }, 400, "mask");
}

TEST(ServerRequest, SdcppNativeAndEaselJobs) {
    const Limits lim;
    JobRequest r = parse_sdcpp_img_gen(json::parse(R"({"prompt": "p", "width": 64, "height": 64, "seed": -1, "batch_count": 2,
        "sample_params": {"sample_method": "euler", "scheduler": "karras", "sample_steps": 4, "guidance": {"txt_cfg": 6}},
        "lora": [{"path": "style", "multiplier": 0.5}], "hires": {"enabled": false}, "output_format": "png"})"), lim);
    EXPECT_EQ(r.batch, 2);
    EXPECT_EQ(r.steps.value_or(0), 4);
    EXPECT_EQ(r.scheduler, "karras");
    ASSERT_EQ(r.loras.size(), 1u);
    EXPECT_EQ(r.loras[0].name, "style");
    EXPECT_EQ(r.loras[0].multiplier, 0.5);
    expect_refused([&] { parse_sdcpp_img_gen(json::parse(R"({"hires": {"enabled": true, "custom_sigmas": [1, 0]}})"), lim); }, 400,
                   "hires.custom_sigmas");
    expect_refused([&] { parse_sdcpp_img_gen(json::parse(R"({"hires": {"enabled": true, "denoising_strength": 0}})"), lim); }, 400,
                   "hires.denoising_strength");
    {
        // sd-server's hires object, with its defaults (Latent, scale 2, strength 0.7)
        JobRequest h = parse_sdcpp_img_gen(json::parse(R"({"prompt": "p", "hires": {"enabled": true, "steps": 3, "target_width": 128}})"), lim);
        EXPECT_TRUE(h.hires);
        EXPECT_EQ(h.hr_upscaler, "Latent");
        EXPECT_EQ(h.hr_scale, 2.0);
        EXPECT_EQ(h.hr_resize_x, 128);
        EXPECT_EQ(h.hr_steps, 3);
        EXPECT_EQ(h.hires_strength, 0.7);
        EXPECT_FALSE(parse_sdcpp_img_gen(json::parse(R"({"hires": {"enabled": true, "upscaler": "None"}})"), lim).hires);
    }
    expect_refused([&] { parse_sdcpp_img_gen(json::parse(R"({"sample_params": {"sample_steps": "x"}})"), lim); }, 400,
                   "sample_params.sample_steps");
    expect_refused([&] { parse_sdcpp_img_gen(json::parse(R"({"lora": [{"multiplier": 1}]})"), lim); }, 400, "lora[0].path");
    // every key sd-server reads is known; any other is refused naming it (sd-server drops it silently)
    expect_refused([&] { parse_sdcpp_img_gen(json::parse(R"({"prompt": "p", "sampler": "euler"})"), lim); }, 400, "sampler");
    expect_refused([&] { parse_sdcpp_img_gen(json::parse(R"({"sample_params": {"steps": 4}})"), lim); }, 400, "sample_params.steps");
    expect_refused([&] { parse_sdcpp_img_gen(json::parse(R"({"sample_params": {"guidance": {"cfg": 4}}})"), lim); }, 400,
                   "sample_params.guidance.cfg");
    expect_refused([&] { parse_sdcpp_img_gen(json::parse(R"({"sample_params": {"guidance": {"slg": {"scales": 1}}}})"), lim); }, 400,
                   "sample_params.guidance.slg.scales");
    expect_refused([&] { parse_sdcpp_img_gen(json::parse(R"({"hires": {"enable": true}})"), lim); }, 400, "hires.enable");
    expect_refused([&] { parse_sdcpp_img_gen(json::parse(R"({"lora": [{"path": "style", "weight": 1}]})"), lim); }, 400, "lora[0].weight");
    // sd-server fields easel cannot apply: refused unless at the value that means "off"
    expect_refused([&] { parse_sdcpp_img_gen(json::parse(R"({"cache_mode": "easycache"})"), lim); }, 400, "cache_mode");
    expect_refused([&] { parse_sdcpp_img_gen(json::parse(R"({"video_frames": 33})"), lim); }, 400, "video_frames");
    expect_refused([&] { parse_sdcpp_img_gen(json::parse(R"({"vae_tiling_params": {"enabled": true}})"), lim); }, 400, "vae_tiling_params");
    expect_refused([&] { parse_sdcpp_img_gen(json::parse(R"({"sample_params": {"extra_sample_args": "x=1"}})"), lim); }, 400,
                   "sample_params.extra_sample_args");
    expect_refused([&] { parse_sdcpp_img_gen(json::parse(R"({"control_strength": "high"})"), lim); }, 400, "control_strength");
    {
        // sd-server's defaults of those fields pass (a client echoing /sdcpp/v1/capabilities' defaults)
        JobRequest d = parse_sdcpp_img_gen(json::parse(R"({"prompt": "p", "cache_mode": "", "video_frames": 1, "fps": 16,
            "control_strength": 0.9, "ip_adapter_strength": 1.0, "auto_resize_ref_image": true, "increase_ref_index": false,
            "embed_image_metadata": true, "output_compression": 100, "upscale_repeats": 1, "ref_images": [],
            "sample_params": {"sample_steps": 5, "extra_sample_args": "", "guidance": {"slg": {"scale": 0, "layers": [7, 8, 9]}}}})"), lim);
        EXPECT_EQ(d.steps.value_or(0), 5);
    }
    {
        // the OpenAI prompt's <sd_cpp_extra_args> takes the same fields and refuses the same way
        OpenAIRequest o = parse_openai_generation(
            json::parse(R"({"prompt": "a cat <sd_cpp_extra_args>{\"seed\": 9, \"batch_count\": 2}</sd_cpp_extra_args>"})"), lim);
        EXPECT_EQ(o.job.seed, 9);
        EXPECT_EQ(o.job.batch, 2);
        expect_refused([&] { parse_openai_generation(json::parse(R"({"prompt": "x <sd_cpp_extra_args>{\"seeds\": 9}</sd_cpp_extra_args>"})"), lim); },
                       400, "seeds");
        try {
            parse_openai_generation(json::parse(R"({"prompt": "x <sd_cpp_extra_args>{\"sample_params\": {\"sample_step\": 3}}</sd_cpp_extra_args>"})"), lim);
            ADD_FAILURE() << "a misspelt key was accepted";
        } catch (const ApiError& e) {
            EXPECT_NE(std::string(e.what()).find("<sd_cpp_extra_args>'s sample_params"), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find("sample_steps"), std::string::npos) << e.what();  // the fields it takes
        }
    }
    JobRequest e = parse_easel_job(json::parse(R"({"type": "txt2img", "prompt": "q", "steps": 2})"), lim);
    EXPECT_EQ(e.type, "txt2img");
    EXPECT_EQ(e.steps.value_or(0), 2);
    expect_refused([&] { parse_easel_job(json::parse(R"({"type": "video"})"), lim); }, 400, "type");
}

TEST(ServerPreview, ProjMapsLatentChannelsToRgb) {
    // one cell per channel basis vector: RGB = (factor row + 1) / 2 * 255, rounded (A1111's
    // cheap approximation for SD1.x: row 0 = 0.298, 0.207, 0.208; row 3 = -0.184, -0.271, -0.473)
    std::vector<float> lat(4 * 2, 0.0f);  // [4, 1, 2]
    lat[0 * 2 + 0] = 1.0f;                // cell 0: channel 0 = 1
    lat[3 * 2 + 1] = 2.0f;                // cell 1: channel 3 = 2
    auto im = proj_preview(lat, 4, 1, 2);
    ASSERT_TRUE(im);
    ASSERT_EQ(im->pixels.size(), 6u);
    EXPECT_EQ(im->pixels[0], 165);  // (0.298 + 1) / 2 * 255 = 165.495
    EXPECT_EQ(im->pixels[1], 154);  // 153.8925
    EXPECT_EQ(im->pixels[2], 154);  // 154.02
    EXPECT_EQ(im->pixels[3], 81);   // (-0.368 + 1) / 2 * 255 = 80.58
    EXPECT_EQ(im->pixels[4], 58);   // (-0.542 + 1) / 2 * 255 = 58.395
    EXPECT_EQ(im->pixels[5], 7);    // (-0.946 + 1) / 2 * 255 = 6.885
    EXPECT_FALSE(proj_preview(std::vector<float>(16 * 4), 16, 2, 2));  // no factors for 16 channels
}

TEST(ServerRequest, JobIds) {
    EXPECT_TRUE(valid_job_id("job-0123abcd"));
    EXPECT_TRUE(valid_job_id("task(abc)"));
    EXPECT_FALSE(valid_job_id(""));
    EXPECT_FALSE(valid_job_id(".."));
    EXPECT_FALSE(valid_job_id("a/b"));
    EXPECT_FALSE(valid_job_id(std::string(65, 'a')));
}

}  // namespace
