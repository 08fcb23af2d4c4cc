// AUTOMATIC1111 API requests exactly as A1111's API documents them (modules/api/api.py,
// models.py), against `easel server` on the demo model: discovery routes, txt2img, progress
// polling during a job (current_image preview), interrupt, img2img with a mask, options, errors.
// Usage: node a1111.mjs URL
import { checks, call, sleep, makePng, pngInfo, b64png } from "./lib.mjs";

const url = process.argv[2];
const t = checks();
const get = (p) => call(url, "GET", p);
const post = (p, b) => call(url, "POST", p, b);

let r = await get("/sdapi/v1/sd-models");
t.check("sd-models: the loaded model with A1111's keys", r.status === 200 && r.body.length === 1 &&
  ["title", "model_name", "hash", "sha256", "filename", "config"].every((k) => k in r.body[0]) && r.body[0].model_name === "easel-demo-shapes", r.text);
r = await get("/sdapi/v1/samplers");
const euler_a = Array.isArray(r.body) && r.body.find((s) => s.name === "Euler a");
t.check("samplers: A1111 names, aliases, options", r.status === 200 && euler_a && euler_a.aliases.includes("k_euler_a") && typeof euler_a.options === "object", r.text);
r = await get("/sdapi/v1/schedulers");
t.check("schedulers: name and label", r.status === 200 && r.body.some((s) => s.name === "karras" && s.label === "Karras"), r.text);
r = await get("/sdapi/v1/options");
t.check("options GET: sd_model_checkpoint", r.status === 200 && r.body.sd_model_checkpoint === "easel-demo-shapes.safetensors", r.text);
r = await post("/sdapi/v1/options", { CLIP_stop_at_last_layers: 1, sd_model_checkpoint: "easel-demo-shapes.safetensors" });
t.check("options POST: accepted", r.status === 200, r.text);
r = await post("/sdapi/v1/options", { sd_model_checkpoint: "v1-5-pruned.safetensors" });
t.check("options POST: another checkpoint refused naming it", r.status === 400 && r.body.field === "sd_model_checkpoint", r.text);
for (const p of ["/sdapi/v1/loras", "/sdapi/v1/upscalers", "/sdapi/v1/latent-upscale-modes"]) {
  r = await get(p);
  t.check(p + ": a list", r.status === 200 && Array.isArray(r.body), r.text);
}

// txt2img as the A1111 wiki's example, plus the size and seed
const body = { prompt: "a large red circle in the centre, blue background", steps: 3, width: 64, height: 64, seed: 1, cfg_scale: 5, sampler_name: "Euler" };
r = await post("/sdapi/v1/txt2img", body);
let info = r.status === 200 ? JSON.parse(r.body.info) : null;
let png = r.status === 200 ? b64png(r.body.images[0]) : null;
t.check("txt2img: one 64x64 PNG", png && png.width === 64 && png.height === 64, r.text);
t.check("txt2img: info is Processed.js() (seed, sampler, steps, infotexts)", info && info.seed === 1 && info.sampler_name === "Euler" &&
  info.steps === 3 && info.all_seeds.length === 1 && info.infotexts.length === 1 && "job_timestamp" in info && "sd_model_name" in info, r.body && r.body.info);
t.check("txt2img: PNG parameters text = info.infotexts[0]", png && info && png.text.parameters === info.infotexts[0], png && png.text.parameters);
t.check("txt2img: parameters echoes the request", r.body.parameters && r.body.parameters.prompt === body.prompt && r.body.parameters.seed === 1);
const first = r.body.images && r.body.images[0];

// progress polling during a job, then interrupt
const long = post("/sdapi/v1/txt2img", Object.assign({}, body, { steps: 60, seed: 2 }));
let seen = null, steps = new Set();
for (let i = 0; i < 6000; i++) {
  const p = await get("/sdapi/v1/progress");
  if (p.body.state && p.body.state.sampling_step > 0) {
    steps.add(p.body.state.sampling_step);
    if (!seen && p.body.current_image) seen = p.body;
    if (seen && steps.size >= 2) break;
  }
  await sleep(50);
}
t.check("progress: state keys as A1111's shared.state.dict()", seen && ["skipped", "interrupted", "stopping_generation", "job", "job_count",
  "job_timestamp", "job_no", "sampling_step", "sampling_steps"].every((k) => k in seen.state), JSON.stringify(seen && seen.state));
