// A bounded hostile-request run on loopback against `easel server` (started with --max-body-mib
// 2): over 1000 malformed, mistyped, oversized, truncated or slow requests. Every answered one
// must be a 4xx with a JSON body (never a 5xx); afterwards the server still answers and finishes a
// real job. Deterministic (a fixed PRNG seed). Usage: node hostile.mjs URL
import net from "node:net";
import { checks, call, sleep, b64png } from "./lib.mjs";

const url = process.argv[2];
const { hostname: host, port } = new URL(url);
const t = checks();
let seed = 12345;
const rnd = () => ((seed = (seed * 1103515245 + 12345) >>> 0) / 4294967296);
const pick = (a) => a[Math.floor(rnd() * a.length)];

const stats = { sent: 0, answered: 0, s4xx: 0, s5xx: 0, other: 0, closed: 0, nonJson: 0 };
const bad = [];
function record(what, status, text) {
  stats.sent++;
  if (status === null) { stats.closed++; return; }
  stats.answered++;
  if (status >= 500) { stats.s5xx++; bad.push(`${what}: ${status} ${String(text).slice(0, 160)}`); }
  else if (status >= 400) {
    stats.s4xx++;
    try { JSON.parse(text); } catch (e) { if (status !== 400 || text) { stats.nonJson++; bad.push(`${what}: ${status} non-JSON ${String(text).slice(0, 80)}`); } }
  } else { stats.other++; bad.push(`${what}: ${status} (expected a 4xx) ${String(text).slice(0, 160)}`); }
}
async function send(what, method, path, body, headers = {}) {
  try {
    const r = await fetch(url + path, { method, body, headers });
    record(what, r.status, await r.text());
  } catch (e) { record(what, null, e.message); }
}
/// Raw bytes on a socket; resolves with the status code answered (null: closed without one).
function raw(what, chunks, { delayMs = 0, closeAfterMs = 4000 } = {}) {
  return new Promise((resolve) => {
    const s = net.connect({ host, port: Number(port) });
    let data = "", finished = false;
    const finish = () => {
      if (finished) return;
      finished = true;
      const m = data.match(/^HTTP\/1\.[01] (\d{3})/);
      const bodyAt = data.indexOf("\r\n\r\n");
      record(what, m ? Number(m[1]) : null, bodyAt >= 0 ? data.slice(bodyAt + 4) : "");
      s.destroy();
      resolve();
    };
    s.on("data", (d) => { data += d.toString("latin1"); if (/\r\n\r\n/.test(data) && /content-length: *0\r\n|\}\s*$/i.test(data)) finish(); });
    s.on("error", finish);
    s.on("close", finish);
    s.on("connect", async () => {
      for (const c of chunks) { if (s.destroyed) break; s.write(c); if (delayMs) await sleep(delayMs); }
      setTimeout(finish, closeAfterMs);
    });
  });
}

const jsonRoutes = [
  ["/sdapi/v1/txt2img", { steps: -1 }],
  ["/sdapi/v1/img2img", { steps: -1 }],
  ["/v1/images/generations", { n: 0 }],
  ["/easel/v1/jobs", { steps: -1 }],
  ["/sdcpp/v1/img_gen", { sample_params: { sample_steps: "x" } }],
  ["/sdapi/v1/options", { no_such_option: 1 }],
];
const fields = ["prompt", "negative_prompt", "steps", "width", "height", "seed", "cfg_scale", "n", "size", "batch_size", "n_iter", "sampler_name",
  "scheduler", "init_images", "mask", "denoising_strength", "sample_params", "lora", "override_settings", "force_task_id", "type", "response_format",
  "mask_blur", "inpainting_mask_invert", "clip_skip", "styles", "alwayson_scripts", "init_image", "mask_image", "batch_count"];
