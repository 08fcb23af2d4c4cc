#include "server/service.h"

#include "core/error.h"
#include "core/log.h"
#include "core/platform.h"
#include "core/strings.h"
#include "models/family.h"
#include "models/flux/flux2_klein.h"
#include "pipeline/hires.h"
#include "pipeline/png_meta.h"
#include "pipeline/upscale.h"
#include "pipeline/stages.h"
#include "sampling/sampler.h"
#include "text/prompt_syntax.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>

namespace easel::server {

namespace fs = std::filesystem;
using nlohmann::json;
using pipeline::Image;

namespace {

/// Thrown from the step hook to leave a job (cancel, stop); the step's checkpoint is on disk.
struct JobAborted : std::exception {
    const char* what() const noexcept override { return "job aborted"; }
};

double now_s() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string new_job_id() {
    static std::mutex mu;
    static std::mt19937_64 rng{std::random_device{}() ^ (uint64_t)std::chrono::steady_clock::now().time_since_epoch().count()};
    std::lock_guard lk(mu);
    return fmt::format("job-{:016x}", rng());
}

bool terminal(const std::string& state) { return state == kDone || state == kFailed || state == kCancelled; }

/// Separable Gaussian blur of a one-channel image, standard deviation `sigma` pixels (PIL's
/// GaussianBlur(radius) takes the radius as the standard deviation), kernel cut at 3 sigma,
/// edges clamped.
void gaussian_blur(Image& m, double sigma) {
    if (sigma <= 0 || m.channels != 1) return;
    const int r = (int)std::ceil(3 * sigma);
    std::vector<double> k((size_t)(2 * r + 1));
    double sum = 0;
    for (int i = -r; i <= r; ++i) sum += k[(size_t)(i + r)] = std::exp(-0.5 * i * i / (sigma * sigma));
    for (auto& v : k) v /= sum;
    const int W = m.width, H = m.height;
    std::vector<double> tmp((size_t)W * H);
    for (int y = 0; y < H; ++y)
        for (int x = 0; x < W; ++x) {
            double a = 0;
            for (int i = -r; i <= r; ++i) a += k[(size_t)(i + r)] * m.pixels[(size_t)y * W + std::clamp(x + i, 0, W - 1)];
            tmp[(size_t)y * W + x] = a;
        }
    for (int y = 0; y < H; ++y)
        for (int x = 0; x < W; ++x) {
            double a = 0;
            for (int i = -r; i <= r; ++i) a += k[(size_t)(i + r)] * tmp[(size_t)std::clamp(y + i, 0, H - 1) * W + x];
            m.pixels[(size_t)y * W + x] = (uint8_t)std::clamp((int)std::lround(a), 0, 255);
        }
}

Image resized(const Image& im, int w, int h) {
    if (im.width == w && im.height == h) return im;
    Image r;
    r.width = w;
    r.height = h;
    r.channels = im.channels;
    r.pixels = models::flux::pil_lanczos_resize(im.pixels, im.width, im.height, im.channels, w, h);
    return r;
}

Image decode_or_refuse(const std::vector<uint8_t>& bytes, int channels, const std::string& field) {
    try {
        return pipeline::decode_image(bytes, channels, field);
    } catch (const Error& e) {
        refuse(400, field, "{}", e.what());
    }
}

}  // namespace

Service::Service(pipeline::Generator& gen, ServiceOptions opt) : gen_(gen), opt_(std::move(opt)), store_(opt_.state_dir) {
    if (opt_.preview == PreviewMethod::Auto)
        opt_.preview = gen_.family().latent_format().channels == 4 ? PreviewMethod::Proj : PreviewMethod::None;
    if (opt_.preview == PreviewMethod::Proj && gen_.family().latent_format().channels != 4) {
        log::warn("--preview proj: no latent-to-RGB factors for {}'s {}-channel latent; previews are off (use --preview vae)",
                  gen_.family().name(), gen_.family().latent_format().channels);
        opt_.preview = PreviewMethod::None;
    }
    preview_interval_ = std::max(1, opt_.preview_interval);
    for (const auto& r : store_.list(kQueued, 1 << 30)) queue_.push_back(r.id);
    if (store_.requeued_at_open() > 0)
        log::info("state {}: {} job(s) cut off earlier resume from their checkpoints", opt_.state_dir.string(), store_.requeued_at_open());
    if (!queue_.empty()) log::info("state {}: {} queued job(s)", opt_.state_dir.string(), queue_.size());
    worker_ = std::thread([this] { run_worker(); });
}

Service::~Service() { stop(); }

void Service::bump() {
    ++version_;
    cv_.notify_all();
}

uint64_t Service::version() const {
    std::lock_guard lk(mu_);
    return version_;
}

uint64_t Service::wait_change(uint64_t seen, std::chrono::milliseconds timeout) const {
    std::unique_lock lk(mu_);
    cv_.wait_for(lk, timeout, [&] { return version_ != seen || stopping_.load(); });
    return version_;
}

std::string Service::model_title() const {
    const auto& b = gen_.base();
    std::string m = !b.model.empty() ? b.model : b.diffusion_model;
    if (m.empty()) m = pipeline::find_demo_model();
    fs::path p(m);
    if (p.filename().empty()) p = p.parent_path();
    return p.filename().string();
}

std::string Service::model_name() const {
    const std::string t = model_title();
    return fs::path(t).stem().string().empty() ? t : fs::path(t).stem().string();
}

void Service::set_default_clip_skip(int v) { default_clip_skip_ = v; }
void Service::set_preview_interval(int v) { preview_interval_ = std::max(1, v); }

std::vector<LoraFile> Service::loras() const {
    std::vector<LoraFile> out;
    if (opt_.lora_dir.empty()) return out;
    std::error_code ec;
    const fs::path root = fs::weakly_canonical(opt_.lora_dir, ec);
    if (ec || !fs::is_directory(root, ec)) return out;
    const std::string root_s = root.string() + "/";
    for (auto it = fs::recursive_directory_iterator(root, fs::directory_options::skip_permission_denied, ec);
         !ec && it != fs::recursive_directory_iterator() && out.size() < 10000; it.increment(ec)) {
        const fs::path& p = it->path();
        if (p.filename().string().starts_with(".")) {
            if (it->is_directory(ec)) it.disable_recursion_pending();
            continue;
        }
        if (it.depth() > 8) {
            it.disable_recursion_pending();
            continue;
        }
        const std::string ext = ascii_lower(p.extension().string());
        if (ext != ".safetensors" && ext != ".ckpt" && ext != ".pt" && ext != ".gguf" && ext != ".bin") continue;
        const fs::path real = fs::weakly_canonical(p, ec);
        if (ec || !real.string().starts_with(root_s) || !fs::is_regular_file(real, ec)) continue;  // a link leaving the folder
        out.push_back({p.stem().string(), fs::relative(p, root, ec).string()});
    }
    std::sort(out.begin(), out.end(), [](const LoraFile& a, const LoraFile& b) { return a.path < b.path; });
    return out;
}

std::vector<std::pair<fs::path, int>> Service::upscaler_models() const {
    const pipeline::GenerateParams& d = gen_.base();
    std::vector<fs::path> files;
    std::error_code ec;
    if (!d.upscale_model.empty()) files.push_back(platform::u8path(d.upscale_model));
    if (!d.hires_upscalers_dir.empty()) {
        std::vector<fs::path> in_dir;
        for (const auto& e : fs::directory_iterator(platform::u8path(d.hires_upscalers_dir), ec)) {
            const std::string ext = ascii_lower(platform::path_utf8(e.path().extension()));
            if (!e.is_regular_file(ec) || platform::path_utf8(e.path().filename()).starts_with(".")) continue;
            if (ext != ".pth" && ext != ".pt" && ext != ".safetensors" && ext != ".ckpt" && ext != ".bin") continue;
            if (!files.empty() && fs::equivalent(e.path(), files[0], ec)) continue;
            in_dir.push_back(e.path());
        }
        std::sort(in_dir.begin(), in_dir.end());
        files.insert(files.end(), in_dir.begin(), in_dir.end());
    }
    std::vector<std::pair<fs::path, int>> r;
    for (const auto& f : files) {
        try {
            pipeline::UpscaleOptions o;
            o.model = platform::path_utf8(f);
            r.emplace_back(f, pipeline::ImageUpscaler(o).scale());
        } catch (const Error& e) {
            log::warn("upscalers: {} left out: {}", platform::path_utf8(f), e.what());
        }
    }
    return r;
}

std::string Service::submit(JobRequest req) {
    if (stopping_) refuse(503, "", "the server is stopping; send the job again after it restarts");
    // hires fix: a built-in upscaler name or the stem of a listed model (never a path)
    if (req.hires && !req.hr_upscaler.empty() && req.hr_upscaler != "None") {
        const std::string l = ascii_lower(req.hr_upscaler);
        bool known = false;
        for (const auto& n : pipeline::builtin_hires_upscalers()) known = known || ascii_lower(n) == l;
        if (!known)
            for (const auto& m : upscaler_models()) known = known || platform::path_utf8(m.first.stem()) == req.hr_upscaler;
        if (!known)
            refuse(400, "hr_upscaler", "hr_upscaler \"{}\" is not one of /sdapi/v1/upscalers (None, Lanczos, Nearest, the server's models) nor a "
                   "latent upscale mode", req.hr_upscaler.substr(0, 128));
    }
    // the one loaded model
    if (!req.model_checkpoint.empty()) {
        const std::string t = model_title(), n = model_name();
        const std::string& c = req.model_checkpoint;
        if (c != t && c != n && !c.starts_with(t + " [") && !c.starts_with(n + " ["))
            refuse(400, "override_settings.sd_model_checkpoint", "sd_model_checkpoint \"{}\" is not the loaded model \"{}\"; easel serves one model",
                   c.substr(0, 128), t);
    }
    // LoRAs: tags in the prompts and structured entries must name files of --lora-model-dir
    std::vector<std::string> wanted;
    for (const std::string* text : {&req.prompt, &req.negative_prompt}) {
        try {
            for (const auto& t : text::extract_extra_networks(*text).loras) wanted.push_back(t.name);
        } catch (const Error& e) {
            refuse(400, text == &req.prompt ? "prompt" : "negative_prompt", "{}", e.what());
        }
    }
    for (const auto& l : req.loras) wanted.push_back(l.name);
    if (!wanted.empty()) {
        if (opt_.lora_dir.empty()) refuse(400, "lora", "LoRA \"{}\" asked for, but the server has no --lora-model-dir", wanted[0].substr(0, 128));
        const auto files = loras();
        for (auto& name : wanted) {
            bool found = false;
            for (const auto& f : files) {
                const std::string rel_stem = (fs::path(f.path).parent_path() / fs::path(f.path).stem()).string();
                if (name == f.name || name == f.path || name == rel_stem) found = true;
            }
            if (!found) refuse(400, "lora", "LoRA \"{}\" is not in --lora-model-dir (GET /sdapi/v1/loras lists them)", name.substr(0, 128));
        }
    }
    std::string id = req.force_id.empty() ? new_job_id() : req.force_id;
    if (store_.get(id)) refuse(400, "force_task_id", "job id {} is in use", id);
    if (req.seed < 0) {
        static std::mutex rmu;
        static std::mt19937_64 rng{std::random_device{}()};
        std::lock_guard lk(rmu);
        req.seed = (int64_t)(rng() % 4294967294ull);  // A1111: random.randrange(4294967294)
    }
    {
        std::lock_guard lk(mu_);
        if ((int)queue_.size() >= opt_.max_queue)
            refuse(503, "", "the queue is full ({} jobs waiting); try again later", queue_.size());
    }
    const fs::path dir = store_.job_dir(id);
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (!fs::is_directory(dir, ec)) fail(ErrorKind::Io, "cannot create the job folder {}", dir.string());
    try {
        write_images(req, dir);
        JobRecord rec;
        rec.id = id;
        rec.request = req;
        rec.created = now_s();
        std::lock_guard lk(mu_);
        if ((int)queue_.size() >= opt_.max_queue)
            refuse(503, "", "the queue is full ({} jobs waiting); try again later", queue_.size());
        store_.insert(rec);
        queue_.push_back(id);
        bump();
    } catch (...) {
        fs::remove_all(dir, ec);
        throw;
    }
    log::info("job {} queued: {} {}x{}, {} image(s), seed {}", id, req.type, req.width, req.height, req.batch, req.seed);
    return id;
}

void Service::write_images(JobRequest& req, const fs::path& dir) const {
    if (req.init_image.empty()) {
        if (!req.mask.empty()) refuse(400, "mask", "a mask needs an init image");
        return;
    }
    Image init = decode_or_refuse(req.init_image, 3, "init image");
    const int W = req.width > 0 ? req.width : init.width, H = req.height > 0 ? req.height : init.height;
    if (W < 8 || H < 8 || W > opt_.limits.max_side || H > opt_.limits.max_side)
        refuse(400, "width", "the init image is {}x{}; sides must be 8 to {} pixels (send width and height to resize it)", W, H,
               opt_.limits.max_side);
    pipeline::save_png(dir / "init.png", resized(init, W, H));  // A1111 resize_mode 0: just resize (Lanczos)
    if (!req.mask.empty()) {
        Image m;
        if (req.mask_from_alpha) {  // OpenAI: transparent (alpha 0) = edit here
            Image rgba = decode_or_refuse(req.mask, 4, "mask");
            m.width = rgba.width;
            m.height = rgba.height;
            m.channels = 1;
            m.pixels.resize((size_t)m.width * m.height);
            for (size_t i = 0; i < m.pixels.size(); ++i) m.pixels[i] = (uint8_t)(255 - rgba.pixels[i * 4 + 3]);
        } else {
            m = decode_or_refuse(req.mask, 1, "mask");
        }
        if (req.mask_invert)
            for (auto& v : m.pixels) v = (uint8_t)(255 - v);
        m = resized(m, W, H);
        gaussian_blur(m, req.mask_blur);
        pipeline::save_png(dir / "mask.png", m);
    }
    req.width = W;
    req.height = H;
    req.type = "img2img";
    req.init_image.clear();
    req.mask.clear();
}

std::optional<JobRecord> Service::get(const std::string& id) const { return store_.get(id); }

int Service::queue_position(const std::string& id) const {
    std::lock_guard lk(mu_);
    for (size_t i = 0; i < queue_.size(); ++i)
        if (queue_[i] == id) return (int)i;
    return -1;
}

std::vector<JobRecord> Service::jobs(int recent) const {
    std::vector<JobRecord> out = store_.list(kRunning, 16);
    for (auto& r : store_.list(kQueued, 10000)) out.push_back(std::move(r));
    int n = 0;
    for (auto& r : store_.list("", recent + 64, true)) {
        if (!terminal(r.state) || n >= recent) continue;
        out.push_back(std::move(r));
        ++n;
    }
    return out;
}

std::vector<uint8_t> Service::image_bytes(const JobRecord& rec, size_t i) const {
    if (rec.state != kDone || !rec.result.contains("images") || i >= rec.result["images"].size()) return {};
    const std::string name = rec.result["images"][i].get<std::string>();
    if (name.find('/') != std::string::npos || name.starts_with(".")) return {};
    std::ifstream f(store_.job_dir(rec.id) / name, std::ios::binary);
    return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

bool Service::cancel(const std::string& id) {
    auto rec = store_.get(id);
    if (!rec) refuse(404, "id", "no job {}", id.substr(0, 64));
    std::lock_guard lk(mu_);
    auto it = std::find(queue_.begin(), queue_.end(), id);
    if (it != queue_.end()) {
        queue_.erase(it);
        rec->state = kCancelled;
        rec->error = "cancelled before it ran";
        rec->finished = now_s();
        store_.update(*rec);
        bump();
        log::info("job {} cancelled (queued)", id);
        return true;
    }
    if (live_.id == id) {
        abort_running_ = true;
        bump();
        log::info("job {} cancelled (running): it ends after its current step", id);
        return true;
    }
    return false;
}

bool Service::interrupt() {
    std::lock_guard lk(mu_);
    if (live_.id.empty()) return false;
    interrupt_running_ = true;
    live_.interrupted = true;
    bump();
    return true;
}

std::optional<JobRecord> Service::wait(const std::string& id, std::chrono::milliseconds timeout) const {
    const auto until = std::chrono::steady_clock::now() + timeout;
    uint64_t seen = version();
    while (true) {
        auto rec = store_.get(id);
        if (!rec || terminal(rec->state)) return rec;
        const auto left = until - std::chrono::steady_clock::now();
        if (left <= std::chrono::milliseconds(0) || stopping_) return rec;
        seen = wait_change(seen, std::min(std::chrono::duration_cast<std::chrono::milliseconds>(left), std::chrono::milliseconds(1000)));
    }
}

LiveState Service::live() const {
    std::lock_guard lk(mu_);
    return live_;
}

void Service::request_stop() {
    std::lock_guard lk(mu_);
    stopping_ = true;
    abort_running_ = true;
    bump();
}

void Service::stop() {
    request_stop();
    if (worker_.joinable()) worker_.join();
}

void Service::run_worker() {
    while (true) {
        std::string id;
        {
            std::unique_lock lk(mu_);
            cv_.wait(lk, [&] { return stopping_.load() || !queue_.empty(); });
            if (stopping_) return;
            id = queue_.front();
            queue_.pop_front();
        }
        auto rec = store_.get(id);
        if (!rec || rec->state != kQueued) continue;
        run_job(std::move(*rec));
    }
}

pipeline::GenerateParams Service::job_params(const JobRecord& rec) const {
    const JobRequest& r = rec.request;
    pipeline::GenerateParams p = gen_.base();
    p.prompt = r.prompt;
    for (const auto& l : r.loras) p.prompt += fmt::format(" <lora:{}:{}>", l.name, l.multiplier);
    p.negative_prompt = r.negative_prompt;
    if (r.width > 0) p.width = r.width;
    if (r.height > 0) p.height = r.height;
    if (r.steps) {
        p.steps = *r.steps;
        p.steps_given = true;
    }
    if (r.cfg_scale) {
        p.cfg_scale = (float)*r.cfg_scale;
        p.cfg_scale_given = true;
    }
    if (!r.sampler.empty()) p.sampling_method = r.sampler;
    if (!r.scheduler.empty()) p.scheduler = r.scheduler;
    p.seed = r.seed;
    p.batch_count = r.batch;
    if (r.strength) p.strength = (float)*r.strength;
    if (r.clip_skip) p.clip_skip = *r.clip_skip;
    else if (default_clip_skip_ > 0) p.clip_skip = default_clip_skip_;
    if (r.eta) p.eta = (float)*r.eta;
    p.hires = r.hires;
    if (r.hires) {
        p.hires_scale = (float)r.hr_scale;
        p.hires_width = r.hr_resize_x;
        p.hires_height = r.hr_resize_y;
        p.hires_steps = r.hr_steps;
        p.hires_denoising_strength = (float)r.hires_strength;
        // A1111: "None" is a Lanczos resize of the decoded image (images.resize_image)
        p.hires_a1111_none = r.hr_upscaler == "None";
        p.hires_upscaler = r.hr_upscaler.empty() ? "Latent" : r.hr_upscaler;
        p.hires_sigmas.clear();
    }
    const fs::path dir = store_.job_dir(rec.id);
    std::error_code ec;
    p.init_img = fs::is_regular_file(dir / "init.png", ec) ? (dir / "init.png").string() : "";
    p.mask = fs::is_regular_file(dir / "mask.png", ec) ? (dir / "mask.png").string() : "";
    p.ref_images.clear();
    p.output = (dir / "image-%d.png").string();
    p.checkpoint_dir = (dir / "ckpt").string();
    p.resume = pipeline::find_checkpoint(p.checkpoint_dir, 0).has_value();
    p.resume_step = -1;
    p.save_embeddings = p.load_embeddings = p.save_latent = p.load_latent = "";
    p.stage.clear();
    return p;
}

void Service::run_job(JobRecord rec) {
    const fs::path dir = store_.job_dir(rec.id);
    if (++rec.attempts > 3) {
        rec.state = kFailed;
        rec.error = "the server stopped 3 times while running this job; it is not run again";
        rec.finished = now_s();
        store_.update(rec);
        std::lock_guard lk(mu_);
        bump();
        return;
    }
    rec.state = kRunning;
    rec.started = now_s();
    store_.update(rec);
    abort_running_ = stopping_.load();
    interrupt_running_ = false;
    {
        std::lock_guard lk(mu_);
        live_ = LiveState{};
        live_.id = rec.id;
        live_.images = rec.request.batch;
        live_.steps = rec.request.steps.value_or(0);
        live_.started = rec.started;
        bump();
    }
    pipeline::GenerateParams p;
    std::string outcome;
    const auto t0 = std::chrono::steady_clock::now();
    double step_sum = 0;
    int step_count = 0;
    try {
        p = job_params(rec);
        if (p.resume) log::info("job {}: resuming from its checkpoints in {}", rec.id, p.checkpoint_dir);
        auto last = std::chrono::steady_clock::now();
        pipeline::StepFn on_step = [&](const pipeline::StepInfo& si) -> bool {
            if (abort_running_) throw JobAborted();
            const auto t = std::chrono::steady_clock::now();
            step_sum += std::chrono::duration<double>(t - last).count();
            last = t;
            ++step_count;
            const double avg = step_sum / std::max(1, step_count);
            const int left = (si.images - si.image - 1) * si.steps + (si.steps - si.step);
            std::vector<uint8_t> png;
            const int every = preview_interval_.load();
            if (opt_.preview != PreviewMethod::None && (si.step % every == 0 || si.step == si.steps)) {
                try {
                    // the model's denoised estimate (A1111's live preview shows it), else the latent itself
                    const std::vector<float> lat = si.sampler->denoised().empty() ? si.sampler->result() : si.sampler->denoised();
                    std::optional<Image> im;
                    if (opt_.preview == PreviewMethod::Proj) im = proj_preview(lat, si.channels, si.h, si.w);
                    else im = gen_.decode_preview(lat, si.h, si.w);
                    if (im) png = pipeline::encode_png(*im);
                } catch (const Error& e) {
                    log::debug("preview: {}", e.what());
                }
            }
            std::lock_guard lk(mu_);
            live_.image = si.image;
            live_.images = si.images;
            live_.step = si.step;
            live_.steps = si.steps;
            live_.eta = left * avg + avg;  // + about one step's worth for the decode
            live_.progress = std::min(1.0, (si.image + (double)si.step / std::max(1, si.steps)) / std::max(1, si.images));
            if (!png.empty()) {
                live_.preview_png = std::move(png);
                live_.preview_step = si.step;
            }
            bump();
            return !interrupt_running_.load();
        };
        last = std::chrono::steady_clock::now();
        pipeline::GenerateReport rep = gen_.run(p, {}, on_step);
        json images = json::array(), infotexts = json::array(), seeds = json::array();
        for (size_t i = 0; i < rep.outputs.size(); ++i) {
            images.push_back(fs::path(rep.outputs[i]).filename().string());
            std::string info;
            try {
                auto chunks = pipeline::read_png_text(fs::path(rep.outputs[i]));
                info = pipeline::find_png_text(chunks, "parameters").value_or("");
            } catch (const Error&) {
            }
            infotexts.push_back(info);
            seeds.push_back(rep.seed + (int64_t)i);
        }
        rec.result = {{"images", images}, {"infotexts", infotexts}, {"seeds", seeds}, {"width", rep.width}, {"height", rep.height},
                      {"steps", p.steps}, {"interrupted", rep.interrupted}, {"inpainting", !p.mask.empty()},
                      {"seconds", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()}};
        // the stages as `easel generate` times them (its timings line), for bench/server_bench.mjs
        double denoise_s = 0;
        for (double s : rep.step_s) denoise_s += s;
        rec.result["timings"] = {{"load_s", rep.load_s}, {"te_s", rep.te_s}, {"denoise_s", denoise_s}, {"vae_s", rep.vae_s},
                                 {"upscale_s", rep.upscale_s}, {"conditioning_cached", rep.conditioning_cached}};
        rec.state = kDone;
        std::error_code ec;
        fs::remove_all(p.checkpoint_dir, ec);
        outcome = fmt::format("done in {:.2f} s", rec.result["seconds"].get<double>());
    } catch (const JobAborted&) {
        if (stopping_) {
            rec.state = kQueued;  // resumes from its checkpoint when the server starts again
            --rec.attempts;
            outcome = "stopped with the server; it resumes from its last checkpoint at the next start";
        } else {
            rec.state = kCancelled;
            rec.error = "cancelled while running";
            outcome = "cancelled";
        }
    } catch (const ApiError& e) {
        rec.state = kFailed;
        rec.error = e.what();
    } catch (const Error& e) {
        rec.state = kFailed;
        rec.error = e.what();
        rec.result = {{"error_kind", error_kind_name(e.kind())}};
    } catch (const std::bad_alloc&) {
        rec.state = kFailed;
        rec.error = "out of host memory (the job's buffers do not fit: use a smaller width/height)";
    } catch (const std::exception& e) {
        rec.state = kFailed;
        rec.error = e.what();
    }
    if (rec.state == kFailed) outcome = "failed: " + rec.error;
    if (rec.state != kQueued) rec.finished = now_s();
    store_.update(rec);
    log::info("job {} {}", rec.id, outcome);
    std::lock_guard lk(mu_);
    live_ = LiveState{};
    bump();
}

}  // namespace easel::server
