// Benchmark of `easel server` on the bundled demo model (CPU): the latency a job adds over `easel
// generate` doing the same job, and the throughput of 20 queued jobs, measured side by side in
// one run. Not a test (nothing here runs in CI); the figures go to bench/results/ (docs/bench.md).
//
//   node bench/server_bench.mjs EASEL_BINARY OUT.json [--size 256] [--steps 0] [--reps 5] [--threads 2] [--queued 20]
//
// Both sides run the model's own defaults (steps 0 = the demo's recommended steps, sampler,
// scheduler, CFG), -W/-H SIZE, -t THREADS and --no-cache (the conditioning cache would spare the
// server the text encoder on a repeated prompt); the server keeps its default live previews.
//
// latency: `reps` pairs, each an `easel generate` process and a synchronous /sdapi/v1/txt2img
// request of the same job (same seed), the order alternating pair by pair, so that both sides
// see the same machine (other processes on a shared machine change step times by 10x and more:
// ggml's CPU threads spin at their barriers and lose their time slices). Per pair: generate's
// work (its timings line: text encoding + denoising + VAE; no process start, model load or PNG
// write) and its process wall time, the request's wall time, and the job's own stage timings
// (GET /easel/v1/jobs/{id}: the same stages as generate counts them). Reported:
//   added_latency: median over pairs of (request wall - generate's work): the headline, strict
//     (the server also writes and returns the PNG, which generate's work does not count);
//   added_over_generate_process: median over pairs of (request wall - generate process wall);
//   server_overhead: median of (request wall - the job's own te + denoise + VAE): what the server
//     adds around the stages (queue hand-off, store, PNG write + read-back, base64, HTTP), free of
//     the step-time noise; per-step checkpoints and previews count inside denoising.
//   same_png: the server's PNG has the bytes of generate's (the same job was run).
// throughput: `queued` jobs submitted at once to /easel/v1/jobs; from the first submission to
// the last job's `finished` (the server's clock, so the client's polling adds nothing), jobs per
// minute, against queued x the median single-job wall time, and the hand-off gaps between jobs
// (a job's start - the previous job's finish).
import { spawn } from "node:child_process";
import fs from "node:fs";
import http from "node:http";
import os from "node:os";
import path from "node:path";

const [easel, out, ...rest] = process.argv.slice(2);
if (!easel || !out) {
  console.error("usage: node bench/server_bench.mjs EASEL_BINARY OUT.json [--size 256] [--steps 0] [--reps 5] [--threads 2] [--queued 20]");
  process.exit(2);
}
const opt = { size: 256, steps: 0, reps: 5, threads: 2, queued: 20 };
for (let i = 0; i < rest.length; i += 2) {
  const k = rest[i].replace(/^--/, "");
  if (!(k in opt) || !Number.isFinite(Number(rest[i + 1]))) { console.error(`unknown option or value: ${rest[i]} ${rest[i + 1]}`); process.exit(2); }
  opt[k] = Number(rest[i + 1]);
}
const root = path.resolve(path.dirname(new URL(import.meta.url).pathname), "..");
const model = path.join(root, "models/demo/easel-demo-shapes.safetensors");
const prompt = "a large green star in the centre, white background";
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "easel-server-bench-"));
const median = (a) => { const s = [...a].sort((x, y) => x - y); return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2; };
const common = ["-m", model, "-W", String(opt.size), "-H", String(opt.size), "-t", String(opt.threads), "--no-cache"]
  .concat(opt.steps > 0 ? ["--steps", String(opt.steps)] : []);
const now = () => Number(process.hrtime.bigint()) / 1e9;