const values = [-1, 0, 1e308, -1e308, 2 ** 63, "", "x".repeat(70000), [], {}, [[[]]], true, "NaN", "../../etc/passwd", "\u0000", "%s%n%x", 3.5,
  ["not-base64!"], ["aGVsbG8="], "data:image/png;base64,AAAA", { sample_steps: -5 }, [{ path: "../../x" }], "64x64x64", "-64x-64", "99999x99999"];

// 1. mistyped and out-of-range fields on every JSON route (each body carries a sure refusal too)
for (let i = 0; i < 540; i++) {
  const [path, sure] = pick(jsonRoutes);
  const b = Object.assign({ prompt: "x" }, sure);
  for (let k = 0; k < 1 + Math.floor(rnd() * 3); k++) b[pick(fields)] = pick(values);
  Object.assign(b, sure);
  await send("fields " + path, "POST", path, JSON.stringify(b), { "Content-Type": "application/json" });
}
// 2. malformed JSON: truncated, garbage bytes, invalid UTF-8, deep nesting, not an object
const valid = JSON.stringify({ prompt: "a red circle", steps: 3, width: 64, height: 64 });
for (let i = 0; i < 200; i++) {
  const [path] = pick(jsonRoutes);
  let body;
  switch (i % 6) {
    case 0: body = valid.slice(0, 1 + Math.floor(rnd() * (valid.length - 2))); break;
    case 1: body = Buffer.from(Array.from({ length: 64 }, () => Math.floor(rnd() * 256))); break;
    case 2: body = Buffer.concat([Buffer.from('{"prompt": "'), Buffer.from([0xff, 0xfe, 0xc0, 0x80]), Buffer.from('", "steps": -1}')]); break;
    case 3: body = "[".repeat(5000 + i) + "]".repeat(5000 + i); break;
    case 4: body = pick(["null", "42", '"str"', "[]", "true", ""]); break;
    default: body = '{"prompt": "x", "steps": 1e400, "n": 0}';
  }
  await send("malformed " + path, "POST", path, body, { "Content-Type": "application/json" });
}
// 3. oversized: bodies over --max-body-mib 2, images over the limits, huge prompts, not-an-image base64
const big = "A".repeat(3 << 20);
for (let i = 0; i < 20; i++) await send("body over the limit", "POST", pick(jsonRoutes)[0], JSON.stringify({ prompt: big }), { "Content-Type": "application/json" });
for (let i = 0; i < 20; i++) await send("huge base64 not an image", "POST", "/sdapi/v1/img2img", JSON.stringify({ init_images: ["QUJD".repeat(300000)] }), { "Content-Type": "application/json" });
for (let i = 0; i < 20; i++) await send("huge prompt", "POST", "/easel/v1/jobs", JSON.stringify({ prompt: "y".repeat(200000) }), { "Content-Type": "application/json" });
// 4. names that try to leave their folders, unknown ids
for (let i = 0; i < 60; i++) {
  const p = pick(["/easel/v1/jobs/..%2F..%2Fetc%2Fpasswd", "/easel/v1/jobs/../../etc/passwd/images/0", "/easel/v1/jobs/job-x/images/99999",
                  "/sdcpp/v1/jobs/%00", "/easel/v1/jobs/" + "a".repeat(5000), "/easel/v1/jobs/job-1/events", "/static/../../etc/passwd", "/sdapi/v1/nope"]);
  await send("path " + p.slice(0, 40), "GET", p);
}
for (let i = 0; i < 30; i++)
  await send("lora outside the folder", "POST", "/sdapi/v1/txt2img", JSON.stringify({ prompt: "x <lora:" + pick(["../../etc/passwd", "/etc/shadow", "..\\..\\x", "none"]) + ":1>", steps: 1 }),
             { "Content-Type": "application/json" });
// 5. multipart: not multipart, truncated, bad boundary, missing parts, a truncated image
const boundary = "----easelhostile";
const part = (name, content, filename) => `--${boundary}\r\nContent-Disposition: form-data; name="${name}"${filename ? `; filename="${filename}"` : ""}\r\n` +
  (filename ? "Content-Type: image/png\r\n" : "") + `\r\n${content}\r\n`;
