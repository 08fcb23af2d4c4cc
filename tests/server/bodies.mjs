// Request bodies against `easel server` started with --max-body-mib 2 (2097152 bytes): every body
// over the limit, whatever its Content-Type or framing (Content-Length, chunked, multipart), is
// answered 413 with a JSON error naming the limit; a JSON body sent as
// application/x-www-form-urlencoded (what `curl -d` sends) over 8 KiB runs like any other (cpp-
// httplib alone caps such bodies at 8 KiB); a POST with an empty body (Content-Length 0, or no
// Content-Length at all) is answered 400 at once naming the missing body, and a body-less POST
// (interrupt) answers 200 at once; sd-server's extra arguments with an unknown key are refused
// naming the key; the server keeps serving and finishes a real job afterwards.
// Usage: node bodies.mjs URL
import net from "node:net";
import { checks, call, b64png } from "./lib.mjs";

const url = process.argv[2];
const { hostname: host, port } = new URL(url);
const t = checks();
const LIMIT = 2 << 20;

/// Raw bytes on one connection: {status, json (parsed body or null), ms} of the first answer, or
/// {status: null} when the server closed the connection without one (timeoutMs: gave up).
function raw(bytes, timeoutMs = 15000) {
  return new Promise((resolve) => {
    const t0 = Date.now();
    const s = net.connect({ host, port: Number(port) });
    let data = Buffer.alloc(0), finished = false;
    const finish = () => {
      if (finished) return;
      finished = true;
      clearTimeout(timer);
      const text = data.toString("latin1");
      const m = text.match(/^HTTP\/1\.[01] (\d{3})/);
      const at = text.indexOf("\r\n\r\n");
      let json = null;
      try { json = JSON.parse(data.subarray(at + 4).toString("utf8")); } catch (e) { /* not JSON */ }
      s.destroy();
      resolve({ status: m ? Number(m[1]) : null, json, ms: Date.now() - t0, text: text.slice(0, 300) });
    };
    const timer = setTimeout(finish, timeoutMs);
    s.on("data", (d) => {
      data = Buffer.concat([data, d]);
      const text = data.toString("latin1");
      const at = text.indexOf("\r\n\r\n");
      const len = text.match(/content-length: *(\d+)/i);
      if (at >= 0 && len && data.length >= at + 4 + Number(len[1])) finish();
    });
    s.on("error", finish);
    s.on("close", finish);
    s.on("connect", () => s.write(bytes));
  });
}
const head = (method, path, headers) => `${method} ${path} HTTP/1.1\r\nHost: ${host}\r\n${headers.map((h) => h + "\r\n").join("")}\r\n`;
const messageOf = (j) => !j ? "" : typeof j.error === "object" && j.error ? j.error.message : j.detail || "";
const namesLimit = (j) => messageOf(j).includes(String(LIMIT)) && messageOf(j).includes("--max-body-mib");

// 1. a JSON body sent as application/x-www-form-urlencoded, over cpp-httplib's 8 KiB form cap
const job = { prompt: "a large green star in the centre, white background", negative_prompt: "blurry, ".repeat(1200), steps: 2, width: 64, height: 64, seed: 3 };
let r = await call(url, "POST", "/sdapi/v1/txt2img", JSON.stringify(job), { "Content-Type": "application/x-www-form-urlencoded" });
t.check(`a ${JSON.stringify(job).length}-byte JSON body sent as x-www-form-urlencoded runs (200, an image)`,
  r.status === 200 && b64png(r.body.images && r.body.images[0]) !== null, `${r.status} ${r.text.slice(0, 200)}`);

// 2. over the limit with a Content-Length: every content type, JSON routes, the multipart route, no route
const over = Buffer.alloc(LIMIT + 1, "a");
for (const [path, type] of [["/sdapi/v1/txt2img", "application/json"], ["/sdapi/v1/txt2img", "application/x-www-form-urlencoded"],
  ["/v1/images/generations", "text/plain"], ["/easel/v1/jobs", "application/octet-stream"], ["/sdcpp/v1/img_gen", null],
  ["/v1/images/edits", "multipart/form-data; boundary=xyz"], ["/sdapi/v1/txt2img", "multipart/form-data; boundary=xyz"],
  ["/no/such/route", "application/x-www-form-urlencoded"]]) {
  const headers = [`Content-Length: ${over.length}`].concat(type ? [`Content-Type: ${type}`] : []);
  r = await raw(Buffer.concat([Buffer.from(head("POST", path, headers)), over]));
  t.check(`${path} ${type || "(no Content-Type)"}, ${over.length} bytes: 413 with a JSON error naming the limit`,
    r.status === 413 && namesLimit(r.json), r.text);
}
// just under the limit is not refused for its size (a 400 for what it says)
r = await raw(Buffer.concat([Buffer.from(head("POST", "/sdapi/v1/txt2img", [`Content-Length: ${LIMIT}`, "Content-Type: application/x-www-form-urlencoded"])),
  Buffer.alloc(LIMIT, "a")]));
t.check("a body of exactly the limit is read (400 not JSON, not 413)", r.status === 400 && /not valid JSON/.test(messageOf(r.json)), r.text);

