// The hires fix through the server (docs/hires.md): A1111's enable_hr / hr_* fields and the
// upscaler lists, against `easel server` on the demo model started with
// --upscale-model (an x2 tiny ESRGAN: every result is also upscaled x2 before it is stored) and
// --hires-upscalers-dir (the tiny upscalers of tests/data/esrgan).
// Usage: node hires.mjs URL
import { checks, call, b64png } from "./lib.mjs";

const url = process.argv[2];
const t = checks();
const get = (p) => call(url, "GET", p);
const post = (p, b) => call(url, "POST", p, b);

let r = await get("/sdapi/v1/upscalers");
const names = Array.isArray(r.body) ? r.body.map((u) => u.name) : [];
const srvgg = Array.isArray(r.body) && r.body.find((u) => u.name === "srvgg_x2_tiny");
t.check("upscalers: None, Lanczos, Nearest first", names[0] === "None" && names[1] === "Lanczos" && names[2] === "Nearest", r.text);
t.check("upscalers: the --upscale-model file by its stem, scale 2, model_name ESRGAN",
  srvgg && srvgg.scale === 2 && srvgg.model_name === "ESRGAN" && srvgg.model_path.endsWith("srvgg_x2_tiny.safetensors"), r.text);
t.check("upscalers: --hires-upscalers-dir's models, the --upscale-model file once", names.includes("srvgg_x4_tiny") &&
  names.includes("rrdb_x2_tiny") && names.filter((n) => n === "srvgg_x2_tiny").length === 1, r.text);
r = await get("/sdapi/v1/latent-upscale-modes");
t.check("latent-upscale-modes: A1111's six", Array.isArray(r.body) && r.body.length === 6 && r.body[0].name === "Latent" &&
  r.body.some((m) => m.name === "Latent (bicubic antialiased)"), r.text);

const base = { prompt: "a large red circle in the centre, blue background", steps: 2, width: 64, height: 64, seed: 3, cfg_scale: 5, sampler_name: "Euler" };
for (const [up, extra] of [["Latent", {}], ["srvgg_x2_tiny", { hr_second_pass_steps: 1, denoising_strength: 0.5 }], ["None", {}]]) {
  r = await post("/sdapi/v1/txt2img", { ...base, enable_hr: true, hr_scale: 2, hr_upscaler: up, ...extra });
  const png = r.status === 200 ? b64png(r.body.images[0]) : null;
  // 64 -> 128 by the hires fix, then x2 by the server's --upscale-model
  t.check(`txt2img enable_hr (${up}): 256x256 (hires 128, then the server's upscaler)`, png && png.width === 256 && png.height === 256, r.text);
  const p = png ? png.text.parameters : "";
  t.check(`txt2img enable_hr (${up}): A1111's infotext fields`, p.includes("Size: 64x64, ") && p.includes("Hires upscale: 2, ") &&
    p.includes(`Hires upscaler: ${up}`) && p.includes(`Denoising strength: ${extra.denoising_strength ?? 0.75}`) &&
    (extra.hr_second_pass_steps ? p.includes("Hires steps: 1, ") : !p.includes("Hires steps")), p);
  t.check(`txt2img enable_hr (${up}): the postprocessing chunk of --upscale-model`, png && (png.text.postprocessing || "").includes("Postprocess upscale by: 2"), png && JSON.stringify(png.text));
}
r = await post("/sdapi/v1/txt2img", { ...base, enable_hr: true, hr_resize_x: 96, hr_resize_y: 0 });
let png = r.status === 200 ? b64png(r.body.images[0]) : null;
t.check("txt2img hr_resize_x 96: 96x96, then x2", png && png.width === 192 && png.height === 192, r.text);
t.check("txt2img hr_resize_x: Hires resize: 96x0", png && png.text.parameters.includes("Hires resize: 96x0"), png && png.text.parameters);

// refusals: one 400 naming the field
r = await post("/sdapi/v1/txt2img", { ...base, enable_hr: true, hr_upscaler: "../../etc/passwd" });
t.check("hr_upscaler outside the lists: 400 naming it", r.status === 400 && r.body.field === "hr_upscaler", r.text);
r = await post("/sdapi/v1/txt2img", { ...base, enable_hr: true, hr_upscaler: "R-ESRGAN 4x+" });
t.check("hr_upscaler not on this server: 400", r.status === 400 && r.body.field === "hr_upscaler", r.text);
r = await post("/sdapi/v1/txt2img", { ...base, enable_hr: true, hr_scale: -1 });
t.check("hr_scale -1: 400", r.status === 400 && r.body.field === "hr_scale", r.text);

// sd-server's hires object on /sdcpp/v1/img_gen
r = await post("/sdcpp/v1/img_gen", { prompt: base.prompt, width: 64, height: 64, seed: 3, sample_params: { sample_steps: 2 },
  hires: { enabled: true, upscaler: "Latent (nearest)", scale: 1.5, steps: 1 } });
t.check("sdcpp img_gen with hires: accepted", r.status === 202 && r.body.id, r.text);
if (r.status === 202) {
  let j;
  for (let i = 0; i < 600; i++) {
    j = await get(`/sdcpp/v1/jobs/${r.body.id}`);
    if (j.body.status === "completed" || j.body.status === "failed") break;
    await new Promise((res) => setTimeout(res, 100));
  }
  png = j.body.result ? b64png(j.body.result.images[0].b64_json) : null;
  t.check("sdcpp hires: 96x96 then x2", png && png.width === 192 && png.text.parameters.includes("Hires upscaler: Latent (nearest)"), j.text);
}
t.done();
