// easel's jobs API (and sd.cpp's /sdcpp/v1 names for it) against `easel server`: submit at once,
// poll, the server-sent-events stream, fetch results by id, cancel, the queue bound (503 +
// Retry-After), and sd.cpp's job shapes. Usage: node jobs.mjs URL   (server with --max-queue 2)
import { checks, call, sleep, pngInfo, b64png } from "./lib.mjs";

const url = process.argv[2];
const t = checks();
const get = (p) => call(url, "GET", p);
const post = (p, b) => call(url, "POST", p, b);

let r = await post("/easel/v1/jobs", { type: "txt2img", prompt: "a small purple triangle at the top", steps: 12, seed: 5 });
t.check("POST /easel/v1/jobs: 202 with an id at once", r.status === 202 && typeof r.body.id === "string" && r.headers.get("location") === "/easel/v1/jobs/" + r.body.id, r.text);
const id = r.body.id;
// the event stream
const events = [];
const resp = await fetch(url + "/easel/v1/jobs/" + id + "/events");
t.check("events: text/event-stream", resp.status === 200 && (resp.headers.get("content-type") || "").startsWith("text/event-stream"), resp.status);
const reader = resp.body.getReader();
const dec = new TextDecoder();
let buf = "";
for (let done = false; !done;) {
  const { value, done: end } = await reader.read();
  if (end) break;
  buf += dec.decode(value, { stream: true });
  let i;
  while ((i = buf.indexOf("\n\n")) >= 0) {
    const block = buf.slice(0, i); buf = buf.slice(i + 2);
    const ev = (block.match(/^event: (.*)$/m) || [])[1], data = (block.match(/^data: (.*)$/m) || [])[1];
    if (ev && data) { events.push({ ev, j: JSON.parse(data) }); if (ev === "done") done = true; }
  }
}
const stepsSeen = new Set(events.filter((e) => e.ev === "progress" && e.j.state === "running").map((e) => e.j.step));
t.check("events: progress events with advancing steps", stepsSeen.size >= 3, [...stepsSeen].join(","));
t.check("events: a preview arrives as a data: PNG", events.some((e) => e.j.preview && b64png(e.j.preview)));
t.check("events: ETA while running", events.some((e) => e.j.state === "running" && typeof e.j.eta === "number"));
const last = events[events.length - 1];
t.check("events: ends with done", last && last.ev === "done" && last.j.state === "done", last && JSON.stringify(last.j).slice(0, 200));
r = await get("/easel/v1/jobs/" + id);
t.check("GET job: done, steps, one base64 PNG, infotext", r.status === 200 && r.body.state === "done" && r.body.step === 12 && r.body.steps === 12 &&
  r.body.images.length === 1 && b64png(r.body.images[0]) && /Seed: 5/.test(r.body.infotexts[0]), r.text.slice(0, 300));
const img = await fetch(url + "/easel/v1/jobs/" + id + "/images/0");
t.check("GET job image 0: image/png", img.status === 200 && img.headers.get("content-type") === "image/png" && pngInfo(Buffer.from(await img.arrayBuffer())));
r = await get("/easel/v1/jobs/" + id + "/images/7");
t.check("GET a missing image: 404 JSON", r.status === 404 && r.body.error && r.body.error.code === "not_found", r.text);
r = await get("/easel/v1/jobs/job-doesnotexist");
t.check("GET an unknown job: 404", r.status === 404, r.text);
r = await get("/easel/v1/jobs/..%2F..%2Fetc%2Fpasswd/images/0");
t.check("a job id with a path: 404, nothing read", r.status === 404, r.text);