/// One process to its end: {code, stderr, wall_s} (async, so the event loop keeps running).
function run(args) {
  return new Promise((resolve) => {
    const t0 = now();
    const p = spawn(easel, args, { stdio: ["ignore", "ignore", "pipe"] });
    let err = "";
    p.stderr.on("data", (d) => { err += d; });
    p.on("close", (code) => resolve({ code, stderr: err, wall_s: now() - t0 }));
  });
}
/// One HTTP request on a new connection (no keep-alive reuse): {status, body (parsed JSON)}.
function request(port, method, p, body) {
  return new Promise((resolve, reject) => {
    const data = body === undefined ? null : Buffer.from(JSON.stringify(body));
    const req = http.request({ host: "127.0.0.1", port, method, path: p, agent: false,
      headers: data ? { "Content-Type": "application/json", "Content-Length": data.length } : {} }, (res) => {
      const chunks = [];
      res.on("data", (c) => chunks.push(c));
      res.on("end", () => {
        const text = Buffer.concat(chunks).toString("utf8");
        try { resolve({ status: res.statusCode, body: JSON.parse(text) }); } catch (e) { reject(new Error(`${method} ${p}: ${res.statusCode} ${text.slice(0, 200)}`)); }
      });
    });
    req.on("error", reject);
    if (data) req.write(data);
    req.end();
  });
}

async function generate(seed, png) {
  const g = await run(["generate", ...common, "-p", prompt, "-s", String(seed), "-o", png]);
  const m = g.stderr.match(/timings: load ([\d.]+) s, text encoding ([\d.]+) s, denoising ([\d.]+) s .*VAE ([\d.]+) s/);
  if (g.code !== 0 || !m) { console.error(g.stderr); process.exit(1); }
  const [load, te, den, vae] = m.slice(1).map(Number);
  return { seed, process_s: g.wall_s, work_s: te + den + vae, load_s: load, te_s: te, denoise_s: den, vae_s: vae };
}

// the server
const port = 41200 + (process.pid % 200);
const srv = spawn(easel, ["server", ...common, "--listen-port", String(port), "--state-dir", path.join(tmp, "state")], { stdio: ["ignore", "ignore", "pipe"] });
let log = "";
srv.stderr.on("data", (d) => { log += d; });
for (let i = 0; i < 1200 && !/easel server: http/.test(log); i++) await new Promise((r) => setTimeout(r, 100));
if (!/easel server: http/.test(log)) { console.error(log); process.exit(1); }
let jobNo = 0;
async function serverJob(seed) {
  const id = `bench-${jobNo++}`;
  const t0 = now();
  const r = await request(port, "POST", "/sdapi/v1/txt2img", { prompt, width: opt.size, height: opt.size, seed, force_task_id: id });
  const wall = now() - t0;
  if (r.status !== 200 || !r.body.images) { console.error(r); process.exit(1); }
  const j = (await request(port, "GET", `/easel/v1/jobs/${id}?images=false`)).body;
  const tm = j.timings;
  const stages = tm.te_s + tm.denoise_s + tm.vae_s;
  return { seed, id, wall_s: wall, job_run_s: j.seconds, stages_s: stages, te_s: tm.te_s, denoise_s: tm.denoise_s, vae_s: tm.vae_s,
    queue_wait_s: j.started - j.created, png: Buffer.from(r.body.images[0], "base64") };
}

// warm-up: first-use allocations in the server, the model file in the page cache
await generate(1, path.join(tmp, "warm.png"));
await serverJob(1);

const pairs = [];
for (let r = 0; r < opt.reps; r++) {
  const seed = 100 + r, png = path.join(tmp, `g${r}.png`);
  let g, s;
  if (r % 2 === 0) { g = await generate(seed, png); s = await serverJob(seed); }
  else { s = await serverJob(seed); g = await generate(seed, png); }
  const same = Buffer.compare(fs.readFileSync(png), s.png) === 0;
  delete s.png;
  pairs.push({ generate: g, server: s, same_png: same });
  console.log(`pair ${r}: generate work ${g.work_s.toFixed(3)} s (process ${g.process_s.toFixed(3)} s) | server request ${s.wall_s.toFixed(3)} s ` +
    `(its stages ${s.stages_s.toFixed(3)} s, overhead ${(s.wall_s - s.stages_s).toFixed(3)} s) | same PNG bytes: ${same}`);
}

