#include "server/http_api.h"

#include "core/error.h"
#include "core/log.h"
#include "easel_version.h"
#include "core/platform.h"
#include "pipeline/hires.h"
#include "pipeline/png_meta.h"
#include "server/base64.h"
#include "server/samplers.h"

#include <httplib.h>

#include <atomic>
#include <filesystem>
#include <ctime>

extern "C" const unsigned char easel_server_page[];
extern "C" const unsigned long easel_server_page_size;

namespace easel::server {

using nlohmann::json;
using namespace std::chrono_literals;

std::string embedded_page() { return std::string((const char*)easel_server_page, easel_server_page_size); }

namespace {

/// A1111's /sdapi/v1/upscalers list: None, Lanczos, Nearest, then the models (model_name "ESRGAN").
nlohmann::json a1111_upscalers(const Service& svc) {
    nlohmann::json a = nlohmann::json::array();
    for (const char* n : {"None", "Lanczos", "Nearest"})
        a.push_back({{"name", n}, {"model_name", nullptr}, {"model_path", nullptr}, {"model_url", nullptr}, {"scale", 4}});
    for (const auto& [f, scale] : svc.upscaler_models())
        a.push_back({{"name", platform::path_utf8(f.stem())}, {"model_name", "ESRGAN"}, {"model_path", platform::path_utf8(f)},
                     {"model_url", nullptr}, {"scale", scale}});
    return a;
}

enum class Api { OpenAI, A1111, Easel, Sdcpp, Page };

Api api_of(const std::string& path) {
    if (path.starts_with("/v1/")) return Api::OpenAI;
    if (path.starts_with("/sdapi/")) return Api::A1111;
    if (path.starts_with("/sdcpp/")) return Api::Sdcpp;
    if (path.starts_with("/easel/")) return Api::Easel;
    return Api::Page;
}

/// The error body in the shape of the API the request came through.
json error_body(Api api, int status, const std::string& field, const std::string& message) {
    switch (api) {
    case Api::OpenAI:  // OpenAI: {"error": {"message", "type", "param", "code"}}
        return {{"error",
                 {{"message", message},
                  {"type", status >= 500 ? "server_error" : "invalid_request_error"},
                  {"param", field.empty() ? json(nullptr) : json(field)},
                  {"code", status == 401 ? json("invalid_api_key") : json(nullptr)}}}};
    case Api::A1111:  // A1111 api_middleware handle_exception: error, detail, body, errors
        return {{"error", status >= 500 ? "RuntimeError" : "HTTPException"},
                {"detail", message},
                {"body", ""},
                {"errors", message},
                {"field", field.empty() ? json(nullptr) : json(field)}};
    default:  // easel / sd.cpp job errors: {"error": {"code", "message"}} (+ field)
        return {{"error",
                 {{"code", status == 401 ? "unauthorized" : status == 404 ? "not_found" : status == 413 ? "too_large"
                                                          : status == 503 ? "unavailable" : status >= 500 ? "server_error"
                                                                                                          : "invalid_request"},
                  {"message", message},
                  {"field", field.empty() ? json(nullptr) : json(field)}}}};
    }
}

void send_json(httplib::Response& res, int status, const json& j) {
    res.status = status;
    res.set_content(j.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void send_error(httplib::Response& res, const std::string& path, int status, const std::string& field, const std::string& message) {
    send_json(res, status, error_body(api_of(path), status, field, message));
    if (status == 503) res.set_header("Retry-After", "10");
    if (status == 401) res.set_header("WWW-Authenticate", "Bearer");
}

int status_of_kind(const std::string& kind) {
    return kind == "invalid input" || kind == "model mismatch" || kind == "unsupported" ? 400 : 500;
}

std::string iso_stamp(double t) {
    const std::time_t tt = (std::time_t)t;
    std::tm tm{};
    gmtime_r(&tt, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y%m%d%H%M%S", &tm);
    return buf;
}

json nullable_time(double t) { return t > 0 ? json((int64_t)t) : json(nullptr); }

/// "64 MiB" / "1536 KiB" / "100 bytes": a byte limit as the flag that sets it counts.
std::string size_words(size_t bytes) {
    if (bytes % (1u << 20) == 0) return fmt::format("{} MiB", bytes >> 20);
    if (bytes % (1u << 10) == 0) return fmt::format("{} KiB", bytes >> 10);
    return fmt::format("{} bytes", bytes);
}

/// The one line of a 413: the body's size when known and the limit, named in bytes and by its flag.
std::string too_large_message(const httplib::Request& req, size_t limit) {
    const std::string len = req.get_header_value("Content-Length");
    return fmt::format("request body {}is over the limit of {} bytes ({}, set by --max-body-mib); send a smaller body",
                       len.empty() ? "" : "of " + len.substr(0, 24) + " bytes ", limit, size_words(limit));
}

bool chunked(const httplib::Request& req) {
    return req.get_header_value("Transfer-Encoding").find("chunked") != std::string::npos;
}

}  // namespace

struct HttpApi::State {
    State(Service& s, HttpOptions o) : svc(s), opt(std::move(o)) {}
    Service& svc;
    HttpOptions opt;
    std::atomic<int> waiters{0}, streams{0};

    const Limits& svc_limits() const { return svc.limits(); }

    /// A request body, read through httplib's ContentReader (every POST / PUT / PATCH / DELETE
    /// route takes one, so httplib never reads a body itself: its own read would keep a chunked
    /// body of any size in memory, cap x-www-form-urlencoded bodies at 8 KiB and wait for a body
    /// the request does not have).
    ///   - no Content-Length and no Transfer-Encoding: the body is empty (RFC 9112 6.3) and
    ///     nothing is read, so the answer (400 for a route that needs a body) comes at once;
    ///   - over --max-body-mib (a Content-Length above it, or a chunked body growing past it):
    ///     ApiError(413) naming the limit; the rest of the body is read and dropped up to twice
    ///     the limit so that the client sees the answer, beyond that the connection is closed;
    ///   - a body that ends early or has malformed chunks: ApiError(400);
    ///   - multipart/form-data: its parts go to `parts` (each part's bytes count against the
    ///     limit); a route passing parts == nullptr refuses multipart with 415.
    /// Any other Content-Type is returned as bytes (the JSON routes parse them as JSON whatever
    /// the type says: `curl -d` sends application/x-www-form-urlencoded).
    std::string read_body(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader,
                          std::vector<FormPart>* parts = nullptr) {
        std::string body;
        if (!req.has_header("Content-Length") && !chunked(req)) return body;
        const size_t limit = svc_limits().max_body_bytes;
        const size_t drain_limit = 2 * limit + (1u << 20);
        size_t total = 0;
        bool over = false, too_many_parts = false;
        auto take = [&](std::string& into, const char* data, size_t n) {
            total += n;
            if (total > limit) over = true;
            if (!over) into.append(data, n);
            return total <= drain_limit;
        };
        bool ok;
        if (req.is_multipart_form_data()) {
            std::vector<FormPart> got;
            std::string ignored;
            ok = reader(
                [&](const httplib::MultipartFormData& h) {
                    if (got.size() >= 64) too_many_parts = true;
                    if (!too_many_parts) got.push_back({h.name, h.filename, h.content_type, ""});
                    return true;
                },
                [&](const char* data, size_t n) { return take(too_many_parts || got.empty() ? ignored : got.back().content, data, n); });
            ignored.clear();
            if (parts) *parts = std::move(got);
        } else {
            ok = reader([&](const char* data, size_t n) { return take(body, data, n); });
        }
        if (over || res.status == 413) {
            if (!ok) res.set_header("Connection", "close");
            refuse(413, "", "{}", too_large_message(req, limit));
        }
        if (!ok) {
            res.set_header("Connection", "close");
            refuse(400, "", "{}", req.is_multipart_form_data() ? "the multipart body is malformed or ends early (check its boundary and Content-Length)"
                                                                : "the request body ends before its Content-Length, or its chunked encoding is malformed");
        }
        if (too_many_parts) refuse(400, "", "the multipart body has more than 64 parts");
        if (req.is_multipart_form_data() && !parts)
            refuse(415, "", "{} takes a JSON body (Content-Type: application/json), not multipart/form-data", req.path.substr(0, 128));
        return body;
    }

    /// A route whose handler gets the body read by read_body (a JSON route: multipart refused).
    httplib::Server::HandlerWithContentReader with_body(std::function<void(const httplib::Request&, httplib::Response&, const std::string&)> h) {
        return [this, h = std::move(h)](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
            guarded(req, res, [&] {
                const std::string body = read_body(req, res, reader);
                h(req, res, body);
            });
        };
    }

    /// Runs a handler, turning every exception into an error body.
    template <class F>
    void guarded(const httplib::Request& req, httplib::Response& res, F&& f) {
        try {
            f();
        } catch (const ApiError& e) {
            send_error(res, req.path, e.status(), e.field(), e.what());
        } catch (const Error& e) {
            send_error(res, req.path, status_of_kind(error_kind_name(e.kind())), "", e.what());
        } catch (const std::bad_alloc&) {
            send_error(res, req.path, 503, "", "out of memory while handling the request; send a smaller request");
        } catch (const std::exception& e) {
            send_error(res, req.path, 500, "", std::string("internal error: ") + e.what());
        }
    }

    /// Submits and waits for the job (the synchronous APIs). Throws ApiError when it fails.
    JobRecord run_sync(JobRequest jr) {
        if (waiters.fetch_add(1) >= opt.max_sync_waiters) {
            waiters.fetch_sub(1);
            refuse(503, "", "{} requests are waiting for their images already; try again later", opt.max_sync_waiters);
        }
        struct Release {
            std::atomic<int>& w;
            ~Release() { w.fetch_sub(1); }
        } release{waiters};
        const std::string id = svc.submit(std::move(jr));
        auto rec = svc.wait(id, 24h);
        if (!rec) refuse(500, "", "job {} vanished", id);
        if (rec->state == kFailed) refuse(status_of_kind(rec->result.value("error_kind", "")), "", "{}", rec->error);
        if (rec->state == kCancelled) refuse(409, "", "job {} was cancelled", id);
        if (rec->state != kDone) refuse(503, "", "the server is stopping; job {} is kept and resumes at the next start", id);
        return *rec;
    }

    std::vector<std::string> images_b64(const JobRecord& rec) {
        std::vector<std::string> out;
        const size_t n = rec.result.contains("images") ? rec.result["images"].size() : 0;
        for (size_t i = 0; i < n; ++i) out.push_back(base64_encode(svc.image_bytes(rec, i)));
        return out;
    }

    /// A1111's `info`: Processed.js() of modules/processing.py, from the job and its infotexts.
    json a1111_info(const JobRecord& rec) {
        const JobRequest& r = rec.request;
        const json& res = rec.result;
        json infotexts = res.value("infotexts", json::array());
        pipeline::Infotext it = pipeline::parse_infotext(infotexts.empty() ? "" : infotexts[0].get<std::string>());
        json seeds = res.value("seeds", json::array());
        const int n = (int)seeds.size();
        const int64_t seed = n ? seeds[0].get<int64_t>() : r.seed;
        auto num = [&](const char* k, double dflt) { return it.number(k).value_or(dflt); };
        json prompts = json::array(), negs = json::array();
        for (int i = 0; i < n; ++i) {
            prompts.push_back(r.prompt);
            negs.push_back(r.negative_prompt);
        }
        return {{"prompt", r.prompt},
                {"all_prompts", prompts},
                {"negative_prompt", r.negative_prompt},
                {"all_negative_prompts", negs},
                {"seed", seed},
                {"all_seeds", seeds},
                {"subseed", seed},
                {"all_subseeds", seeds},
                {"subseed_strength", 0},
                {"width", res.value("width", r.width)},
                {"height", res.value("height", r.height)},
                {"sampler_name", it.get("Sampler").value_or("")},
                {"cfg_scale", num("CFG scale", r.cfg_scale.value_or(0))},
                {"steps", (int)num("Steps", res.value("steps", 0))},
                {"batch_size", n},
                {"restore_faces", false},
                {"face_restoration_model", nullptr},
                {"sd_model_name", svc.model_name()},
                {"sd_model_hash", nullptr},
                {"sd_vae_name", nullptr},
                {"sd_vae_hash", nullptr},
                {"seed_resize_from_w", -1},
                {"seed_resize_from_h", -1},
                {"denoising_strength", it.number("Denoising strength") ? json(*it.number("Denoising strength")) : json(nullptr)},
                {"extra_generation_params", json::object()},
                {"index_of_first_image", 0},
                {"infotexts", infotexts},
                {"styles", json::array()},
                {"job_timestamp", iso_stamp(rec.started)},
                {"clip_skip", (int)num("Clip skip", 1)},
                {"is_using_inpainting_conditioning", false},
                {"version", std::string("easel ") + EASEL_VERSION}};
    }

    /// easel's job view.
    json job_view(const JobRecord& rec, bool with_images) {
        json j = {{"id", rec.id},
                  {"type", rec.request.type},
                  {"state", rec.state},
                  {"created", rec.created},
                  {"started", rec.started > 0 ? json(rec.started) : json(nullptr)},
                  {"finished", rec.finished > 0 ? json(rec.finished) : json(nullptr)},
                  {"step", 0},
                  {"steps", rec.request.steps ? json(*rec.request.steps) : json(nullptr)},
                  {"image", 0},
                  {"images_total", rec.request.batch},
                  {"eta", nullptr},
                  {"progress", rec.state == kDone ? 1.0 : 0.0},
                  {"queue_position", svc.queue_position(rec.id)},
                  {"error", rec.error.empty() ? json(nullptr) : json(rec.error)},
                  {"request", rec.request.to_json()}};
        if (rec.state == kRunning) {
            const LiveState l = svc.live();
            if (l.id == rec.id) {
                j["step"] = l.step;
                j["steps"] = l.steps;
                j["image"] = l.image;
                j["eta"] = l.eta;
                j["progress"] = l.progress;
                j["preview_step"] = l.preview_step;
            }
        }
        if (rec.state == kDone) {
            j["steps"] = rec.result.value("steps", 0);
            j["step"] = rec.result.value("steps", 0);
            j["eta"] = 0;
            j["interrupted"] = rec.result.value("interrupted", false);
            j["inpainting"] = rec.result.value("inpainting", false);
            j["infotexts"] = rec.result.value("infotexts", json::array());
            j["seeds"] = rec.result.value("seeds", json::array());
            j["width"] = rec.result.value("width", 0);
            j["height"] = rec.result.value("height", 0);
            j["seconds"] = rec.result.value("seconds", 0.0);
            j["timings"] = rec.result.value("timings", json::object());
            json urls = json::array();
            for (size_t i = 0; i < rec.result.value("images", json::array()).size(); ++i)
                urls.push_back(fmt::format("/easel/v1/jobs/{}/images/{}", rec.id, i));
            j["image_urls"] = urls;
            j["images"] = with_images ? json(images_b64(rec)) : json::array();
            j["info"] = a1111_info(rec).dump();
        } else {
            j["images"] = json::array();
        }
        return j;
    }

    /// sd.cpp's job view (examples/server api.md: id, kind, status, created, started, completed,
    /// queue_position, result, error).
    json sdcpp_view(const JobRecord& rec) {
        static const std::map<std::string, std::string> status = {
            {kQueued, "queued"}, {kRunning, "generating"}, {kDone, "completed"}, {kFailed, "failed"}, {kCancelled, "cancelled"}};
        json j = {{"id", rec.id},
                  {"kind", "img_gen"},
                  {"status", status.at(rec.state)},
                  {"created", (int64_t)rec.created},
                  {"started", nullable_time(rec.started)},
                  {"completed", nullable_time(rec.finished)},
                  {"queue_position", std::max(0, svc.queue_position(rec.id))},
                  {"result", nullptr},
                  {"error", nullptr}};
        if (rec.state == kDone) {
            json images = json::array();
            auto b64 = images_b64(rec);
            for (size_t i = 0; i < b64.size(); ++i) images.push_back({{"index", i}, {"b64_json", b64[i]}});
            j["result"] = {{"output_format", "png"}, {"images", images}};
        } else if (rec.state == kFailed) {
            j["error"] = {{"code", "generation_failed"}, {"message", rec.error}};
        } else if (rec.state == kCancelled) {
            j["error"] = {{"code", "cancelled"}, {"message", rec.error}};
        }
        return j;
    }

    JobRecord job_or_404(const std::string& id) {
        if (!valid_job_id(id)) refuse(404, "id", "no job {}", id.substr(0, 64));
        auto rec = svc.get(id);
        if (!rec) refuse(404, "id", "no job {}", id);
        return *rec;
    }

    json options() {
        return {{"sd_model_checkpoint", svc.model_title()},
                {"sd_checkpoint_hash", nullptr},
                {"sd_vae", "Automatic"},
                {"samples_format", "png"},
                {"CLIP_stop_at_last_layers", std::max(1, svc.default_clip_skip())},
                {"show_progress_every_n_steps", svc.preview_interval()},
                {"live_previews_enable", true},
                {"eta_noise_seed_delta", 0},
                {"randn_source", svc.defaults().rng == "cpu" ? "CPU" : svc.defaults().rng == "cuda" ? "NV" : "GPU"}};
    }

    json progress(bool skip_image) {
        const LiveState l = svc.live();
        json state = {{"skipped", false},
                      {"interrupted", l.interrupted},
                      {"stopping_generation", false},
                      {"job", l.id.empty() ? "" : "scripts_txt2img"},
                      {"job_count", l.id.empty() ? 0 : l.images},
                      {"job_timestamp", l.id.empty() ? "0" : iso_stamp(l.started)},
                      {"job_no", l.image},
                      {"sampling_step", l.step},
                      {"sampling_steps", l.steps}};
        json j = {{"progress", l.id.empty() ? 0.0 : std::max(0.01, l.progress)},
                  {"eta_relative", l.id.empty() ? 0.0 : l.eta},
                  {"state", state},
                  {"current_image", nullptr},
                  {"textinfo", nullptr},
                  {"current_task", l.id.empty() ? json(nullptr) : json(l.id)}};
        if (!skip_image && !l.preview_png.empty()) j["current_image"] = base64_encode(l.preview_png);
        return j;
    }
};

HttpApi::~HttpApi() = default;

HttpApi::HttpApi(httplib::Server& svr, Service& service, HttpOptions opt) : st_(std::make_unique<State>(service, std::move(opt))) {
    State* st = st_.get();
    Service& svc = service;
    const int threads = std::max(4, st->opt.threads);
    svr.new_task_queue = [threads] { return new httplib::ThreadPool((size_t)threads); };
    // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, with which a second server on the
    // same port would start and silently share the connections instead of being refused
    svr.set_socket_options([](socket_t sock) {
        int yes = 1;
        setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, reinterpret_cast<const void*>(&yes), sizeof(yes));
    });
    svr.set_read_timeout(st->opt.read_timeout_s, 0);
    svr.set_write_timeout(st->opt.read_timeout_s, 0);
    svr.set_keep_alive_max_count(100);
    svr.set_keep_alive_timeout(5);

    // --api-key: every API route needs "Authorization: Bearer KEY" (the page itself does not)
    svr.set_pre_routing_handler([st](const httplib::Request& req, httplib::Response& res) {
        if (st->opt.api_key.empty() || api_of(req.path) == Api::Page) return httplib::Server::HandlerResponse::Unhandled;
        const std::string want = "Bearer " + st->opt.api_key;
        const std::string got = req.get_header_value("Authorization");
        unsigned diff = got.size() != want.size();
        for (size_t i = 0; i < want.size(); ++i) diff |= (unsigned)(want[i] ^ (i < got.size() ? got[i] : 0));
        if (diff == 0) return httplib::Server::HandlerResponse::Unhandled;
        send_error(res, req.path, 401, "Authorization", "this server needs an API key: send the header Authorization: Bearer <key>");
        // the body (if any) is left unread: the connection cannot carry another request
        if (chunked(req) || (req.has_header("Content-Length") && req.get_header_value("Content-Length") != "0")) res.set_header("Connection", "close");
        return httplib::Server::HandlerResponse::Handled;
    });
    // errors httplib answers itself (413 over the body limit, 400 malformed request, 404 no route): a JSON body
    svr.set_error_handler([st](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return;
        std::string m = res.status == 404 ? "no such route: " + req.method + " " + req.path.substr(0, 128)
                        : res.status == 413 ? too_large_message(req, st->svc_limits().max_body_bytes)
                                            : "malformed request (HTTP " + std::to_string(res.status) + ")";
        const int status = res.status;
        send_json(res, status, error_body(api_of(req.path), status, "", m));
    });
    svr.set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
        std::string m = "internal error";
        try {
            if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& e) {
            m += std::string(": ") + e.what();
        } catch (...) {
        }
        send_json(res, 500, error_body(api_of(req.path), 500, "", m));
    });

