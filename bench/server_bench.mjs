// Benchmark of `easel server` on the demo model (CPU): the latency a job adds over `easel
// generate` doing the same work, and the throughput of 20 queued jobs. Not a test (nothing here
// runs in CI); the figures go to bench/results/ by hand (docs/bench.md).
//
//   node bench/server_bench.mjs EASEL_BINARY OUT.json [--size 256] [--steps 20] [--reps 3] [--threads 2]
//
// latency: `easel generate --no-cache` run `reps` times; its own timings line gives the work
// (text encoding + denoising + VAE, model loading excluded) and the process wall time. The
// server (--no-cache, models kept loaded) then answers `reps` synchronous /sdapi/v1/txt2img
// requests of the same job (one at a time, different seeds each time as generate's); the added
// latency = median(request wall time) - median(generate's work).
// throughput: 20 jobs submitted at once to /easel/v1/jobs; the time from the first submission to
// the last job done, jobs per minute, and against 20 x the median single-job time.
import { spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

const [easel, out, ...rest] = process.argv.slice(2);
const opt = { size: 256, steps: 20, reps: 3, threads: 2 };
for (let i = 0; i < rest.length; i += 2) opt[rest[i].replace(/^--/, "")] = Number(rest[i + 1]);
const root = path.resolve(path.dirname(new URL(import.meta.url).pathname), "..");
const model = path.join(root, "models/demo/easel-demo-shapes.safetensors");
const prompt = "a large green star in the centre, white background";
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "easel-server-bench-"));
const median = (a) => { const s = [...a].sort((x, y) => x - y); return s[Math.floor(s.length / 2)]; };
const common = ["-m", model, "-W", String(opt.size), "-H", String(opt.size), "--steps", String(opt.steps), "--sampling-method", "euler",
  "--cfg-scale", "5", "-t", String(opt.threads), "--no-cache"];

// 1. easel generate
const gen = [];
for (let r = 0; r < opt.reps; r++) {
  const t0 = process.hrtime.bigint();
  const p = spawnSync(easel, ["generate", ...common, "-p", prompt, "-s", String(100 + r), "-o", path.join(tmp, `g${r}.png`)], { encoding: "utf8" });
  const wall = Number(process.hrtime.bigint() - t0) / 1e9;
  const m = p.stderr.match(/timings: load ([\d.]+) s, text encoding ([\d.]+) s, denoising ([\d.]+) s .*VAE ([\d.]+) s/);
  if (p.status !== 0 || !m) { console.error(p.stderr); process.exit(1); }
  const [load, te, den, vae] = m.slice(1).map(Number);
  gen.push({ wall_s: wall, load_s: load, work_s: te + den + vae, te_s: te, denoise_s: den, vae_s: vae });
  console.log(`generate ${r}: work ${(te + den + vae).toFixed(3)} s (process ${wall.toFixed(3)} s)`);
}

// 2. the server
const port = 41200 + (process.pid % 200);
const url = `http://127.0.0.1:${port}`;
const srv = spawn(easel, ["server", ...common, "--listen-port", String(port), "--state-dir", path.join(tmp, "state"), "--preview", "none"],
  { stdio: ["ignore", "ignore", "pipe"] });
let log = "";
srv.stderr.on("data", (d) => { log += d; });
for (let i = 0; i < 600 && !/easel server: http/.test(log); i++) await new Promise((r) => setTimeout(r, 100));
const post = async (p, b) => (await fetch(url + p, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(b) })).json();
const job = { prompt, steps: opt.steps, width: opt.size, height: opt.size, cfg_scale: 5, sampler_name: "Euler" };
await post("/sdapi/v1/txt2img", Object.assign({}, job, { seed: 1 }));  // warm-up (first-use allocations)
const srvRuns = [];
for (let r = 0; r < opt.reps; r++) {
  const t0 = process.hrtime.bigint();
  const res = await post("/sdapi/v1/txt2img", Object.assign({}, job, { seed: 100 + r }));
  const wall = Number(process.hrtime.bigint() - t0) / 1e9;
  if (!res.images) { console.error(res); process.exit(1); }
  srvRuns.push({ wall_s: wall });
  console.log(`server job ${r}: ${wall.toFixed(3)} s`);
}
// 3. throughput: 20 queued jobs
const t0 = process.hrtime.bigint();
const ids = [];
for (let i = 0; i < 20; i++) ids.push((await post("/easel/v1/jobs", Object.assign({}, job, { seed: 200 + i }))).id);
for (const id of ids) {
  for (;;) {
    const j = await (await fetch(`${url}/easel/v1/jobs/${id}?images=false`)).json();
    if (j.state === "done") break;
    if (j.state === "failed" || j.state === "cancelled") { console.error(j); process.exit(1); }
    await new Promise((r) => setTimeout(r, 50));
  }
}
const total = Number(process.hrtime.bigint() - t0) / 1e9;
srv.kill("SIGTERM");
await new Promise((r) => srv.on("exit", r));

const work = median(gen.map((g) => g.work_s)), job1 = median(srvRuns.map((s) => s.wall_s));
const result = {
  date: new Date().toISOString(), host: os.hostname(), hardware_threads: os.cpus().length, command_line: process.argv.slice(1).join(" "),
  model: "models/demo/easel-demo-shapes.safetensors", size: opt.size, steps: opt.steps, sampler: "euler", cfg_scale: 5, threads: opt.threads, reps: opt.reps,
  generate: gen, server_jobs: srvRuns,
  median_generate_work_s: work, median_generate_process_s: median(gen.map((g) => g.wall_s)), median_server_job_s: job1,
  added_latency_s: job1 - work, added_latency_pct: 100 * (job1 - work) / work,
  queued_20: { total_s: total, jobs_per_min: 60 * 20 / total, vs_20_single_jobs_pct: 100 * (total - 20 * job1) / (20 * job1) },
};
fs.writeFileSync(out, JSON.stringify(result, null, 2) + "\n");
console.log(JSON.stringify({ added_latency_s: result.added_latency_s, added_latency_pct: result.added_latency_pct, queued_20: result.queued_20 }, null, 1));
fs.rmSync(tmp, { recursive: true, force: true });