// 3. chunked bodies (no Content-Length): bounded while they stream
const chunkedBody = (bytes) => {
  const parts = [];
  for (let left = bytes; left > 0; left -= 65536) {
    const n = Math.min(65536, left);
    parts.push(Buffer.from(n.toString(16) + "\r\n"), Buffer.alloc(n, "b"), Buffer.from("\r\n"));
  }
  parts.push(Buffer.from("0\r\n\r\n"));
  return Buffer.concat(parts);
};
r = await raw(Buffer.concat([Buffer.from(head("POST", "/sdapi/v1/txt2img", ["Transfer-Encoding: chunked", "Content-Type: application/json"])),
  chunkedBody(LIMIT + 100000)]));
t.check("a chunked body over the limit: 413 with a JSON error naming the limit", r.status === 413 && namesLimit(r.json), r.text);
r = await raw(Buffer.concat([Buffer.from(head("POST", "/v1/images/generations", ["Transfer-Encoding: chunked", "Content-Type: application/json"])),
  chunkedBody(3 * LIMIT)]));
// (the server stops reading and closes: the client's unsent bytes make the close a reset, which
// may cut the 413's body short)
t.check("a chunked body over twice the limit: the connection closed, with or without a 413",
  r.status === null || (r.status === 413 && (r.json === null || namesLimit(r.json)) && /connection: close/i.test(r.text)), r.text);
r = await raw(Buffer.from(head("POST", "/sdapi/v1/txt2img", ["Transfer-Encoding: chunked", "Content-Type: application/json"]) +
  "ZZ\r\nabc\r\n0\r\n\r\n"));
t.check("malformed chunks: 400 with a JSON error", r.status === 400 && messageOf(r.json) !== "", r.text);

// 4. empty bodies: answered at once
for (const [what, headers] of [["Content-Length: 0", ["Content-Length: 0", "Content-Type: application/json"]],
  ["no Content-Length", ["Content-Type: application/json"]]]) {
  for (const path of ["/sdapi/v1/txt2img", "/v1/images/generations", "/easel/v1/jobs"]) {
    r = await raw(Buffer.from(head("POST", path, headers)));
    t.check(`${path} with ${what}: 400 naming the missing body, in ${r.ms} ms (< 2000)`,
      r.status === 400 && /body is missing/.test(messageOf(r.json)) && r.ms < 2000, `${r.ms} ms ${r.text}`);
  }
}
r = await raw(Buffer.from(head("POST", "/v1/images/edits", ["Content-Type: multipart/form-data; boundary=xyz"])));
t.check(`/v1/images/edits with no body: a 400 JSON error, in ${r.ms} ms`, r.status === 400 && messageOf(r.json) !== "" && r.ms < 2000, `${r.ms} ms ${r.text}`);
r = await raw(Buffer.from(head("POST", "/sdapi/v1/interrupt", [])));
t.check(`/sdapi/v1/interrupt with no body and no Content-Length (curl -X POST): 200 in ${r.ms} ms`, r.status === 200 && r.ms < 2000, `${r.ms} ms ${r.text}`);
// a multipart body on a JSON route
const mp = "--xyz\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\na cat\r\n--xyz--\r\n";
r = await raw(Buffer.from(head("POST", "/sdapi/v1/txt2img", [`Content-Length: ${mp.length}`, "Content-Type: multipart/form-data; boundary=xyz"]) + mp));
t.check("multipart/form-data on a JSON route: 415 naming application/json", r.status === 415 && /application\/json/.test(messageOf(r.json)), r.text);

// 5. sd-server's extra arguments: an unknown key is refused naming it, known ones apply
r = await call(url, "POST", "/v1/images/generations", { prompt: 'a cat <sd_cpp_extra_args>{"sample_params": {"sample_step": 3}}</sd_cpp_extra_args>', size: "64x64" });
t.check("<sd_cpp_extra_args> with a misspelt key: 400 naming sample_params.sample_step",
  r.status === 400 && r.body.error && r.body.error.param === "sample_params.sample_step" && /sample_steps/.test(r.body.error.message), r.text);
r = await call(url, "POST", "/sdcpp/v1/img_gen", { prompt: "a cat", no_such_field: 1 });
t.check("/sdcpp/v1/img_gen with an unknown key: 400 naming it", r.status === 400 && /no_such_field/.test(messageOf(r.body)), r.text);
r = await call(url, "POST", "/v1/images/generations", { prompt: 'a small red cross <sd_cpp_extra_args>{"seed": 7, "sample_params": {"sample_steps": 1}, "control_strength": 0.9}</sd_cpp_extra_args>', size: "64x64" });
const png = b64png(r.body.data && r.body.data[0] && r.body.data[0].b64_json);
t.check("<sd_cpp_extra_args> seed and steps apply (the PNG's parameters say Steps: 1, Seed: 7)",
  r.status === 200 && png && /Steps: 1,/.test(png.text.parameters || "") && /Seed: 7,/.test(png.text.parameters || ""), png ? png.text.parameters : r.text);

// 6. still serving: a real job
r = await call(url, "POST", "/sdapi/v1/txt2img", { prompt: "a large green star in the centre, white background", steps: 2, width: 64, height: 64, seed: 1 });
t.check("the server still finishes a real job", r.status === 200 && b64png(r.body.images && r.body.images[0]) !== null, r.text.slice(0, 200));
t.done();