    // ---- the page
    svr.Get("/", [st](const httplib::Request&, httplib::Response& res) {
        res.set_header("Cache-Control", "no-store");
        res.set_header("Content-Security-Policy", "default-src 'self' data: blob:; style-src 'self' 'unsafe-inline'; script-src 'self' 'unsafe-inline'");
        res.set_content(st->opt.html, "text/html; charset=utf-8");
    });

    svr.Get("/favicon.ico", [](const httplib::Request&, httplib::Response& res) { res.status = 204; });

    // ---- OpenAI
    svr.Get("/v1/models", [st, &svc](const httplib::Request& req, httplib::Response& res) {
        st->guarded(req, res, [&] {
            send_json(res, 200, {{"object", "list"}, {"data", json::array({{{"id", svc.model_name()}, {"object", "model"}, {"created", 0}, {"owned_by", "easel"}}})}});
        });
    });
    auto openai_answer = [st](const httplib::Request& req, httplib::Response& res, const OpenAIRequest& o, const JobRecord& rec) {
        json data = json::array();
        const size_t n = rec.result.value("images", json::array()).size();
        for (size_t i = 0; i < n; ++i) {
            if (o.response_format == "url") {
                std::string host = req.get_header_value("Host");
                if (host.empty()) host = req.local_addr + ":" + std::to_string(req.local_port);
                data.push_back({{"url", fmt::format("http://{}/easel/v1/jobs/{}/images/{}", host, rec.id, i)}});
            } else {
                data.push_back({{"b64_json", base64_encode(st->svc.image_bytes(rec, i))}});
            }
        }
        send_json(res, 200, {{"created", (int64_t)std::time(nullptr)}, {"data", data}, {"output_format", "png"},
                             {"size", fmt::format("{}x{}", rec.result.value("width", 0), rec.result.value("height", 0))}});
    };
    svr.Post("/v1/images/generations", st->with_body([st, openai_answer](const httplib::Request& req, httplib::Response& res, const std::string& body) {
        OpenAIRequest o = parse_openai_generation(parse_json_body(body, st->svc_limits()), st->svc_limits());
        JobRecord rec = st->run_sync(o.job);
        openai_answer(req, res, o, rec);
    }));
    svr.Post("/v1/images/edits", [st, openai_answer](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
        st->guarded(req, res, [&] {
            std::vector<FormPart> parts;
            st->read_body(req, res, reader, &parts);
            if (!req.is_multipart_form_data())
                refuse(400, "", "/v1/images/edits takes multipart/form-data (image, mask, prompt, n, size, response_format)");
            OpenAIRequest o = parse_openai_edit(parts, st->svc_limits());
            JobRecord rec = st->run_sync(o.job);
            openai_answer(req, res, o, rec);
        });
    });

