// `easel server`: the HTTP service and web page (docs/server.md). sd-server's flags
// (-l/--listen-ip, --listen-port, --serve-html-path) plus every flag of `easel generate` (the
// model, its placement and the jobs' defaults), loaded and placed once; the jobs live in
// --state-dir and survive a crash. SIGINT/SIGTERM: the running job stops after its current step
// (its checkpoint kept, queued again), the model's buffers are freed, the process exits 0.
#include "autofit_cli.h"
#include "command.h"
#include "generate_options.h"

#include "core/error.h"
#include "core/log.h"
#include "models/family.h"
#include "pipeline/cache.h"
#include "pipeline/generate.h"
#include "server/http_api.h"
#include "server/service.h"

#include <httplib.h>

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <sstream>
#include <thread>

namespace {

using namespace easel;

struct ServerFlags {
    std::string listen_ip = "127.0.0.1";
    int listen_port = 1234;
    std::string html_path;
    std::string api_key;
    std::string state_dir;
    int max_queue = 64;
    int max_body_mib = 64;
    int max_side = 4096;
    int max_steps = 150;
    int max_batch = 16;
    std::string preview = "auto";
    int preview_interval = 1;
    std::string lora_dir;
    int threads = 48;
};

/// The generate flags that name files of one job: a server takes them per request instead.
void refuse_job_file_flags(const CLI::App& sub) {
    for (const char* f : {"-i", "--mask", "-r", "-o", "--save-embeddings", "--load-embeddings", "--save-latent", "--load-latent",
                          "--checkpoint-dir", "--resume", "--resume-step"})
        if (sub.count(f) > 0)
            fail(ErrorKind::InvalidInput, "{} is a flag of one job, not of the server: send images with the request; results and checkpoints go "
                 "into --state-dir", f);
}

/// The hires fix is asked per request (A1111 enable_hr / hr_*, sd.cpp's hires object); only
/// --hires-upscalers-dir (the models /sdapi/v1/upscalers lists) belongs to the server.
void refuse_job_hires_flags(const CLI::App& sub) {
    for (const char* f : {"--hires", "--hires-upscaler", "--hires-scale", "--hires-width", "--hires-height", "--hires-steps",
                          "--hires-denoising-strength", "--hires-sigmas"})
        if (sub.count(f) > 0)
            fail(ErrorKind::InvalidInput, "{} is a flag of one job, not of the server: send enable_hr and hr_* (A1111) or hires {{...}} "
                 "(sd.cpp) with the request", f);
}

EASEL_COMMAND(
    "server", "Serve the OpenAI images, AUTOMATIC1111 and easel jobs APIs and a web page (sd-server's flags)",
    [](CLI::App& sub) -> std::function<int()> {
        auto p = std::make_shared<pipeline::GenerateParams>();
        auto common = std::make_shared<cli::CommonOptions>();
        auto s = std::make_shared<ServerFlags>();
        const char* g = "Server";
        sub.add_option("-l,--listen-ip", s->listen_ip, "Address to listen on (default 127.0.0.1: this machine only)")->group(g);
        sub.add_option("--listen-port", s->listen_port, "Port (default 1234)")->check(cli::number_check(1, 65535, true))->group(g);
        sub.add_option("--serve-html-path", s->html_path, "Serve this HTML file at / instead of easel's page")->group(g);
        sub.add_option("--api-key", s->api_key, "Require 'Authorization: Bearer KEY' on every API route")->group(g);
        sub.add_option("--state-dir", s->state_dir, "Jobs, checkpoints and results (default: <cache dir>/server)")->group(g);
        sub.add_option("--max-queue", s->max_queue, "Jobs that may wait; more get 503 + Retry-After (default 64)")->check(cli::number_check(1, 100000, true))->group(g);
        sub.add_option("--max-body-mib", s->max_body_mib, "Largest request body in MiB (default 64)")->check(cli::number_check(1, 4096, true))->group(g);
        sub.add_option("--max-side", s->max_side, "Largest width/height a request may ask for, pixels (default 4096)")
            ->check(cli::number_check(8, (double)cli::kMaxImageSide, true))->group(g);
        sub.add_option("--max-steps", s->max_steps, "Most steps a request may ask for (default 150)")->check(cli::number_check(1, 10000, true))->group(g);
        sub.add_option("--max-batch", s->max_batch, "Most images one request may ask for (default 16)")->check(cli::number_check(1, 1000, true))->group(g);
        sub.add_option("--preview", s->preview, "Live preview: auto (proj where known), proj, vae (the model's decoder, or TAESD), none")->group(g);
        sub.add_option("--preview-interval", s->preview_interval, "Steps between previews (default 1)")->check(cli::number_check(1, 10000, true))->group(g);
        sub.add_option("--http-threads", s->threads, "HTTP worker threads (default 48)")->check(cli::number_check(4, 1024, true))->group(g);
        cli::add_generate_options(sub, *p);
        cli::add_stage_options(sub, *p);
        // --lora-model-dir: the LoRA picker's folder (taken from the generate flags when they have it)
        if (!sub.get_option_no_throw("--lora-model-dir"))
            sub.add_option("--lora-model-dir", s->lora_dir, "LoRA folder: /sdapi/v1/loras lists it, <lora:name:w> tags must name its files")->group(g);
        cli::add_common_options(sub, *common);
        sub.footer(
            "The model is loaded and placed once; the generate flags are the jobs' defaults, each request overrides its own fields.\n"
            "Routes: / (web page), /v1/images/generations, /v1/images/edits, /v1/models (OpenAI), /sdapi/v1/* (AUTOMATIC1111),\n"
            "/easel/v1/jobs (jobs, events, cancel; /sdcpp/v1/* as sd-server names them). docs/server.md has every field.\n"
            "Examples:\n"
            "  easel server -m sd15.safetensors --listen-port 1234\n"
            "  easel server --diffusion-model flux1-dev.gguf --t5xxl t5xxl.gguf --clip_l clip_l.safetensors --vae ae.safetensors --backend 'diffusion=CUDA0&CUDA1'\n"
            "  easel server -m sd15.safetensors -l 0.0.0.0 --api-key secret --lora-model-dir ./loras");
        return [p, common, s, &sub]() -> int {
            cli::apply_common_options(*common);
            refuse_job_file_flags(sub);
            refuse_job_hires_flags(sub);
            cli::resolve_generate_options(sub, *p);  // which of --steps / --cfg-scale were given; prompt files; notes
            if (const CLI::Option* o = sub.get_option_no_throw("--lora-model-dir"); o && s->lora_dir.empty() && o->count() > 0)
                s->lora_dir = o->as<std::string>();
            if (!s->lora_dir.empty() && !std::filesystem::is_directory(s->lora_dir))
                fail(ErrorKind::InvalidInput, "--lora-model-dir {}: not a folder", s->lora_dir);
            server::ServiceOptions so;
            so.state_dir = s->state_dir.empty() ? pipeline::default_cache_dir() / "server" : std::filesystem::path(s->state_dir);
            so.max_queue = s->max_queue;
            so.limits.max_body_bytes = (size_t)s->max_body_mib << 20;
            so.limits.max_side = s->max_side;
            so.limits.max_steps = s->max_steps;
            so.limits.max_batch = s->max_batch;
            so.preview = server::parse_preview_method(s->preview);
            so.preview_interval = s->preview_interval;
            so.lora_dir = s->lora_dir;
            server::HttpOptions ho;
            ho.api_key = s->api_key;
            ho.threads = s->threads;
            if (!s->html_path.empty()) {
                std::ifstream f(s->html_path, std::ios::binary);
                if (!f) fail(ErrorKind::Io, "--serve-html-path {}: cannot read the file", s->html_path);
                std::stringstream ss;
                ss << f.rdbuf();
                ho.html = ss.str();
            } else {
                ho.html = server::embedded_page();
            }
            if (p->placement.auto_fit) log::info("{}", placement::format_fit(cli::apply_auto_fit(*p)));

            // SIGINT / SIGTERM go to one thread (blocked here, before any thread starts)
            sigset_t sigs;
            sigemptyset(&sigs);
            sigaddset(&sigs, SIGINT);
            sigaddset(&sigs, SIGTERM);
            pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
            std::signal(SIGPIPE, SIG_IGN);  // a client that hangs up mid-answer is an error return, not the end of the server

            // the model, opened and placed once (a placed model's stages load per job, as its plan assumes)
            pipeline::Generator gen(*p, {.keep_loaded = !p->placement.any()});
            gen.open(p->width, p->height);
            server::Service svc(gen, so);
            httplib::Server svr;
            server::HttpApi api(svr, svc, ho);
            if (!svr.bind_to_port(s->listen_ip, s->listen_port)) {
                svc.stop();
                fail(ErrorKind::Io, "cannot listen on {}:{} (in use, or not an address of this machine); pick another --listen-port",
                     s->listen_ip, s->listen_port);
            }
            std::thread([&svc, &svr, sigs] {
                int sig = 0;
                sigwait(&sigs, &sig);
                log::info("{}: stopping; the running job ends after its current step and resumes at the next start",
                          sig == SIGINT ? "SIGINT" : "SIGTERM");
                svc.request_stop();
                svr.stop();
                sigwait(&sigs, &sig);  // a second signal: leave now (the last step's checkpoint is on disk)
                std::fprintf(stderr, "easel server: second signal, exiting at once\n");
                std::_Exit(130);
            }).detach();
            log::info("easel server: http://{}:{}/ (state {}; {} model {}){}", s->listen_ip, s->listen_port, so.state_dir.string(),
                      gen.family().name(), svc.model_title(), s->api_key.empty() ? "" : "; API key required");
            svr.listen_after_bind();
            svc.stop();
            log::info("easel server: stopped");
            return 0;
        };
    },
    25);

}  // namespace
