// Requests of the server's APIs parsed into one JobRequest (what the worker runs), with every
// bound checked: OpenAI images (generations JSON, edits multipart), AUTOMATIC1111 txt2img /
// img2img, sd.cpp's native img_gen, and easel's jobs API (an A1111 body plus "type").
//
// The parsers depend on no HTTP library (the fuzz target tests/fuzz/fuzz_server_request.cpp runs
// them on arbitrary bytes): a request they refuse raises ApiError (400 or 413) naming the field.
// Field names and defaults follow the originals; docs/server.md lists them.
#pragma once

#include "server/api_error.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace easel::server {

/// Bounds on what one request may ask for (flags of `easel server`).
struct Limits {
    size_t max_body_bytes = 64u << 20;     ///< --max-body-mib: a request body (JSON or multipart)
    int max_side = 4096;                   ///< --max-side: width / height in pixels
    int max_steps = 150;                   ///< --max-steps
    int max_batch = 16;                    ///< --max-batch: n, batch_size x n_iter, batch_count
    int64_t max_image_pixels = 4096 * 4096;  ///< an uploaded image's width x height
    size_t max_image_bytes = 48u << 20;    ///< an uploaded image's encoded bytes (after base64)
    size_t max_prompt_bytes = 64u << 10;   ///< prompt / negative prompt
};

/// A LoRA named by a structured field (sd.cpp's lora[]), applied as a <lora:name:multiplier> tag.
struct LoraRef {
    std::string name;
    double multiplier = 1.0;
};

/// One job, whatever API it came through. Absent optionals take the server's defaults (its
/// generate flags, then the model family's).
struct JobRequest {
    std::string type = "txt2img";          ///< txt2img | img2img
    std::string prompt, negative_prompt;
    int width = 0, height = 0;             ///< pixels; 0 = default (img2img: the init image's size)
    std::optional<int> steps;
    std::optional<double> cfg_scale;
    std::string sampler, scheduler;        ///< easel names; "" = default
    int64_t seed = -1;                     ///< < 0: drawn when the job is accepted
    int batch = 1;                         ///< images
    std::optional<double> strength;        ///< img2img denoising strength
    std::optional<int> clip_skip;
    std::optional<double> eta;
    std::vector<LoraRef> loras;
    std::vector<uint8_t> init_image;       ///< encoded image bytes as uploaded (img2img)
    std::vector<uint8_t> mask;             ///< encoded mask bytes (in-painting); empty = none
    bool mask_invert = false;              ///< A1111 inpainting_mask_invert: black = repaint
    bool mask_from_alpha = false;          ///< OpenAI edits: transparent pixels = repaint
    int mask_blur = 0;                     ///< A1111 mask_blur: Gaussian blur radius (pixels) before binarising
    std::string force_id;                  ///< A1111 force_task_id: the job id to use
    std::string model_checkpoint;          ///< A1111 override_settings.sd_model_checkpoint ("" = any): must name the loaded model
    nlohmann::json parameters = nlohmann::json::object();  ///< A1111 response `parameters`: the body echoed
    /// A1111 enable_hr and hr_* (txt2img): the hires fix (pipeline/hires.h). hires_strength is
    /// denoising_strength (A1111's txt2img default 0.75); hr_upscaler "" = Latent.
    bool hires = false;
    double hr_scale = 2.0;
    int hr_resize_x = 0, hr_resize_y = 0;
    int hr_steps = 0;                      ///< hr_second_pass_steps (0: steps)
    double hires_strength = 0.75;
    std::string hr_upscaler;

    /// The job without its image bytes (the store keeps those as files).
    nlohmann::json to_json() const;
    /// Inverse of to_json. Throws ApiError(400) for a malformed stored request.
    static JobRequest from_json(const nlohmann::json& j);
};

/// A parsed body: JSON with a bounded size and nesting. Throws ApiError(413) over
/// limits.max_body_bytes, ApiError(400) for malformed JSON (the parser's position named) or a
/// body that is not a JSON object.
nlohmann::json parse_json_body(std::string_view body, const Limits& limits);

/// POST /sdapi/v1/txt2img (img2img = false) and /sdapi/v1/img2img (true): A1111's
/// StableDiffusionProcessing fields (docs/server.md lists the ones that apply and the values
/// refused). Unknown keys are ignored as A1111's pydantic models ignore them.
JobRequest parse_a1111(const nlohmann::json& body, bool img2img, const Limits& limits);

/// POST /easel/v1/jobs: an A1111 body plus "type": "txt2img" | "img2img" (default: img2img
/// when init_images is present).
JobRequest parse_easel_job(const nlohmann::json& body, const Limits& limits);

/// OpenAI images requests: the job and how to answer.
struct OpenAIRequest {
    JobRequest job;
    std::string response_format = "b64_json";  ///< b64_json | url
};

/// POST /v1/images/generations: prompt (required), n, size ("WxH" or "auto"), response_format,
/// output_format (png), model / quality / style / user / background / moderation (accepted),
/// plus sd-server's <sd_cpp_extra_args>{...}</sd_cpp_extra_args> in the prompt (sd.cpp's native
/// fields, as parse_sdcpp_img_gen).
OpenAIRequest parse_openai_generation(const nlohmann::json& body, const Limits& limits);

/// One multipart/form-data part.
struct FormPart {
    std::string name, filename, content_type, content;
};
/// POST /v1/images/edits: image (or image[]; the first is the init image), mask (PNG with alpha:
/// transparent = repaint; without alpha: white = repaint), prompt, n, size, response_format.
OpenAIRequest parse_openai_edit(const std::vector<FormPart>& parts, const Limits& limits);

/// POST /sdcpp/v1/img_gen: sd.cpp's native schema (prompt, negative_prompt, clip_skip, width,
/// height, strength, seed, batch_count, init_image, mask_image, sample_params {scheduler,
/// sample_method, sample_steps, eta, guidance {txt_cfg}}, lora [{path, multiplier}]).
JobRequest parse_sdcpp_img_gen(const nlohmann::json& body, const Limits& limits);

/// Width, height and channels of encoded image bytes (read from the header; nothing decoded),
/// checked against limits. Throws ApiError(400) naming `field` for bytes that are not an image,
/// ApiError(413) for an image over limits.max_image_pixels.
struct ImageShape {
    int width = 0, height = 0, channels = 0;
};
ImageShape check_image(const std::vector<uint8_t>& bytes, const std::string& field, const Limits& limits);

/// A job id: 1 to 64 characters of [A-Za-z0-9_.()-] (A1111 task ids look like "task(abc)").
bool valid_job_id(std::string_view id);

}  // namespace easel::server