    // ---- AUTOMATIC1111
    auto a1111_generate = [st](bool img2img) {
        return st->with_body([st, img2img](const httplib::Request&, httplib::Response& res, const std::string& text) {
            const json body = parse_json_body(text, st->svc_limits());
            JobRequest jr = parse_a1111(body, img2img, st->svc_limits());
            json parameters = jr.parameters;
            const bool send_images = !body.contains("send_images") || !body["send_images"].is_boolean() || body["send_images"].get<bool>();
            JobRecord rec = st->run_sync(std::move(jr));
            send_json(res, 200, {{"images", send_images ? json(st->images_b64(rec)) : json::array()},
                                 {"parameters", parameters},
                                 {"info", st->a1111_info(rec).dump()}});
        });
    };
    svr.Post("/sdapi/v1/txt2img", a1111_generate(false));
    svr.Post("/sdapi/v1/img2img", a1111_generate(true));
    svr.Get("/sdapi/v1/progress", [st](const httplib::Request& req, httplib::Response& res) {
        st->guarded(req, res, [&] {
            const std::string skip = req.get_param_value("skip_current_image");
            send_json(res, 200, st->progress(skip == "true" || skip == "True" || skip == "1"));
        });
    });
    // interrupt and skip take no body (one sent is read and ignored)
    svr.Post("/sdapi/v1/interrupt", st->with_body([st](const httplib::Request&, httplib::Response& res, const std::string&) {
        st->svc.interrupt();
        send_json(res, 200, json::object());
    }));
    svr.Post("/sdapi/v1/skip", st->with_body([st](const httplib::Request&, httplib::Response& res, const std::string&) {
        st->svc.interrupt();
        send_json(res, 200, json::object());
    }));
    svr.Get("/sdapi/v1/options", [st](const httplib::Request& req, httplib::Response& res) {
        st->guarded(req, res, [&] { send_json(res, 200, st->options()); });
    });
    svr.Post("/sdapi/v1/options", st->with_body([st](const httplib::Request&, httplib::Response& res, const std::string& text) {
        {
            const json body = parse_json_body(text, st->svc_limits());
            for (auto it = body.begin(); it != body.end(); ++it) {
                const std::string& k = it.key();
                const json& v = it.value();
                if (k == "sd_model_checkpoint") {
                    if (!v.is_string()) refuse(400, k, "{} must be a string", k);
                    const std::string c = v.get<std::string>();
                    if (c != st->svc.model_title() && c != st->svc.model_name() && !c.starts_with(st->svc.model_title() + " ["))
                        refuse(400, k, "model \"{}\" not found: easel serves {} only", c.substr(0, 128), st->svc.model_title());
                } else if (k == "CLIP_stop_at_last_layers") {
                    if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > 12) refuse(400, k, "{} must be an integer 1 to 12", k);
                } else if (k == "show_progress_every_n_steps") {
                    if (!v.is_number_integer() || v.get<int64_t>() < -1 || v.get<int64_t>() > 1000)
                        refuse(400, k, "{} must be an integer -1 to 1000", k);
                } else if (k == "samples_format") {
                    if (v != "png") refuse(400, k, "{} {} is not supported: easel writes PNG", k, v.dump().substr(0, 32));
                } else if (k == "sd_vae") {
                    if (v != "Automatic" && v != "None") refuse(400, k, "{} is the server's --vae; send Automatic", k);
                } else {
                    refuse(400, k.substr(0, 64), "option {} is not one easel applies (it applies sd_model_checkpoint, CLIP_stop_at_last_layers, "
                           "show_progress_every_n_steps, samples_format png, sd_vae Automatic)", k.substr(0, 64));
                }
            }
            if (body.contains("CLIP_stop_at_last_layers")) st->svc.set_default_clip_skip((int)body["CLIP_stop_at_last_layers"].get<int64_t>());
            if (body.contains("show_progress_every_n_steps")) st->svc.set_preview_interval(std::max<int>(1, (int)body["show_progress_every_n_steps"].get<int64_t>()));
            send_json(res, 200, nullptr);
        }
    }));
    svr.Get("/sdapi/v1/samplers", [st](const httplib::Request& req, httplib::Response& res) {
        st->guarded(req, res, [&] {
            json a = json::array();
            for (const auto& e : sampler_entries()) a.push_back({{"name", e.name}, {"aliases", e.aliases}, {"options", json::object()}});
            send_json(res, 200, a);
        });
    });
    svr.Get("/sdapi/v1/schedulers", [st](const httplib::Request& req, httplib::Response& res) {
        st->guarded(req, res, [&] {
            json a = json::array();
            for (const auto& e : scheduler_entries())
                a.push_back({{"name", e.name}, {"label", e.label}, {"aliases", nullptr},
                             {"default_rho", e.default_rho ? json(*e.default_rho) : json(-1)}, {"need_inner_model", false}});
            send_json(res, 200, a);
        });
    });
    svr.Get("/sdapi/v1/sd-models", [st](const httplib::Request& req, httplib::Response& res) {
        st->guarded(req, res, [&] {
            const auto& b = st->svc.defaults();
            std::string file = !b.model.empty() ? b.model : !b.diffusion_model.empty() ? b.diffusion_model : pipeline::find_demo_model();
            send_json(res, 200, json::array({{{"title", st->svc.model_title()}, {"model_name", st->svc.model_name()}, {"hash", nullptr},
                                               {"sha256", nullptr}, {"filename", file}, {"config", nullptr}}}));
        });
    });
    svr.Get("/sdapi/v1/loras", [st](const httplib::Request& req, httplib::Response& res) {
        st->guarded(req, res, [&] {
            json a = json::array();
            for (const auto& l : st->svc.loras()) a.push_back({{"name", l.name}, {"alias", l.name}, {"path", l.path}, {"metadata", json::object()}});
            send_json(res, 200, a);
        });
    });
    svr.Get("/sdapi/v1/upscalers", [st](const httplib::Request& req, httplib::Response& res) {
        st->guarded(req, res, [&] {
            send_json(res, 200, a1111_upscalers(st->svc));
        });
    });
    svr.Get("/sdapi/v1/latent-upscale-modes", [st](const httplib::Request& req, httplib::Response& res) {
        st->guarded(req, res, [&] {
            json a = json::array();
            for (const auto& n : pipeline::builtin_hires_upscalers())
                if (n.rfind("Latent", 0) == 0) a.push_back({{"name", n}});
            send_json(res, 200, a);
        });
    });