for (let i = 0; i < 60; i++) {
  const full = part("prompt", "a hat") + part("image", "\x89PNG\r\n\x1a\n\0\0\0\rIHDR", "in.png") + `--${boundary}--\r\n`;
  let body;
  switch (i % 4) {
    case 0: body = full.slice(0, Math.floor(full.length * rnd())); break;
    case 1: body = full.replace(/--\r\n$/, ""); break;
    case 2: body = part("prompt", "only a prompt") + `--${boundary}--\r\n`; break;
    default: body = full;
  }
  await send("multipart", "POST", "/v1/images/edits", body, { "Content-Type": `multipart/form-data; boundary=${boundary}` });
}
for (let i = 0; i < 10; i++) await send("edits not multipart", "POST", "/v1/images/edits", '{"prompt":"x"}', { "Content-Type": "application/json" });
// 6. raw protocol abuse: garbage request lines, huge headers, lying Content-Length, bad chunks, truncated bodies
const rawCases = [
  () => ["GARBAGE\r\n\r\n"],
  () => ["GET / HTTP/9.9\r\nHost: x\r\n\r\n"],
  () => [`GET /easel/v1/info HTTP/1.1\r\nHost: x\r\nX-Big: ${"h".repeat(70000)}\r\n\r\n`],
  () => ["POST /sdapi/v1/txt2img HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999999\r\n\r\n{"],
  () => ["POST /sdapi/v1/txt2img HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n{}"],
  () => ["POST /sdapi/v1/txt2img HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nZZZ\r\nabc\r\n0\r\n\r\n"],
  () => [`POST /v1/images/edits HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=${boundary}\r\nContent-Length: 5000\r\n\r\n` + part("prompt", "x")],
  () => ["POST /sdapi/v1/txt2img HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\": \"cut"],
];
for (let i = 0; i < 80; i++) await raw("raw " + (i % rawCases.length), rawCases[i % rawCases.length](), { closeAfterMs: i % rawCases.length >= 6 ? 300 : 3000 });
// 7. slow clients: 12 connections dribbling a request byte by byte, in parallel with normal traffic
const slow = [];
for (let i = 0; i < 12; i++) slow.push(raw("slow client", [..."GET /easel/v1/info HTTP/1.1\r\nHost: x\r\n"].map((c) => c), { delayMs: 150, closeAfterMs: 500 }));
for (let i = 0; i < 20; i++) await send("during slow clients", "POST", "/sdapi/v1/txt2img", '{"steps": -1}', { "Content-Type": "application/json" });
await Promise.all(slow);

console.log(JSON.stringify(stats));
t.check(`at least 1000 hostile requests sent (${stats.sent})`, stats.sent >= 1000);
t.check(`no 5xx answer (${stats.s5xx})`, stats.s5xx === 0, bad.slice(0, 5).join("\n"));
t.check(`no 2xx/3xx answer to a hostile request (${stats.other})`, stats.other === 0, bad.slice(0, 5).join("\n"));
t.check(`4xx answers carry JSON (${stats.nonJson} without)`, stats.nonJson === 0, bad.slice(0, 5).join("\n"));
t.check("most requests were answered", stats.answered >= 900, JSON.stringify(stats));
// the server still answers and finishes a real job
const info = await call(url, "GET", "/easel/v1/info");
t.check("the server still answers", info.status === 200, info.text);
const r = await call(url, "POST", "/sdapi/v1/txt2img", { prompt: "a large green star in the centre, white background", steps: 2, width: 64, height: 64, seed: 1 });
t.check("and finishes a real job afterwards", r.status === 200 && b64png(r.body.images && r.body.images[0]) !== null, r.text.slice(0, 200));
t.done();