t.check("progress: progress in (0, 1], eta_relative >= 0, sampling_steps 60", seen && seen.progress > 0 && seen.progress <= 1 && seen.eta_relative >= 0 && seen.state.sampling_steps === 60,
  seen && JSON.stringify({ progress: seen.progress, eta: seen.eta_relative, steps: seen.state.sampling_steps }));
t.check("progress: advances (several sampling_step values seen)", steps.size >= 2, [...steps].join(","));
t.check("progress: current_image is a base64 PNG preview", seen && b64png(seen.current_image) !== null);
const skip = await get("/sdapi/v1/progress?skip_current_image=true");
t.check("progress: skip_current_image leaves it out", skip.body.current_image === null, skip.text.slice(0, 200));
r = await post("/sdapi/v1/interrupt");
t.check("interrupt: 200 {}", r.status === 200 && JSON.stringify(r.body) === "{}", r.text);
r = await long;
info = r.status === 200 ? JSON.parse(r.body.info) : null;
t.check("interrupted txt2img: still answers with an image", r.status === 200 && b64png(r.body.images[0]) !== null, r.text.slice(0, 300));
r = await get("/sdapi/v1/progress");
t.check("progress when idle: 0 and job_count 0", r.body.progress === 0 && r.body.state.job_count === 0, r.text.slice(0, 300));

// img2img with a mask (in-painting): the documented fields
const mask = makePng(64, 64, 1, (x, y) => [x >= 16 && x < 48 && y >= 16 && y < 48 ? 255 : 0]).toString("base64");
r = await post("/sdapi/v1/img2img", { init_images: ["data:image/png;base64," + first], mask, denoising_strength: 0.6, mask_blur: 0,
  inpainting_fill: 1, inpaint_full_res: false, inpainting_mask_invert: 0, prompt: "a small green square on the left", steps: 4, seed: 3, sampler_name: "Euler" });
info = r.status === 200 ? JSON.parse(r.body.info) : null;
png = r.status === 200 ? b64png(r.body.images[0]) : null;
t.check("img2img + mask: a 64x64 PNG, denoising strength 0.6 in info", png && png.width === 64 && info && info.denoising_strength === 0.6, r.text.slice(0, 300));
t.check("img2img: init_images not echoed without include_init_images", r.body.parameters && r.body.parameters.init_images === null);
r = await post("/sdapi/v1/img2img", { init_images: [first], prompt: "x", steps: 2, width: 32, height: 48, seed: 4 });
png = r.status === 200 ? b64png(r.body.images[0]) : null;
t.check("img2img: width/height resize the init image (resize_mode 0)", png && png.width === 32 && png.height === 48, r.text.slice(0, 300));

// errors: A1111's error body, the field named
r = await post("/sdapi/v1/txt2img", { prompt: "x", steps: "twenty" });
t.check("wrong type: 400 {error, detail, body, errors} naming steps", r.status === 400 && r.body.error && r.body.detail.includes("steps") && r.body.field === "steps", r.text);
r = await post("/sdapi/v1/img2img", { prompt: "x" });
t.check("img2img without init_images: 400 naming it", r.status === 400 && r.body.field === "init_images", r.text);
r = await post("/sdapi/v1/txt2img", { prompt: "x", sampler_name: "No Such Sampler" });
t.check("unknown sampler: 400 naming sampler_name", r.status === 400 && r.body.field === "sampler_name", r.text);
r = await post("/sdapi/v1/txt2img", { prompt: "x", sampler_name: "DPM fast" });
t.check("an A1111 sampler easel lacks: 400 naming sampler_name", r.status === 400 && r.body.field === "sampler_name", r.text);
t.done();