    // ---- easel jobs API (and sd.cpp's names for it)
    svr.Post("/easel/v1/jobs", st->with_body([st](const httplib::Request&, httplib::Response& res, const std::string& body) {
        const std::string id = st->svc.submit(parse_easel_job(parse_json_body(body, st->svc_limits()), st->svc_limits()));
        res.set_header("Location", "/easel/v1/jobs/" + id);
        send_json(res, 202, st->job_view(*st->svc.get(id), false));
    }));
    svr.Get("/easel/v1/jobs", [st](const httplib::Request& req, httplib::Response& res) {
        st->guarded(req, res, [&] {
            int recent = 50;
            if (req.has_param("recent")) {
                const std::string v = req.get_param_value("recent");
                if (v.empty() || v.size() > 4 || v.find_first_not_of("0123456789") != std::string::npos)
                    refuse(400, "recent", "recent must be an integer 0 to 1000");
                recent = std::min(1000, std::stoi(v));
            }
            json a = json::array();
            for (const auto& r : st->svc.jobs(recent)) a.push_back(st->job_view(r, false));
            send_json(res, 200, {{"jobs", a}, {"max_queue", st->svc.max_queue()}});
        });
    });
    svr.Get(R"(/easel/v1/jobs/([^/]+))", [st](const httplib::Request& req, httplib::Response& res) {
        st->guarded(req, res, [&] { send_json(res, 200, st->job_view(st->job_or_404(req.matches[1]), req.get_param_value("images") != "false")); });
    });
    auto cancel = [st](bool sdcpp) {  // takes no body (one sent is read and ignored)
        return st->with_body([st, sdcpp](const httplib::Request& req, httplib::Response& res, const std::string&) {
            JobRecord rec = st->job_or_404(req.matches[1]);
            if (!st->svc.cancel(rec.id)) refuse(409, "id", "job {} has ended ({}); nothing to cancel", rec.id, rec.state);
            rec = *st->svc.get(rec.id);
            send_json(res, 200, sdcpp ? st->sdcpp_view(rec) : st->job_view(rec, false));
        });
    };
    svr.Post(R"(/easel/v1/jobs/([^/]+)/cancel)", cancel(false));
    svr.Get(R"(/easel/v1/jobs/([^/]+)/images/([0-9]{1,4}))", [st](const httplib::Request& req, httplib::Response& res) {
        st->guarded(req, res, [&] {
            JobRecord rec = st->job_or_404(req.matches[1]);
            auto png = st->svc.image_bytes(rec, (size_t)std::stoi(req.matches[2]));
            if (png.empty()) refuse(404, "index", "job {} has no image {} (state {})", rec.id, std::string(req.matches[2]), rec.state);
            res.set_header("Cache-Control", "max-age=31536000, immutable");
            res.set_content(std::string(png.begin(), png.end()), "image/png");
        });
    });
    svr.Get(R"(/easel/v1/jobs/([^/]+)/preview)", [st](const httplib::Request& req, httplib::Response& res) {
        st->guarded(req, res, [&] {
            JobRecord rec = st->job_or_404(req.matches[1]);
            const LiveState l = st->svc.live();
            if (l.id != rec.id || l.preview_png.empty()) refuse(404, "id", "job {} has no live preview now", rec.id);
            res.set_header("Cache-Control", "no-store");
            res.set_content(std::string(l.preview_png.begin(), l.preview_png.end()), "image/png");
        });
    });
    // server-sent events: "progress" on every step (with the preview when it changed), "done" at the end
    svr.Get(R"(/easel/v1/jobs/([^/]+)/events)", [st](const httplib::Request& req, httplib::Response& res) {
        st->guarded(req, res, [&] {
            const JobRecord rec0 = st->job_or_404(req.matches[1]);
            if (st->streams.fetch_add(1) >= st->opt.max_streams) {
                st->streams.fetch_sub(1);
                refuse(503, "", "{} event streams are open already; poll GET /easel/v1/jobs/{} instead", st->opt.max_streams, rec0.id);
            }
            struct Ctx {
                std::string id;
                uint64_t seen = 0;
                int last_preview = -1;
                bool ended = false;
                std::chrono::steady_clock::time_point last_write = std::chrono::steady_clock::now();
            };
            auto ctx = std::make_shared<Ctx>();
            ctx->id = rec0.id;
            res.set_header("Cache-Control", "no-store");
            res.set_header("X-Accel-Buffering", "no");
            res.set_chunked_content_provider(
                "text/event-stream",
                [st, ctx](size_t, httplib::DataSink& sink) -> bool {
                    if (ctx->ended || st->svc.stopping()) {
                        sink.done();
                        return true;
                    }
                    const uint64_t v = st->svc.wait_change(ctx->seen, 1000ms);
                    if (!sink.is_writable()) return false;
                    auto rec = st->svc.get(ctx->id);
                    if (!rec) {
                        sink.done();
                        return true;
                    }
                    std::string out;
                    if (v != ctx->seen || ctx->seen == 0) {
                        ctx->seen = v;
                        json j = st->job_view(*rec, false);
                        const LiveState l = st->svc.live();
                        if (l.id == rec->id && l.preview_step != ctx->last_preview && !l.preview_png.empty()) {
                            ctx->last_preview = l.preview_step;
                            j["preview"] = "data:image/png;base64," + base64_encode(l.preview_png);
                        }
                        const bool end = rec->state == kDone || rec->state == kFailed || rec->state == kCancelled;
                        out = fmt::format("event: {}\ndata: {}\n\n", end ? "done" : "progress", j.dump(-1, ' ', false, json::error_handler_t::replace));
                        ctx->ended = end;
                    } else if (std::chrono::steady_clock::now() - ctx->last_write > 15s) {
                        out = ": keep-alive\n\n";
                    }
                    if (!out.empty()) {
                        ctx->last_write = std::chrono::steady_clock::now();
                        if (!sink.write(out.data(), out.size())) return false;
                    }
                    return true;
                },
                [st](bool) { st->streams.fetch_sub(1); });
        });
    });
    svr.Get("/easel/v1/info", [st](const httplib::Request& req, httplib::Response& res) {
        st->guarded(req, res, [&] {
            const auto& d = st->svc.defaults();
            json samplers = json::array(), schedulers = json::array(), loras = json::array();
            for (const auto& e : sampler_entries()) samplers.push_back({{"name", e.name}, {"method", e.method}});
            for (const auto& e : scheduler_entries()) schedulers.push_back({{"name", e.name}, {"label", e.label}});
            for (const auto& l : st->svc.loras()) loras.push_back({{"name", l.name}, {"path", l.path}});
            send_json(res, 200, {{"model", st->svc.model_title()},
                                 {"version", EASEL_VERSION},
                                 {"defaults", {{"width", d.width}, {"height", d.height}, {"steps", d.steps_given ? json(d.steps) : json(nullptr)},
                                               {"cfg_scale", d.cfg_scale_given ? json(d.cfg_scale) : json(nullptr)}, {"seed", d.seed},
                                               {"sampler", d.sampling_method}, {"scheduler", d.scheduler}, {"strength", d.strength}}},
                                 {"samplers", samplers},
                                 {"schedulers", schedulers},
                                 {"loras", loras},
                                 {"limits", {{"max_side", st->svc_limits().max_side}, {"max_steps", st->svc_limits().max_steps},
                                             {"max_batch", st->svc_limits().max_batch}, {"max_queue", st->svc.max_queue()}}}});
        });
    });
    // sd.cpp: /sdcpp/v1/img_gen, /sdcpp/v1/jobs/{id}, /sdcpp/v1/jobs/{id}/cancel, /sdcpp/v1/capabilities
    svr.Post("/sdcpp/v1/img_gen", st->with_body([st](const httplib::Request&, httplib::Response& res, const std::string& body) {
        const std::string id = st->svc.submit(parse_sdcpp_img_gen(parse_json_body(body, st->svc_limits()), st->svc_limits()));
        JobRecord rec = *st->svc.get(id);
        send_json(res, 202, {{"id", id}, {"kind", "img_gen"}, {"status", "queued"}, {"created", (int64_t)rec.created},
                             {"poll_url", "/sdcpp/v1/jobs/" + id}});
    }));
    svr.Get(R"(/sdcpp/v1/jobs/([^/]+))", [st](const httplib::Request& req, httplib::Response& res) {
        st->guarded(req, res, [&] { send_json(res, 200, st->sdcpp_view(st->job_or_404(req.matches[1]))); });
    });
    svr.Post(R"(/sdcpp/v1/jobs/([^/]+)/cancel)", cancel(true));
    svr.Get("/sdcpp/v1/capabilities", [st](const httplib::Request& req, httplib::Response& res) {
        st->guarded(req, res, [&] {
            const auto& d = st->svc.defaults();
            const Limits& lim = st->svc_limits();
            json samplers = json::array(), schedulers = json::array(), loras = json::array();
            for (const auto& e : sampler_entries()) samplers.push_back(e.method);
            for (const auto& e : scheduler_entries())
                if (!e.method.empty() && std::find(schedulers.begin(), schedulers.end(), json(e.method)) == schedulers.end()) schedulers.push_back(e.method);
            for (const auto& l : st->svc.loras()) loras.push_back({{"name", l.name}, {"path", l.path}});
            json defaults = {{"prompt", d.prompt}, {"negative_prompt", d.negative_prompt}, {"clip_skip", d.clip_skip}, {"width", d.width},
                             {"height", d.height}, {"strength", d.strength}, {"seed", d.seed}, {"batch_count", 1},
                             {"sample_params", {{"scheduler", d.scheduler}, {"sample_method", d.sampling_method}, {"sample_steps", d.steps},
                                                {"eta", nullptr}, {"shifted_timestep", 0}, {"flow_shift", nullptr},
                                                {"guidance", {{"txt_cfg", d.cfg_scale}, {"img_cfg", nullptr}, {"distilled_guidance", d.guidance}}}}},
                             {"output_format", "png"}, {"output_compression", 100}};
            json features = {{"init_image", true}, {"mask_image", true}, {"control_image", false}, {"ip_adapter_image", false},
                             {"ref_images", false}, {"lora", !loras.empty()}, {"vae_tiling", false}, {"hires", true}, {"cache", false},
                             {"cancel_queued", true}, {"cancel_generating", true}};
            send_json(res, 200, {{"model", {{"name", st->svc.model_title()}, {"stem", st->svc.model_name()}, {"path", d.model}}},
                                 {"current_mode", "img_gen"},
                                 {"supported_modes", {"img_gen"}},
                                 {"defaults", defaults},
                                 {"output_formats", {"png"}},
                                 {"features", features},
                                 {"defaults_by_mode", {{"img_gen", defaults}}},
                                 {"output_formats_by_mode", {{"img_gen", {"png"}}}},
                                 {"features_by_mode", {{"img_gen", features}}},
                                 {"samplers", samplers},
                                 {"schedulers", schedulers},
                                 {"loras", loras},
                                 {"upscalers", [&] {
                                      json u = json::array();
                                      for (const auto& n : pipeline::builtin_hires_upscalers()) u.push_back({{"name", n}, {"builtin", true}});
                                      for (const auto& [f, scale] : st->svc.upscaler_models())
                                          u.push_back({{"name", platform::path_utf8(f.stem())}, {"builtin", false}, {"scale", scale}});
                                      return u;
                                  }()},
                                 {"limits", {{"min_width", 8}, {"max_width", lim.max_side}, {"min_height", 8}, {"max_height", lim.max_side},
                                             {"max_batch_count", lim.max_batch}, {"max_queue_size", st->svc.max_queue()}}}});
        });
    });
    // every other POST / PUT / PATCH / DELETE: its body read (bounded) by read_body, then 404;
    // registered last, after every route above
    auto no_route = st->with_body([](const httplib::Request& req, httplib::Response&, const std::string&) {
        refuse(404, "", "no such route: {} {}", req.method, req.path.substr(0, 128));
    });
    svr.Post(".*", no_route);
    svr.Put(".*", no_route);
    svr.Patch(".*", no_route);
    svr.Delete(".*", no_route);
    svr.set_payload_max_length(st->svc_limits().max_body_bytes);
}

}  // namespace easel::server