// the conditioning cache serves a repeated prompt (the server runs with --cache-dir)
const cachePrompt = `a small green circle in the corner ${Date.now()}`;
for (const [seed, cached] of [[21, false], [22, true]]) {
  const jid = `cache-${seed}-${Date.now()}`;
  r = await post("/sdapi/v1/txt2img", { prompt: cachePrompt, steps: 2, width: 64, height: 64, seed, force_task_id: jid });
  const j = r.status === 200 ? (await get(`/easel/v1/jobs/${jid}?images=false`)).body : null;
  t.check(`conditioning cache: ${cached ? "the repeated prompt's conditioning comes from the cache" : "a new prompt is encoded"}`,
    j && j.timings && j.timings.conditioning_cached === cached, j ? JSON.stringify(j.timings) : r.text.slice(0, 200));
}

// queue bound and cancel: one running, two queued (--max-queue 2), the next gets 503 + Retry-After
const slow = { prompt: "a cyan star on the left", steps: 150, seed: 9 };
const a = (await post("/easel/v1/jobs", slow)).body.id;
for (let i = 0; i < 6000; i++) { if ((await get("/easel/v1/jobs/" + a + "?images=false")).body.state === "running") break; await sleep(25); }
const b = (await post("/easel/v1/jobs", slow)).body.id, c = (await post("/easel/v1/jobs", slow)).body.id;
r = await post("/easel/v1/jobs", slow);
t.check("a full queue: 503 with Retry-After", r.status === 503 && r.headers.get("retry-after") !== null && r.body.error.code === "unavailable", r.text);
r = await get("/easel/v1/jobs");
t.check("GET /easel/v1/jobs: running then queued in order", r.status === 200 && r.body.jobs[0].id === a && r.body.jobs[1].id === b && r.body.jobs[2].id === c &&
  r.body.jobs[1].queue_position === 0 && r.body.jobs[2].queue_position === 1, JSON.stringify(r.body.jobs.slice(0, 3).map((j) => [j.id, j.state])));
r = await post("/easel/v1/jobs/" + b + "/cancel");
t.check("cancel a queued job", r.status === 200 && r.body.state === "cancelled", r.text);
r = await post("/easel/v1/jobs/" + b + "/cancel");
t.check("cancel it again: 409", r.status === 409, r.text);
// sd.cpp's names: cancel the running job, poll with sd.cpp's shape
r = await post("/sdcpp/v1/jobs/" + a + "/cancel");
t.check("POST /sdcpp/v1/jobs/{id}/cancel on the running job", r.status === 200, r.text);
for (let i = 0; i < 6000; i++) { r = await get("/sdcpp/v1/jobs/" + a); if (r.body.status === "cancelled") break; await sleep(25); }
t.check("sd.cpp job shape: status cancelled, error.code cancelled", r.body.status === "cancelled" && r.body.error && r.body.error.code === "cancelled" &&
  ["id", "kind", "status", "created", "started", "completed", "queue_position", "result", "error"].every((k) => k in r.body), r.text);
await post("/easel/v1/jobs/" + c + "/cancel");
r = await post("/sdcpp/v1/img_gen", { prompt: "a small orange circle on the right", width: 64, height: 64, seed: 3, sample_params: { sample_steps: 2, sample_method: "euler" } });
t.check("POST /sdcpp/v1/img_gen: 202 {id, kind, status, created, poll_url}", r.status === 202 && r.body.kind === "img_gen" && r.body.poll_url === "/sdcpp/v1/jobs/" + r.body.id, r.text);
const sid = r.body.id;
for (let i = 0; i < 6000; i++) { r = await get("/sdcpp/v1/jobs/" + sid); if (r.body.status === "completed" || r.body.status === "failed") break; await sleep(50); }
t.check("sd.cpp job completed: result.images[0].b64_json", r.body.status === "completed" && r.body.result.output_format === "png" && b64png(r.body.result.images[0].b64_json), r.text.slice(0, 300));
r = await get("/sdcpp/v1/capabilities");
t.check("GET /sdcpp/v1/capabilities", r.status === 200 && r.body.supported_modes[0] === "img_gen" && r.body.limits.max_queue_size === 2, r.text.slice(0, 300));
t.done();