// throughput: jobs queued at once
const tq = Date.now() / 1000;
const ids = [];
for (let i = 0; i < opt.queued; i++) {
  const r = await request(port, "POST", "/easel/v1/jobs", { prompt, width: opt.size, height: opt.size, seed: 200 + i, force_task_id: `queued-${i}` });
  if (r.status !== 202) { console.error(r); process.exit(1); }
  ids.push(r.body.id);
}
const submitted_s = Date.now() / 1000 - tq;
for (;;) {
  const j = (await request(port, "GET", `/easel/v1/jobs/${ids[ids.length - 1]}?images=false`)).body;
  if (j.state === "done") break;
  if (j.state === "failed" || j.state === "cancelled") { console.error(j); process.exit(1); }
  await new Promise((r) => setTimeout(r, 500));
}
const qjobs = [];
for (const id of ids) {
  const j = (await request(port, "GET", `/easel/v1/jobs/${id}?images=false`)).body;
  if (j.state !== "done") { console.error(j); process.exit(1); }
  qjobs.push({ id, created: j.created, started: j.started, finished: j.finished, run_s: j.seconds,
    stages_s: j.timings.te_s + j.timings.denoise_s + j.timings.vae_s });
}
srv.kill("SIGTERM");
await new Promise((r) => srv.on("exit", r));

const work = median(pairs.map((p) => p.generate.work_s)), proc = median(pairs.map((p) => p.generate.process_s));
const wall = median(pairs.map((p) => p.server.wall_s));
const added = median(pairs.map((p) => p.server.wall_s - p.generate.work_s));
const addedProc = median(pairs.map((p) => p.server.wall_s - p.generate.process_s));
const overhead = median(pairs.map((p) => p.server.wall_s - p.server.stages_s));
const total = Math.max(...qjobs.map((j) => j.finished)) - tq;
const gaps = qjobs.slice(1).map((j, i) => j.started - qjobs[i].finished);
const result = {
  date: new Date().toISOString(), host: os.hostname(), hardware_threads: os.cpus().length, loadavg_at_end: os.loadavg(),
  command_line: "node " + path.relative(root, process.argv[1]) + " " + process.argv.slice(2).join(" "),
  model: "models/demo/easel-demo-shapes.safetensors", size: opt.size, steps: opt.steps || "the model's default",
  threads: opt.threads, reps: opt.reps, server_flags: "--no-cache, default --preview (auto: proj), per-step checkpoints",
  pairs,
  median_generate_work_s: work, median_generate_process_s: proc, median_server_request_s: wall,
  added_latency_s: added, added_latency_pct: 100 * added / work,
  added_over_generate_process_s: addedProc, added_over_generate_process_pct: 100 * addedProc / proc,
  server_overhead_s: overhead, server_overhead_pct: 100 * overhead / work,
  same_png_bytes: pairs.every((p) => p.same_png),
  queued: {
    jobs: opt.queued, submit_all_s: submitted_s, total_s: total, jobs_per_min: 60 * opt.queued / total,
    vs_queued_x_single_request_pct: 100 * (total - opt.queued * wall) / (opt.queued * wall),
    median_job_run_s: median(qjobs.map((j) => j.run_s)), median_job_stages_s: median(qjobs.map((j) => j.stages_s)),
    median_handoff_gap_s: median(gaps), max_handoff_gap_s: Math.max(...gaps), jobs: qjobs,
  },
};
fs.writeFileSync(out, JSON.stringify(result, null, 2) + "\n");
console.log(JSON.stringify({
  median_generate_work_s: work, median_server_request_s: wall, added_latency_s: added, added_latency_pct: result.added_latency_pct,
  added_over_generate_process_pct: result.added_over_generate_process_pct, server_overhead_s: overhead, server_overhead_pct: result.server_overhead_pct,
  same_png_bytes: result.same_png_bytes,
  queued: { total_s: total, jobs_per_min: result.queued.jobs_per_min, vs_queued_x_single_request_pct: result.queued.vs_queued_x_single_request_pct,
    median_handoff_gap_s: result.queued.median_handoff_gap_s },
}, null, 1));
fs.rmSync(tmp, { recursive: true, force: true });
